"""Token counting of prompt lines: what a packed line is charged must cover what it costs rendered."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.tokens import count_line, count_lines, count_tokens

# Lines as the sidecar packs them: any text (speech, code, CJK, emoji), spaces and newlines included.
LINES = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), min_size=1, max_size=12)
# Ordinary lines: no line starts with whitespace (a newline run cannot form across the join).
PLAIN = st.lists(st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc", "Zl", "Zp")), min_size=1,
                         max_size=40), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_lines_are_never_charged_less_than_they_cost_joined(lines):
    assert sum(count_lines(lines)) >= count_tokens("\n".join(lines))
    assert count_lines(lines) == [count_line(t) for t in lines]  # the batch counts each line alike


@settings(max_examples=300, deadline=None)
@given(PLAIN)
def test_plain_lines_are_charged_exactly_what_they_cost_joined(lines):
    assert sum(count_lines(lines)) == count_tokens("\n".join(lines) + "\n")


def test_a_newline_after_punctuation_is_no_extra_token():
    # cl100k joins "!\n" into one token: text + 1 would charge one too many; after a word it is one more.
    assert count_lines(["Ann: we went hiking!"]) == [count_tokens("Ann: we went hiking!")]
    assert count_lines(["Ann: we went hiking"]) == [count_tokens("Ann: we went hiking") + 1]
