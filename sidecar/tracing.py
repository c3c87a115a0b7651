"""OpenTelemetry spans: the optional 'otel' extra, off by default, and this module is imported only when
tracing is on. A server span per ContextService call, joined to the caller's trace by the W3C
`traceparent` (and `tracestate`) metadata, and a child span per BuildContext stage made from the stage
timings the builder takes anyway. Spans carry the method, the status code and a hash of the tenant id:
never request content, session or user ids, or error messages (they may quote the request)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Call = Callable[[Any, Any], Any]

# Faults of the server. The caller's own mistakes (INVALID_ARGUMENT, NOT_FOUND, ...) leave a server span's
# status unset, as OpenTelemetry's conventions for gRPC say.
_SERVER_FAULTS = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED,
                            grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


@lru_cache(maxsize=4096)
def tenant_hash(tenant_id: str) -> str:
    """What a span says of the tenant: calls of one tenant can be grouped, the id itself is not sent."""
    return hashlib.blake2b(tenant_id.encode(), digest_size=8).hexdigest()


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("sidecar")
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def exporting(cls, exporter: str, endpoint: str, service_name: str) -> Tracing:
        """Spans batched out to an OTLP/gRPC collector (endpoint, or the OTEL_EXPORTER_OTLP_* variables),
        or printed to stdout ("console")."""
        out: SpanExporter
        if exporter == "console":
            out = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            out = OTLPSpanExporter(endpoint=endpoint or None)
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(out))  # exported off the request path
        return cls(provider)

    def span_per_call(self, method: str, call: Call) -> Call:
        """`call` (raw request, context) in a server span named after the method ("/pkg.Service/Method"),
        child of the caller's span when the metadata carries a traceparent. A call that fails raises an
        exception with a grpc.StatusCode `code` (the server's Refusal); its code goes on the span."""
        service, _, name = method.lstrip("/").rpartition("/")
        span_name, attributes = f"{service}/{name}", {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        tracer, extract = self.tracer, self._propagator.extract

        def traced(raw: Any, context: Any) -> Any:
            parent = extract(dict(context.invocation_metadata() or ()))
            with tracer.start_as_current_span(span_name, context=parent, kind=SpanKind.SERVER, attributes=attributes,
                                              record_exception=False, set_status_on_exception=False) as span:
                try:
                    response = call(raw, context)
                except Exception as e:
                    code = getattr(e, "code", None)
                    code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                    if code in _SERVER_FAULTS:
                        span.set_status(Status(StatusCode.ERROR, code.name))
                    raise
                span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
                return response

        return traced

    @staticmethod
    def tag_tenant(behaviour: Call) -> Call:
        """The servicer method (parsed request, context), adding the hashed tenant to the call's span."""

        def tagged(request: Any, context: Any) -> Any:
            scope = getattr(request, "scope", None)
            if scope is not None and scope.tenant_id:
                get_current_span().set_attribute("sidecar.tenant_hash", tenant_hash(scope.tenant_id))
            return behaviour(request, context)

        return tagged

    def stage_spans(self, laps: list[tuple[str, int]]) -> None:
        """BuildContext's stage timings (name, microseconds), taken one after another up to now, as child
        spans of the current span (the call's)."""
        start = time.time_ns() - sum(micros for _, micros in laps) * 1000
        for stage, micros in laps:
            end = start + micros * 1000
            span = self.tracer.start_span(f"BuildContext.{stage}", start_time=start, attributes={"sidecar.stage": stage})
            span.end(end_time=end)
            start = end

    def shutdown(self) -> None:
        """Sends what is still buffered and stops the exporter."""
        self.provider.shutdown()
