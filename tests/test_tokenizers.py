"""BuildContext in the model's own tokens (BuildContextRequest.tokenizer): every budget and every item's
tokens in the chosen vocabulary, shipped offline; cl100k_base stays the default and what rows store."""

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar import text_caches, tokens
from sidecar.api import context_service_pb2 as pb
from sidecar.domain import Message, Role
from sidecar.store.cache import MESSAGE_LINE_EXTRA, MessageTail
from tests.grpc_assert import expect_status
from tests.test_tokens import EDGY, LINES

ISSUE_SENTENCE = "不要重启生产实例，任何情况下都先问我"
NAMES = list(tokens.COUNTERS)
RULES = "You are OpsPilot. Read-only unless a human approves a write."
TOOLS = [pb.ToolSchema(name="query_logs", description="Query service logs", schema_json='{"serviceId":"string"}')]

# Random texts from English, Chinese, code and emoji pieces (and any other characters, blanks, "\r").
ENGLISH = st.sampled_from(["payment-api", " returns 5xx", " since the deploy", "Hello, world!", " restart", " pool",
                          "don't", " it's", " 42", " 3.14159", " e.g."])
CHINESE = st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=12) | \
    st.sampled_from(["不要重启生产实例", "，", "。", "数据库连接超时", "先问我"])
CODE = st.sampled_from(["def f(x):\n    return x * 2", "for (int i = 0; i < n; i++) {", "SELECT * FROM t WHERE id = 1;",
                        '{"a": [1, 2, 3]}', "if err != nil {\n\treturn err\n}", "x += 1  # ok", "</div>", "/usr/bin/env"])
EMOJI = st.lists(st.sampled_from(["😀", "🎉", "👍🏽", "🔥", "✅", "❤️", "👨‍👩‍👧", "🇨🇳"]), min_size=1, max_size=6).map("".join)
OTHER = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | \
    st.sampled_from([" ", "\n", "\r\n", "\t", "!\n", ":\r", "/"])
TEXT = st.lists(ENGLISH | CHINESE | CODE | EMOJI | OTHER, min_size=1, max_size=10).map("".join)
WORDS = st.lists(ENGLISH | CHINESE | CODE | EMOJI, min_size=1, max_size=10).map("".join)  # memories, facts: no junk


def _build(stub, scope, sid, **kw):
    kw.setdefault("system_rules", RULES)
    kw.setdefault("tools", TOOLS)
    return stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, **kw))


def _append(stub, scope, sid, texts, role=pb.ROLE_USER):
    return stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=sid, messages=[pb.NewMessage(role=role, text=t) for t in texts])).messages


def _messages(resp):
    return [it for s in resp.sections if s.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in s.items
            if it.source.startswith("message:")]


def test_the_issue_sentence_in_each_vocabulary():
    # Issue 31: 19 tokens in cl100k, 12 in o200k; Qwen's count is the tokenizers library's on Qwen3's
    # tokenizer.json (checked offline against it on 20,000 mixed texts: every count equal).
    counts = {name: tokens.counter(name).count(ISSUE_SENTENCE) for name in NAMES}
    assert counts == {"cl100k_base": 19, "o200k_base": 12, "qwen2": 10}
    assert tokens.counter("") is tokens.CL100K and tokens.count_tokens(ISSUE_SENTENCE) == 19


@pytest.mark.parametrize("name", ["claude", "gpt-4o", "o200k", "llama3", "x" * 500])
def test_an_unknown_tokenizer_is_invalid_argument_naming_the_field(stub, scope, session_id, name):
    err = expect_status(lambda: _build(stub, scope, session_id, tokenizer=name), grpc.StatusCode.INVALID_ARGUMENT,
                        "tokenizer", "o200k_base")
    assert len(err.details()) < 300  # the name is cut, not echoed whole


def test_the_response_names_what_counted_it(stub, scope, session_id):
    _append(stub, scope, session_id, [ISSUE_SENTENCE, "payment-api returns 5xx 😀"])
    default = _build(stub, scope, session_id, query="why?")
    assert default.token_counter == "cl100k_base"
    assert _build(stub, scope, session_id, query="why?", tokenizer="cl100k_base").sections == default.sections
    for name in NAMES:
        resp = _build(stub, scope, session_id, query="why?", tokenizer=name)
        assert resp.token_counter == name
        counter = tokens.counter(name)
        # Message items carry their line's count in that vocabulary (and the newline after it).
        assert [it.tokens for it in _messages(resp)] == [counter.count(it.text) + 1 for it in _messages(resp)]


