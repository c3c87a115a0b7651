"""gRPC wiring: the servicer, health, reflection, and one interceptor for the cross-cutting parts
(shared-secret auth, domain errors -> status codes, a crash guard, OpenTelemetry spans when on)."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import hmac
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar import metrics
from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.errors import SidecarError
from sidecar.servicer import ContextServicer

if TYPE_CHECKING:  # imported only when tracing is on (the 'otel' extra)
    from sidecar.tracing import Tracing

log = logging.getLogger("sidecar.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ContextService"].full_name
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
MAX_IN_FLIGHT = 256
GC_GEN0_THRESHOLD = 20_000  # default 700: a BuildContext alone allocates a few thousand objects
# Probes and tooling answer without a token so that orchestrators can check liveness.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class TenantRateLimiter:
    """Token bucket per tenant: a flooding client gets RESOURCE_EXHAUSTED, the others keep going."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate, self.burst = rate_per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, tenant: str) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(tenant, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[tenant] = (tokens, now)
                return False
            self._buckets[tenant] = (tokens - 1.0, now)
            return True


class Refusal(Exception):
    """A call answered with a status instead of a response."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Guard:
    """The cross-cutting checks around every ContextService call."""

    def __init__(self, auth_token: str | None, limiter: TenantRateLimiter | None = None) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None
        self._limiter = limiter

    def wrap(self, method: str, handler, tracing: Tracing | None = None) -> Callable[[Any, Any], Any]:
        """The call wrapped in auth, decoding, the deadline, the tenant rate limit, domain errors ->
        status codes and metrics; every refusal raises Refusal. With tracing, in a span of its own: the
        wrappers are chosen here, once per method, so a server without tracing does no tracing work."""
        behaviour = handler.unary_unary if tracing is None else tracing.tag_tenant(handler.unary_unary)
        name = method.rsplit("/", 1)[-1]
        limiter = self._limiter
        parse = handler.request_deserializer
        requests_ok = metrics.RPC_REQUESTS.labels(name, "OK")
        latency = metrics.RPC_LATENCY.labels(name)

        def guarded(raw, context):
            started = time.perf_counter()
            code = "OK"
            try:
                if self._expected is not None and not self._authorized(context.invocation_metadata()):
                    raise Refusal(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong authorization bearer token")
                # Parsed here, not by gRPC, so undecodable bytes are the caller's error, not INTERNAL.
                try:
                    request = parse(raw) if parse else raw
                except Exception:
                    raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"the request is not a valid {name} message (protobuf decode failed)") from None
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0.0005:
                    raise Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, f"{name}: the deadline passed before it started")
                if limiter is not None:
                    tenant = request.scope.tenant_id if request.HasField("scope") else ""
                    if not limiter.allow(tenant):
                        raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                      f"tenant {tenant[:64]!r} exceeds {limiter.rate:g} requests/s; retry with backoff")
                return behaviour(request, context)
            except Refusal as r:
                code = r.code.name
                raise
            except SidecarError as e:
                code = e.code_name
                raise Refusal(getattr(grpc.StatusCode, e.code_name), e.message) from None
            except Exception:  # a bug must cost one call, never the server
                code = "INTERNAL"
                log.exception("internal error in %s", method)
                raise Refusal(grpc.StatusCode.INTERNAL, f"internal error in {name}") from None
            finally:
                elapsed = time.perf_counter() - started
                if metrics.enabled():
                    (requests_ok if code == "OK" else metrics.RPC_REQUESTS.labels(name, code)).inc()
                    latency.observe(elapsed)
                if log.isEnabledFor(logging.DEBUG):  # never message content, only the shape of the call
                    log.debug("rpc method=%s code=%s ms=%.3f", name, code, elapsed * 1000)

        return guarded if tracing is None else tracing.span_per_call(method, guarded)

    def _authorized(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False


# In memory and CPU-bound under the GIL: these run on the event loop itself, with no hop to a worker
# thread (the hop and the GIL hand-offs it brings cost more CPU than the call under concurrent
# load). The rest (DuckDB writes, waits for jobs), and these too when a model embeds the query (the
# GIL is released then, so threads overlap), run in the pool, so they never block the loop.
INLINE_METHODS = frozenset({"BuildContext", "SearchMemories", "SearchKnowledge"})


class GuardInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, guard: Guard, pool: futures.Executor, inline: frozenset[str],
                 tracing: Tracing | None = None) -> None:
        self._guard, self._pool, self._inline, self._tracing = guard, pool, inline, tracing
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:  # one wrapper per method, built once: no per-call handler objects
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or method.startswith(_OPEN_PREFIXES):
            return handler
        guarded = self._guard.wrap(method, handler, self._tracing)
        inline = method.rsplit("/", 1)[-1] in self._inline
        pool = self._pool

        async def handle(raw, context):
            try:
                if inline:
                    return guarded(raw, context)
                return await asyncio.get_running_loop().run_in_executor(pool, guarded, raw, context)
            except Refusal as r:
                await context.abort(r.code, r.message)

        wrapped = grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None,
                                                      response_serializer=_passing_bytes(handler.response_serializer))
        self._wrapped[method] = wrapped
        return wrapped


def _passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A handler may answer with bytes it serialised itself (BuildContext writes its items straight
    to wire format); those go out unchanged."""

    def serializer(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return serializer


class SidecarServer:
    """The asyncio gRPC server on an event loop of its own thread, driven from plain threads (the
    command line, tests, benches) with start() and stop(grace).wait()."""

    def __init__(self, app: Sidecar, *, listen: str | None, uds: str | None, auth_token: str | None,
                 max_workers: int, rate_per_tenant: float, tls: tuple[bytes, bytes] | None = None,
                 tracing: Tracing | None = None) -> None:
        limiter = TenantRateLimiter(rate_per_tenant, burst=max(rate_per_tenant, 1.0) * 2) if rate_per_tenant else None
        self._pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._thread.start()
        self.health = health.aio.HealthServicer()
        try:
            inline = INLINE_METHODS if app.queries_hold_the_gil else frozenset()
            interceptor = GuardInterceptor(Guard(auth_token, limiter), self._pool, inline, tracing)
            if tracing is not None:  # BuildContext's stage timings become child spans of its call's span
                app.builder.stage_observer = tracing.stage_spans
            self.port = self._run(self._build(app, listen, uds, interceptor, tls))
        except BaseException:  # e.g. the port is taken: leave no loop thread or pool behind
            self._close_loop()
            raise

    def _close_loop(self) -> None:
        self._pool.shutdown(wait=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _build(self, app: Sidecar, listen: str | None, uds: str | None, interceptor: GuardInterceptor,
                     tls: tuple[bytes, bytes] | None) -> int:
        self._server = grpc.aio.server(
            interceptors=[interceptor],
            # Beyond this many calls in flight new ones get RESOURCE_EXHAUSTED instead of queueing forever.
            maximum_concurrent_rpcs=MAX_IN_FLIGHT,
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0)])
        pb_grpc.add_ContextServiceServicer_to_server(ContextServicer(app), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME),
                                            self._server)
        address = f"unix:{uds}" if uds else listen or "127.0.0.1:50051"
        # tls: (PEM private key, PEM certificate chain); a plaintext client then fails its handshake.
        port = self._server.add_secure_port(address, grpc.ssl_server_credentials([tls])) if tls else \
            self._server.add_insecure_port(address)
        if port == 0 and not uds:
            raise OSError(f"could not bind {listen}")
        return 0 if uds else port

    def start(self) -> None:
        self._run(self._server.start())

    def stop(self, grace: float | None = None) -> threading.Event:
        """Health turns NOT_SERVING, in-flight calls get `grace` seconds, new ones are refused; the
        event is set once the loop and the pool are down."""
        done = threading.Event()
        if not self._loop.is_running():
            done.set()
            return done

        async def shut() -> None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace)

        self._run(shut())
        self._close_loop()
        done.set()
        return done


