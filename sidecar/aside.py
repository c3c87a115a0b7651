"""Work begun on a helper thread beside the caller's Python. What lets go of the GIL while it runs
(tiktoken's encoding, the compiled embedders over long texts) uses another core there while the caller
goes on with its own work; the caller takes the result when it needs it, and does the work itself if
the helper has not begun it yet (a busy helper never makes a call wait longer than working alone)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

ASIDE_CHARS = 4096  # work on texts this long in all is worth a hand-off (shorter: done at once)

T = TypeVar("T")
P = ParamSpec("P")
_HELPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aside")


def begin(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
    """fn(*args, **kwargs) begun on the helper thread; the function returned gives its result."""
    future = _HELPER.submit(fn, *args, **kwargs)

    def result() -> T:
        return fn(*args, **kwargs) if future.cancel() else future.result()

    return result


def done(value: T) -> Callable[[], T]:
    """A result already made, taken as begin()'s are."""
    return lambda: value
