"""`python -m sidecar call RPC '{json}'`: any ContextService RPC from the command line, as grpcurl would,
without generated stubs: the request and response types come from the server's reflection service and
the JSON is protobuf's JSON mapping. `call --list` lists the RPCs.

Exit codes: 0 answered, 1 the RPC failed (its status code and message on stderr), 2 a mistake of the
command (unknown RPC, bad JSON, no sidecar at the address), in one line."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import threading

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from sidecar.api import context_service_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["ContextService"].full_name
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # above the server's 32 MiB frames: its answer is never cut here


class CallError(Exception):
    """A mistake in the command; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sidecar call", description="Call a ContextService RPC with a JSON request (protobuf's JSON "
        "mapping, field names as in the .proto) through the sidecar's reflection service; prints the JSON answer.",
        epilog="""example: python -m sidecar call CreateSession '{"scope": {"tenant_id": "t", "user_id": "u"}}'""")
    parser.add_argument("rpc", nargs="?", help="the RPC, e.g. BuildContext (call --list lists them)")
    parser.add_argument("request", nargs="?", default="{}", help="the request as JSON (default {}); - reads stdin")
    parser.add_argument("--list", action="store_true", help="list the RPCs with their request and response types")
    parser.add_argument("--address", default=os.environ.get("CONTEXT_SIDECAR_ADDRESS", "127.0.0.1:50051"),
                        help="sidecar HOST:PORT or unix:PATH (env CONTEXT_SIDECAR_ADDRESS; default 127.0.0.1:50051)")
    parser.add_argument("--token", default=os.environ.get("SIDECAR_AUTH_TOKEN", ""),
                        help="bearer token, when the sidecar requires one (env SIDECAR_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", default="", help="PEM certificate to trust: connect over TLS")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds the call may take (default 30)")
    return parser


def open_channel(address: str, tls_ca: str) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    if not tls_ca:
        return grpc.insecure_channel(address, options=options)
    try:
        with open(tls_ca, "rb") as f:
            trusted = f.read()
    except OSError as e:
        raise CallError(f"cannot read --tls-ca {tls_ca}: {e.strerror}") from None
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=trusted), options=options)


def connected(channel: grpc.Channel, timeout: float) -> bool:
    """True once the channel is ready; False at its first failure to connect (a refused connection is
    reported at once, not after gRPC's retries) or after `timeout` seconds."""
    settled = threading.Event()
    state: list[grpc.ChannelConnectivity] = []

    def watch(now: grpc.ChannelConnectivity) -> None:
        if now in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            state.append(now)
            settled.set()

    channel.subscribe(watch, try_to_connect=True)
    try:
        return settled.wait(timeout) and state[0] is grpc.ChannelConnectivity.READY
    finally:
        channel.unsubscribe(watch)


def reflected_service(channel: grpc.Channel, address: str, timeout: float) -> ServiceDescriptor:
    """ContextService as the server describes it."""
    if not connected(channel, timeout):
        raise CallError(f"no sidecar answering on {address}; start one with `python -m sidecar serve` or give "
                        "--address (one serving TLS needs --tls-ca)")
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    try:
        return pool.FindServiceByName(SERVICE)
    except grpc.RpcError as e:
        raise CallError(f"the reflection service on {address} failed: {e.code().name}: {e.details()}") from None
    except KeyError:
        raise CallError(f"{address} does not serve {SERVICE}") from None


def find_method(service: ServiceDescriptor, rpc: str) -> MethodDescriptor:
    """"BuildContext", or its full name with the service ("context_sidecar.v1.ContextService/BuildContext")."""
    name = rpc.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    method = service.methods_by_name.get(name)
    if method is None:
        near = difflib.get_close_matches(name, service.methods_by_name, n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise CallError(f"unknown RPC {rpc!r}; {hint}`python -m sidecar call --list` lists them")
    return method


def parse_request(method: MethodDescriptor, text: str) -> Message:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CallError(f"the {method.name} request is not valid JSON: {e}") from None
    request = message_factory.GetMessageClass(method.input_type)()
    try:
        json_format.ParseDict(data, request)
    except json_format.ParseError as e:
        raise CallError(f"the {method.name} request does not fit {method.input_type.name}: {' '.join(str(e).split())}") \
            from None
    return request


def invoke(channel: grpc.Channel, method: MethodDescriptor, request: Message, token: str, timeout: float) -> Message:
    response_type = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(f"/{method.containing_service.full_name}/{method.name}",
                               request_serializer=type(request).SerializeToString,
                               response_deserializer=response_type.FromString)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    return call(request, metadata=metadata, timeout=timeout)


def listing(service: ServiceDescriptor) -> str:
    width = max(len(m.name) for m in service.methods)
    return "\n".join(f"{m.name:<{width}}  {m.input_type.name} -> {m.output_type.name}" for m in service.methods)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.list and not args.rpc:
        parser.error("give the RPC to call, or --list")
    try:
        text = sys.stdin.read() if args.request == "-" else args.request
        with open_channel(args.address, args.tls_ca) as channel:
            service = reflected_service(channel, args.address, args.timeout)
            if args.list:
                print(listing(service))
                return 0
            method = find_method(service, args.rpc)
            response = invoke(channel, method, parse_request(method, text), args.token, args.timeout)
            print(json_format.MessageToJson(response, preserving_proto_field_name=True, indent=2))
            return 0
    except CallError as e:
        print(f"context-sidecar: {e}", file=sys.stderr)
        return 2
    except grpc.RpcError as e:
        print(f"context-sidecar: {args.rpc}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
