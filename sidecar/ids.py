"""Identifier generation and the validation limits every RPC applies."""

from __future__ import annotations

import os
import re
import time

from sidecar.errors import InvalidArgument
from sidecar.services.limits import MAX_TIMESTAMP_MS

MAX_ID_LEN = 128
_ID_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")


def new_id(prefix: str) -> str:
    """Time-ordered, unique enough across processes: ns clock plus 48 random bits."""
    return f"{prefix}_{time.time_ns():x}{os.urandom(6).hex()}"


def check_id(value: str, field: str, *, required: bool = True) -> str:
    if not value:
        if required:
            raise InvalidArgument(f"{field} is required")
        return value
    if len(value) > MAX_ID_LEN:
        raise InvalidArgument(f"{field} is {len(value)} characters; the limit is {MAX_ID_LEN}")
    if not _ID_RE.match(value):
        raise InvalidArgument(f"{field} {value[:40]!r} may only contain letters, digits and -_.:@")
    return value


def check_text(value: str, field: str, limit_bytes: int, *, required: bool = False) -> str:
    if required and not value.strip():
        raise InvalidArgument(f"{field} is required")
    size = len(value.encode("utf-8", "surrogatepass")) if len(value) * 4 > limit_bytes else len(value)
    if size > limit_bytes:
        raise InvalidArgument(f"{field} is {size} bytes; the limit is {limit_bytes} bytes")
    return value


def check_timestamp(value: int, field: str) -> int:
    """Epoch milliseconds that are a calendar date (1970-01-01 to 9999-12-31, UTC)."""
    if not 0 <= value <= MAX_TIMESTAMP_MS:
        raise InvalidArgument(f"{field} must be between 0 and {MAX_TIMESTAMP_MS} (9999-12-31), got {value}")
    return value