def build_server(app: Sidecar, *, listen: str | None, uds: str | None, auth_token: str | None = None,
                 max_workers: int = 16, rate_per_tenant: float = 0.0, tls: tuple[bytes, bytes] | None = None,
                 tracing: Tracing | None = None) -> tuple[SidecarServer, int]:
    """Returns the startable server and the bound TCP port (0 for a Unix socket). `tls` is a PEM
    (private key, certificate chain) pair: gRPC over TLS instead of plaintext. `tracing`: OpenTelemetry
    spans per call and per BuildContext stage; None, the default, adds no work to any call."""
    server = SidecarServer(app, listen=listen, uds=uds, auth_token=auth_token, max_workers=max_workers,
                           rate_per_tenant=rate_per_tenant, tls=tls, tracing=tracing)
    return server, server.port


WARM_UP_WAIT_S = 15.0  # the most `serve` waits for the start-up work before it takes calls
STOP_REPORT_S = 20.0  # a stop still running after this long prints its threads' stacks (Kubernetes kills at 30 s)


def _settle_garbage_collector() -> None:
    """What is loaded at start-up (indexes, caches, modules) lives as long as the process: freezing
    it keeps the collector from rescanning it, and a larger first generation runs the collector less
    often. Both cut BuildContext's tail latency; cycles are still collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def serve(db_path: str, *, listen: str | None, uds: str | None, auth_token: str | None,
          app_factory: Callable[[str], Sidecar] = Sidecar, metrics_port: int = 0, metrics_host: str = "127.0.0.1",
          rate_per_tenant: float = 0.0, tls: tuple[bytes, bytes] | None = None, tracing: Tracing | None = None) -> int:
    app = app_factory(db_path)
    # Ready once the start-up work is done: calls served during it wait for the GIL (a 5 ms switch
    # interval), which is most of a fresh server's tail; what it built is then frozen with the rest.
    if not app.wait_warm_up(WARM_UP_WAIT_S):
        log.warning("start-up work still running after %.0f s; serving anyway", WARM_UP_WAIT_S)
    _settle_garbage_collector()
    server, port = build_server(app, listen=listen, uds=uds, auth_token=auth_token, rate_per_tenant=rate_per_tenant,
                                tls=tls, tracing=tracing)
    if metrics_port:
        metrics.bind_gauges(app.queue_depth, {
            "memories": app.memories.entry_count, "knowledge": app.knowledge.entry_count,
            "episodic_turns": app.episodic.indexed_total, "cached_messages": lambda: app.store.cached_view_messages})
        metrics.serve_metrics(metrics_port, metrics_host)
        log.info("Prometheus metrics on %s port %d", metrics_host, metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the ready line: a SIGTERM right after it stops cleanly
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    where = f"unix:{uds}" if uds else f"{(listen or '127.0.0.1:50051').rsplit(':', 1)[0]}:{port}"
    # The line test harnesses wait for; keep its shape.
    print(f"context-sidecar serving on {where} db={db_path}", flush=True)
    stop.wait()
    # Each stage timed, so a slow stop (an orchestrator kills after its grace period) says what took long;
    # one that runs past STOP_REPORT_S prints every thread's stack to stderr first.
    faulthandler.dump_traceback_later(STOP_REPORT_S, exit=False)
    took = [time.monotonic()]
    server.stop(grace=5).wait()  # in-flight calls finish; new ones are refused
    took.append(time.monotonic())
    app.close()
    took.append(time.monotonic())
    if tracing is not None:
        tracing.shutdown()  # the spans still buffered go out
    took.append(time.monotonic())
    faulthandler.cancel_dump_traceback_later()
    log.info("stopped cleanly in %.2f s (calls %.2f s, state %.2f s, spans %.2f s)", took[-1] - took[0],
             *(b - a for a, b in itertools.pairwise(took)))
    return 0