@pytest.mark.parametrize("layout", [pb.LAYOUT_CACHE_AWARE, pb.LAYOUT_CLASSIC])
def test_o200k_fits_more_chinese_than_cl100k_at_the_same_budget(stub, scope, session_id, layout):
    phrases = ["支付接口返回五百错误", "数据库连接池已满", "日志里有很多超时记录", "缓存命中率下降", "磁盘空间不足",
               "网关延迟升高", "证书即将过期", "队列积压严重", "内存使用率很高", "副本同步落后"]
    # Distinct turns (near-duplicates would be deduplicated away): each its own pair of phrases.
    _append(stub, scope, session_id, [f"第{i}次：{phrases[i % 10]}，{phrases[(i // 10 + i + 1) % 10]}" for i in range(200)])
    packed = {}
    for name in ("cl100k_base", "o200k_base"):
        resp = _build(stub, scope, session_id, query="现在怎么办？", budget=pb.Budget(recent_messages=2000),
                      render=pb.RENDER_MODE_TEXT, tokenizer=name, layout=layout)
        assert tokens.counter(name).count(resp.rendered_text) <= resp.total_budget
        packed[name] = sum(len(it.text) for it in _messages(resp))
    assert packed["o200k_base"] > 1.2 * packed["cl100k_base"]


@pytest.fixture
def kb_scope(stub, scope):
    """A tenant whose knowledge base holds a runbook in English, Chinese, code and emoji."""
    doc = ("# Payment API runbook\n\npayment-api returns 5xx when the pool is exhausted 🔥. 不要重启生产实例，"
           "先检查数据库连接池。\n\n## Checks\n\n```\nSELECT count(*) FROM pg_stat_activity;\n```\n"
           "Then restart the pool, never the instance ✅. 重启连接池之前先问我。\n")
    r = stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id="runbook", title="Payment API runbook",
                                                     text=doc, format=pb.DOCUMENT_FORMAT_MARKDOWN))
    assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[r.job_id], timeout_ms=30000)).all_finished
    return scope


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(TEXT, min_size=1, max_size=25), facts=st.lists(WORDS, max_size=3),
       memories=st.lists(WORDS, max_size=4), tool_output=st.lists(TEXT, max_size=30).map("\n".join),
       total=st.integers(min_value=150, max_value=6000), recent=st.integers(min_value=0, max_value=1500),
       layout=st.sampled_from([pb.LAYOUT_CACHE_AWARE, pb.LAYOUT_CLASSIC]))
def test_the_rendered_prompt_never_exceeds_the_budget_in_the_chosen_tokens(stub, kb_scope, messages, facts,
                                                                           memories, tool_output, total, recent,
                                                                           layout):
    scope = kb_scope
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    _append(stub, scope, sid, messages)
    if facts:
        stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
            pb.FactInput(key=f"k{i}", value=v, provenance=pb.PROVENANCE_USER_CONFIRMED) for i, v in enumerate(facts)]))
    for m in memories:
        try:
            stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, content=m))
        except grpc.RpcError as e:  # a memory the filters refuse (too little information, a secret)
            assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), e
    if tool_output.strip():
        stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=sid, tool_name="query_logs",
                                                         call_id="c1", full_text=tool_output, status=pb.TOOL_STATUS_OK))
    budget = pb.Budget(max_input=total + 100, reserved_for_output=100, recent_messages=recent, memories=300,
                       rag_or_graph=300, tool_observations=300)
    for name in NAMES:
        counter = tokens.counter(name)
        try:
            resp = _build(stub, scope, sid, query="payment-api 5xx 不要重启生产实例 pool?", budget=budget, layout=layout,
                          render=pb.RENDER_MODE_TEXT, tokenizer=name, max_dropped=100000)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e  # only when the hard zone alone is too big
            continue
        assert resp.token_counter == name
        assert resp.total_tokens <= resp.total_budget == total
        assert counter.count(resp.rendered_text) <= resp.total_budget, name
        for section in resp.sections:
            assert section.tokens == sum(it.tokens for it in section.items)
            for it in section.items:
                assert it.tokens >= counter.count(it.text), (name, it.source)
        for u in resp.usage:
            assert u.used <= u.budget


