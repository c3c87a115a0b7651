"""Prometheus metrics (opt-in HTTP endpoint: `--metrics-port` binds 127.0.0.1, `--metrics-listen`
any address, e.g. the pod's for a scraper outside it). Nothing is sent anywhere: Prometheus scrapes
the sidecar."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

RPC_REQUESTS = Counter("sidecar_rpc_requests_total", "RPCs served, by method and status code",
                       ["method", "code"], registry=REGISTRY)
RPC_LATENCY = Histogram("sidecar_rpc_latency_seconds", "Server-side RPC latency", ["method"],
                        buckets=_LATENCY_BUCKETS, registry=REGISTRY)
BUILD_STAGE = Histogram("sidecar_build_stage_seconds", "BuildContext time per stage", ["stage"],
                        buckets=(0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05),
                        registry=REGISTRY)
TOKENS_PACKED = Counter("sidecar_context_tokens_packed_total", "Tokens placed in assembled contexts", ["zone"],
                        registry=REGISTRY)
ITEMS_DROPPED = Counter("sidecar_context_items_dropped_total", "Candidates left out of contexts, by reason",
                        ["reason"], registry=REGISTRY)
JOB_QUEUE = Gauge("sidecar_job_queue_depth", "Jobs queued or running", registry=REGISTRY)
INDEX_SIZE = Gauge("sidecar_index_entries", "Entries in the in-process indexes", ["index"], registry=REGISTRY)

DROP_REASONS = {1: "over_budget", 2: "duplicate", 3: "low_score", 4: "acl", 5: "expired", 6: "superseded",
                7: "conflict_with_knowledge"}


_children: dict[tuple, object] = {}
# Off until serve_metrics(): with no port nobody can scrape, and recording costs BuildContext ~17 us.
_enabled = False


def enabled() -> bool:
    return _enabled


def _child(metric, *labels):
    """Label lookups take a lock each; the hot path keeps the children it uses."""
    key = (id(metric), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def observe_build(result) -> None:
    if not _enabled:
        return
    for stage, micros in result.timings:
        _child(BUILD_STAGE, stage).observe(micros / 1e6)
    _child(TOKENS_PACKED, "hard").inc(result.hard_zone_tokens)
    _child(TOKENS_PACKED, "soft").inc(result.soft_zone_tokens)
    for reason, count in result.drop_counts.items():
        _child(ITEMS_DROPPED, DROP_REASONS.get(reason, str(reason))).inc(count)


def bind_gauges(queue_depth: Callable[[], float], index_entries: dict[str, Callable[[], float]]) -> None:
    """Gauges read when scraped: the job queue, and the entries of each in-process index or cache."""
    JOB_QUEUE.set_function(queue_depth)
    for name, entries in index_entries.items():
        INDEX_SIZE.labels(name).set_function(entries)


def serve_metrics(port: int, addr: str = "127.0.0.1") -> None:
    global _enabled
    start_http_server(port, addr=addr, registry=REGISTRY)
    _enabled = True
