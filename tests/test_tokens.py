"""Token counting of prompt lines: what a packed line is charged must cover what it costs rendered."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.domain import Role, render_message_line
from sidecar.tokens import count_line, count_lines, count_tokens

# A packed line starts with its label ("Ann: ", "[8 May 2023]", "- "): a first character that is not
# blank, then anything (speech, code, CJK, emoji, blanks, "\r", newlines inside the text).
NOT_BLANK = st.characters(blacklist_categories=("Cs", "Zs", "Cc", "Zl", "Zp"))
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
LINES = st.lists(st.builds(str.__add__, NOT_BLANK, ANY_TEXT), min_size=1, max_size=12)
# The same from the few characters where newlines and blanks merge into tokens ("!\n", ":\r\n", "\n\n").
EDGY = st.lists(st.builds(str.__add__, st.sampled_from(":!.a1'"), st.text(st.sampled_from(":!. \t\r\n\u3000a1'"),
                                                                          max_size=8)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_lines_are_never_charged_less_than_they_cost_joined(lines):
    assert sum(count_lines(lines)) >= count_tokens("\n".join(lines))
    assert count_lines(lines) == [count_line(t) for t in lines]  # the batch counts each line alike


@settings(max_examples=1000, deadline=None)
@given(EDGY)
def test_lines_ending_in_blanks_and_punctuation_are_never_charged_less(lines):
    assert sum(count_lines(lines)) >= count_tokens("\n".join(lines))


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_a_line_and_its_newline_cost_the_same_alone_and_joined(lines):
    # No token spans a newline and the label after it: each line is counted as it is rendered.
    assert sum(count_tokens(t + "\n") for t in lines) == count_tokens("\n".join(lines) + "\n")


def test_a_last_line_that_costs_more_without_its_newline_is_charged_that():
    # ":\r" is two tokens, ":\r\n" one: a section's last line goes out without the newline.
    assert count_tokens(":\r") == 2 and count_tokens(":\r\n") == 1
    assert count_lines(["Ann: ok:\r"]) == [count_tokens("Ann: ok:\r")] == [count_line("Ann: ok:\r")]


def test_a_newline_after_punctuation_is_no_extra_token():
    # cl100k joins "!\n" into one token: text + 1 would charge one too many; after a word it is one more.
    assert count_lines(["Ann: we went hiking!"]) == [count_tokens("Ann: we went hiking!")]
    assert count_lines(["Ann: we went hiking"]) == [count_tokens("Ann: we went hiking") + 1]


def test_a_message_line_starts_with_its_label_whatever_the_speaker():
    assert render_message_line(Role.USER, " Ann\n", "hi") == "Ann: hi"
    assert render_message_line(Role.USER, "  ", "hi") == f"{Role.USER.label}: hi"


# Texts dense in the places a count may be cut (an ASCII letter, then a space) beside what merges
# across them in other tokenizations: contractions, digits, punctuation, blanks, CJK, emoji, marks.
CUTTABLE = st.text(st.sampled_from(list("ab Z  ' s t 1 2 . ! : \t \r \n \u00a0 \u3000 中 文 😀 \u0301 - $ ı İ ſ")
                                   + [" ", " ", "a", "e"]), max_size=80)
LONG = st.builds(str.__mul__, CUTTABLE, st.integers(1, 12))  # past the search for a cut, too


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(["user: ", "assistant: ", "Ann: ", "[8 May 2023] Ann: ", "", "x", "“", "中: "]),
       st.one_of(CUTTABLE, LONG, ANY_TEXT))
def test_a_prefixed_count_from_the_texts_count_is_the_whole_count(prefix, text):
    from sidecar.tokens import count_prefixed

    assert count_prefixed(prefix, text, count_tokens(text)) == count_tokens(prefix + text)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(CUTTABLE, LONG, ANY_TEXT))
def test_a_count_with_a_newline_from_the_texts_count_is_the_whole_count(text):
    from sidecar.tokens import count_with_newline

    assert count_with_newline(text, count_tokens(text)) == count_tokens(text + "\n")


def test_counts_cut_where_a_letter_meets_a_space_in_long_texts():
    from sidecar.tokens import count_prefixed, count_with_newline

    log = "\n".join(f"2026-12-05T23:{i % 60:02d} ERROR pod-{i} OOMKilled, restarting... it's the {i}th time" for i in range(300))
    for text in (log, "word " * 5000, "x" * 3000 + " tail", "中文" * 2000, "😀 " * 2000):
        n = count_tokens(text)
        assert count_prefixed("user: ", text, n) == count_tokens("user: " + text)
        assert count_with_newline(text, n) == count_tokens(text + "\n")


def test_counts_made_aside_are_count_many_whichever_thread_makes_them():
    from sidecar.aside import ASIDE_CHARS
    from sidecar.tokens import count_aside, count_many

    short = ["hi", "", "中文 😀"]
    long = [f"2026-12-05T23:{i % 60:02d} ERROR pod-{i} OOMKilled, restarting" * 20 for i in range(200)]
    assert sum(map(len, long)) >= ASIDE_CHARS > sum(map(len, short))
    first, second = count_aside(long), count_aside(long[::-1])  # the second waits behind the first
    later = second()  # not begun yet: counted here (or taken from the thread, if it had begun)
    assert first() == count_many(long) and later == count_many(long[::-1])
    assert count_aside(short)() == count_many(short) == [1, 0, count_tokens("中文 😀")]


def test_an_imports_batches_are_prepared_as_each_alone():
    from sidecar.domain import NewMessage, Role
    from sidecar.services.sessions import prepare, prepare_many

    batches = [[NewMessage(role=Role.USER, text=f"Never restart prod-{i}. my key is sk-live-{i:032d} " * 30),
                NewMessage(role=Role.ASSISTANT, text="Noted: " + "中文 😀 " * 500)] for i in range(12)]
    batches.append([NewMessage(role=Role.USER, text="ok")])
    together = prepare_many(batches)
    assert together == [prepare(b) for b in batches]
    assert all(p.pinned and p.masked for p in together[:12]) and together[0].counts[1][0] > 1000