def _message(seq: int, text: str) -> Message:
    return Message(message_id=f"m{seq}", session_id="s", seq=seq, role=Role.USER, text=text, tool_name="",
                   tool_call_id="", timestamp_ms=seq, created_at_ms=seq, tokens=tokens.count_tokens(text),
                   line_tokens=tokens.count_tokens(f"{Role.USER.label}: {text}"))


def test_a_tail_counts_another_tokenizer_once_and_extends_it_on_append():
    o200k = tokens.counter("o200k_base")
    tail = MessageTail().extended([_message(i, f"{ISSUE_SENTENCE} {i}") for i in range(1, 6)])
    assert tail.counted(tokens.CL100K) == (tail.line_tokens, tail.item_bodies) and not tail.recounted
    counts, bodies = tail.counted(o200k)
    assert tail.counted(o200k)[1] is bodies  # made once
    assert counts.tolist() == [o200k.count(line) for line in tail.lines] != tail.line_tokens.tolist()
    longer = tail.extended([_message(6, "and one more 😀")])  # carried over: counted only for the new message
    again, more = longer.recounted[o200k]
    assert again.tolist() == [o200k.count(line) for line in longer.lines] and more[:5] == bodies
    item = pb.ContextItem.FromString(more[-1])
    assert item.tokens == o200k.count(longer.lines[-1]) + MESSAGE_LINE_EXTRA and item.text == longer.lines[-1]
    assert MessageTail().extended([_message(1, "x")]).recounted == {}  # a session no call asked in costs nothing


# Lines ending in punctuation before lines starting with slashes: o200k joins "<\n/" into one piece.
SLASHED = st.lists(st.builds(str.__add__, st.sampled_from(["/", "//", "/\n/", "-", ":", "a", "<"]),
                             st.text(st.sampled_from(list("/:<>.!?,;-=*#()[]'\" \t\n\rabcXY019中😀")), max_size=10)),
                   min_size=2, max_size=5)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "cl100k_base"])
@settings(max_examples=300, deadline=None)
@given(lines=LINES | EDGY | SLASHED)
def test_lines_are_never_charged_less_than_they_cost_joined_in_any_vocabulary(name, lines):
    counter = tokens.counter(name)
    joined = counter.count("\n".join(lines))
    assert sum(counter.count_line(t) for t in lines) >= joined
    assert sum(counter.plus_newline(t, 0) for t in lines) >= joined  # as messages and summaries are charged


@pytest.mark.parametrize("lines", [["0<", "/:0:"], ["Done.", "/u/joe: hi"], ["ok!", "//", "/x"]])
def test_a_line_starting_with_slashes_is_charged_what_it_may_cost_after_punctuation(lines):
    counter = tokens.counter("o200k_base")
    joined = counter.count("\n".join(lines))
    assert sum(counter.count_line(t) for t in lines) >= joined
    assert sum(counter.plus_newline(t, 0) for t in lines) >= joined


def test_a_deletion_forgets_every_vocabularys_counts():
    o200k = tokens.counter("o200k_base")
    o200k.line("a text that was deleted")
    o200k.cached("a text that was deleted")
    text_caches.clear()
    assert o200k.line.cache_info().currsize == o200k.cached.cache_info().currsize == 0


def test_a_counter_matches_its_batch_and_ignores_special_token_text():
    for name in NAMES:
        counter = tokens.counter(name)
        texts = ["", "<|endoftext|>", ISSUE_SENTENCE, "e\u0301"]  # special tokens' text is plain text
        assert counter.count_many(texts) == [counter.count(t) for t in texts]
        assert counter.count("<|endoftext|>") > 1
    qwen = tokens.counter("qwen2")
    assert qwen.count("e\u0301") == qwen.count("\u00e9")  # Qwen normalises to NFC first
    assert np.all(np.array([tokens.counter(n).count_line("x!") for n in NAMES]) >= 1)
