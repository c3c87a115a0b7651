"""gRPC wiring: the servicer, health, reflection, and one interceptor for the cross-cutting parts
(shared-secret auth, domain errors -> status codes, a crash guard)."""

from __future__ import annotations

import hmac
import logging
import signal
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.errors import SidecarError
from sidecar.servicer import ContextServicer

log = logging.getLogger("sidecar.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ContextService"].full_name
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Probes and tooling answer without a token so that orchestrators can check liveness.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class GuardInterceptor(grpc.ServerInterceptor):
    def __init__(self, auth_token: str | None) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.unary_unary is None or method.startswith(_OPEN_PREFIXES):
            return handler
        if self._expected is not None and not self._authorized(handler_call_details.invocation_metadata):
            def deny(request, context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong authorization bearer token")
            return grpc.unary_unary_rpc_method_handler(
                deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)

        behaviour = handler.unary_unary

        def guarded(request, context):
            try:
                return behaviour(request, context)
            except SidecarError as e:
                context.abort(getattr(grpc.StatusCode, e.code_name), e.message)
            except Exception:  # a bug must cost one call, never the server
                log.exception("internal error in %s", method)
                context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.rsplit('/', 1)[-1]}")

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _authorized(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False


def build_server(app: Sidecar, *, listen: str | None, uds: str | None, auth_token: str | None = None,
                 max_workers: int = 16) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Returns the started-able server, the bound TCP port (0 for a Unix socket) and its health servicer."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        interceptors=[GuardInterceptor(auth_token)],
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_ContextServiceServicer_to_server(ContextServicer(app), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
    port = server.add_insecure_port(f"unix:{uds}") if uds else server.add_insecure_port(listen or "127.0.0.1:50051")
    if port == 0 and not uds:
        raise OSError(f"could not bind {listen}")
    return server, (0 if uds else port), health_servicer


def serve(db_path: str, *, listen: str | None, uds: str | None, auth_token: str | None,
          app_factory: Callable[[str], Sidecar] = Sidecar) -> int:
    app = app_factory(db_path)
    server, port, health_servicer = build_server(app, listen=listen, uds=uds, auth_token=auth_token)
    server.start()
    where = f"unix:{uds}" if uds else f"{(listen or '127.0.0.1:50051').rsplit(':', 1)[0]}:{port}"
    # The line test harnesses wait for; keep its shape.
    print(f"context-sidecar serving on {where} db={db_path}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    health_servicer.enter_graceful_shutdown()
    server.stop(grace=5).wait()  # in-flight calls finish; new ones are refused
    app.close()
    log.info("stopped cleanly")
    return 0
