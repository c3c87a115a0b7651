"""README.md stays a short user's guide: its length, its headline table, its links and its API table.

The full measurements live in docs/benchmarks.md and the design in docs/architecture.md; these checks
keep the README from growing back into either, and keep it true to the proto."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PROTO = ROOT / "proto" / "context_sidecar" / "v1" / "context_service.proto"
MAX_README_LINES = 160
MAX_HEADLINE_LINE = 200
MAX_HEADLINE_ROWS = 10

# [text](target) or ![alt](target "title"); the target ends at whitespace or the closing parenthesis.
LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE_RE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE_RE = re.compile(r"`[^`\n]*`")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def _section(lines: list[str], heading: str) -> list[str]:
    """The lines under the `## heading` whose title starts with `heading`, up to the next `## `."""
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("## ") and line[3:].strip().lower().startswith(heading.lower())), None)
    assert start is not None, f"README.md has no '## {heading}' section"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def _table_rows(section: list[str]) -> list[str]:
    return [line for line in section if line.lstrip().startswith("|")]


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short() -> None:
    n = len(_lines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines (at most {MAX_README_LINES}): move measurements to docs/benchmarks.md "
        "and design to docs/architecture.md")


def test_headline_table_is_a_short_table_of_short_lines() -> None:
    rows = _table_rows(_section(_lines(), "Headline figures"))
    assert len(rows) >= 3, "the headline figures section has no table"
    body = rows[2:]  # after the header and the |---| separator
    assert len(body) <= MAX_HEADLINE_ROWS, f"the headline table has {len(body)} rows (at most {MAX_HEADLINE_ROWS})"
    too_long = [(len(row), row[:80]) for row in rows if len(row) > MAX_HEADLINE_LINE]
    assert not too_long, f"headline table lines over {MAX_HEADLINE_LINE} characters: {too_long}"


def test_headline_figures_link_to_the_full_benchmarks() -> None:
    section = "\n".join(_section(_lines(), "Headline figures"))
    assert "docs/benchmarks.md" in section


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(doc: Path) -> None:
    text = INLINE_CODE_RE.sub("", FENCE_RE.sub("", doc.read_text(encoding="utf-8")))
    broken = []
    checked = 0
    for target in LINK_RE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "//")):
            continue  # a URL, mailto:, or an anchor in the same file
        path = target.split("#", 1)[0].split("?", 1)[0]
        checked += 1
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"
    if doc == README:
        assert checked, "README.md links to no file at all (the link pattern is broken?)"


def test_docs_exist_and_readme_links_them() -> None:
    text = README.read_text(encoding="utf-8")
    for name in ("docs/benchmarks.md", "docs/architecture.md"):
        assert (ROOT / name).is_file(), f"{name} is missing"
        assert f"]({name}" in text, f"README.md does not link {name}"


def _service_rpcs() -> list[str]:
    proto = PROTO.read_text(encoding="utf-8")
    service = re.search(r"^service\s+ContextService\s*\{(.*?)^\}", proto, re.S | re.M)
    assert service, "no `service ContextService` block in the proto"
    body = re.sub(r"//[^\n]*", "", service.group(1))  # a commented-out rpc is no RPC
    return re.findall(r"\brpc\s+(\w+)\s*\(", body)


def test_every_rpc_is_in_the_readme_api_table() -> None:
    rpcs = _service_rpcs()
    assert len(rpcs) > 40, f"parsed only {len(rpcs)} RPCs from the proto"
    rows = _table_rows(_section(_lines(), "API at a glance"))
    listed = {name for row in rows for name in re.findall(r"\b[A-Z]\w+\b", row)}
    missing = [rpc for rpc in rpcs if rpc not in listed]
    assert not missing, f"RPCs of the proto missing from README.md's API table: {missing}"
    unknown = sorted(name for row in rows[2:] for cell in row.strip("| ").split("|")[1:]
                     for name in re.findall(r"\b\w+\b", cell) if name not in rpcs)
    assert not unknown, f"README.md's API table names RPCs the proto does not have: {unknown}"
