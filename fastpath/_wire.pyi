# Type stub of the compiled fastpath._wire (Cython); semantics in fastpath.reference.wire.
from collections.abc import Sequence

import numpy.typing as npt

def encode_item(
    source: str,
    category: int,
    tokens: int,
    text: str,
    role: int,
    timestamp_ms: int,
    source_message_ids: Sequence[str],
) -> bytes: ...
def encode_section(kind: int, bodies: Sequence[bytes], scores: npt.ArrayLike, tokens: int) -> bytes: ...
def encode_dropped(
    sources: Sequence[str],
    categories: npt.ArrayLike,
    reasons: npt.ArrayLike,
    scores: npt.ArrayLike,
    tokens: npt.ArrayLike,
    kept_sources: Sequence[str],
) -> bytes: ...
