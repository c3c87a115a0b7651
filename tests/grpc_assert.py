"""Assert that a call fails with a given status and that the message names what it should."""

from __future__ import annotations

import grpc
import pytest


def expect_status(call, code: grpc.StatusCode, *fragments: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()}"
    for fragment in fragments:
        assert fragment in err.details(), f"{fragment!r} not in {err.details()!r}"
    return err
