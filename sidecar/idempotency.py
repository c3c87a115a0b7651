"""Retry-safe writes: every write RPC takes an optional `idempotency_key`. The first call with a key
runs and its answer is stored under (tenant, user, method, key); a retry with the same key and the
same request returns that answer and writes nothing; the same key with another request is
FAILED_PRECONDITION (a client bug that must not silently drop a write).

Concurrent retries of one key are serialised by a lock stripe, so two in-flight copies of a request
cannot both run. The answer is recorded right after the write commits; a crash between the two
leaves the write done and the key unrecorded (a retry then runs again), which is why the writes
that create rows also dedupe on their own ids where they have them (AppendMessages' per-message
keys, CreateSession's session_id)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

from google.protobuf.message import Message as ProtoMessage

from sidecar.api import context_service_pb2 as pb
from sidecar.clock import now_ms
from sidecar.domain import Scope
from sidecar.errors import FailedPrecondition
from sidecar.ids import check_text

MAX_KEY = 128
_STRIPES = 64

_SERVICE = pb.DESCRIPTOR.services_by_name["ContextService"]
# Methods whose request has an idempotency_key, with the message class of their answer.
IDEMPOTENT_METHODS: dict[str, type[ProtoMessage]] = {
    m.name: getattr(pb, m.output_type.name)
    for m in _SERVICE.methods if "idempotency_key" in m.input_type.fields_by_name
}


def request_digest(request: ProtoMessage) -> str:
    """A hash of the request without its key: equal for a true retry."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("idempotency_key")
    return hashlib.blake2b(copy.SerializeToString(deterministic=True), digest_size=16).hexdigest()


class Idempotency:
    def __init__(self, store) -> None:
        self.store = store
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]

    def run(self, scope: Scope, method: str, request: ProtoMessage, write: Callable[[], ProtoMessage]) -> ProtoMessage:
        key = request.idempotency_key  # type: ignore[attr-defined]
        if not key:
            return write()
        check_text(key, "idempotency_key", MAX_KEY)
        digest = request_digest(request)
        with self._stripes[hash((scope.tenant_id, scope.user_id, method, key)) % _STRIPES]:
            seen = self.store.get_idempotent(scope, method, key)
            if seen is not None:
                if seen[0] != digest:
                    raise FailedPrecondition(f"idempotency_key {key!r} was already used for another {method} request")
                return IDEMPOTENT_METHODS[method].FromString(seen[1])
            answer = write()
            self.store.put_idempotent(scope, method, key, digest, answer.SerializeToString(), now_ms())
            return answer
