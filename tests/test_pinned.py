"""Pinned constraints through the real server: ListPinned and Unpin (history with who and why),
near duplicates rendered once, a clear error when distinct ones overflow the budget, permissions
that unpin nothing, and sub-sessions that inherit their parents' constraints and see their task."""

import grpc

from sidecar.api import context_service_pb2 as pb
from sidecar.assembly.budget import Budget
from tests.grpc_assert import expect_status

PROD = "不要重启生产实例。"
STAGING = "不要重启测试环境。"


def _say(stub, scope, sid, *texts):
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=t) for t in texts]))


def _pins(stub, scope, sid, include_unpinned=False):
    return list(stub.ListPinned(pb.ListPinnedRequest(scope=scope, session_id=sid,
                                                     include_unpinned=include_unpinned)).pinned)


def _unpin(stub, scope, sid, pin_id, by="ops-lead", reason="done"):
    return stub.Unpin(pb.UnpinRequest(scope=scope, session_id=sid, pin_id=pin_id, by=by, reason=reason))


def _build(stub, scope, sid, **kw):
    return stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="what next?", **kw))


def _section(resp, kind):
    return list(next((s for s in resp.sections if s.kind == kind), pb.Section()).items)


def _rendered_pins(stub, scope, sid):
    return [it.text for it in _section(_build(stub, scope, sid), pb.SECTION_KIND_PINNED_CONSTRAINTS)]


def _child(stub, scope, parent, task="Compare pool metrics", fact_keys=()):
    return stub.CreateSubSession(pb.CreateSubSessionRequest(scope=scope, parent_session_id=parent, task=task,
                                                            fact_keys=list(fact_keys))).session_id


def test_unpin_keeps_the_constraint_in_history_with_who_and_why(stub, scope, session_id):
    _say(stub, scope, session_id, PROD + "Never run migrations on ledger-db during business hours.")
    prod, migrations = _pins(stub, scope, session_id)
    assert (prod.text, prod.session_id, prod.inherited, prod.unpinned_at_ms) == (PROD, session_id, False, 0)
    assert prod.pin_id == f"{prod.message_id}:0" and migrations.pin_id == f"{prod.message_id}:1"
    assert prod.tokens > 0 and prod.created_at_ms > 0

    gone = _unpin(stub, scope, session_id, migrations.pin_id, by="alice", reason="the migration window is over")
    assert (gone.pin_id, gone.unpinned_by, gone.unpin_reason) == (migrations.pin_id, "alice",
                                                                  "the migration window is over")
    assert gone.unpinned_at_ms > 0
    assert [p.pin_id for p in _pins(stub, scope, session_id)] == [prod.pin_id]
    history = _pins(stub, scope, session_id, include_unpinned=True)
    assert [(p.pin_id, p.unpinned_by) for p in history] == [(prod.pin_id, ""), (migrations.pin_id, "alice")]
    assert history[1].unpinned_at_ms == gone.unpinned_at_ms
    assert _rendered_pins(stub, scope, session_id) == [PROD]  # the cached view saw the unpin
    expect_status(lambda: _unpin(stub, scope, session_id, migrations.pin_id), grpc.StatusCode.FAILED_PRECONDITION,
                  migrations.pin_id, "already unpinned", "alice")


def test_errors_name_their_fields(stub, scope, session_id):
    _say(stub, scope, session_id, PROD)
    (pin,) = _pins(stub, scope, session_id)
    for bad in ("", "no-index", "msg_1:", ":0", "msg_1:x", "msg 1:0"):
        expect_status(lambda b=bad: _unpin(stub, scope, session_id, b), grpc.StatusCode.INVALID_ARGUMENT, "pin_id")
    expect_status(lambda: _unpin(stub, scope, session_id, pin.pin_id, by=" "), grpc.StatusCode.INVALID_ARGUMENT,
                  "by")
    expect_status(lambda: _unpin(stub, scope, session_id, pin.pin_id, reason="x" * 20000),
                  grpc.StatusCode.INVALID_ARGUMENT, "reason")
    expect_status(lambda: _unpin(stub, scope, session_id, f"{pin.message_id}:7"), grpc.StatusCode.NOT_FOUND,
                  f"{pin.message_id}:7", session_id)
    expect_status(lambda: _unpin(stub, scope, "ses_nope", pin.pin_id), grpc.StatusCode.NOT_FOUND, "session_id")
    expect_status(lambda: _pins(stub, scope, "ses_nope"), grpc.StatusCode.NOT_FOUND, "session_id")
    other = pb.Scope(tenant_id=scope.tenant_id, user_id="mallory")
    expect_status(lambda: _unpin(stub, other, session_id, pin.pin_id), grpc.StatusCode.NOT_FOUND, "session_id")
    assert [p.unpinned_at_ms for p in _pins(stub, scope, session_id)] == [0]


EN_RULE = "restart the production payment-api instance or any of its pods without my explicit written approval"
CN_RULE = "不要在没有我书面批准的情况下重启生产环境的 payment-api 实例或者它的任何一个 pod"


def _repeated_rules() -> list[str]:
    """60 ways of saying the same two rules again: politeness, emphasis, case, contractions, punctuation."""
    en = [f"{lead}{neg} {EN_RULE}{end}" for lead in ("", "Please ", "Again: ", "Remember, ", "Reminder: ", "Just ")
          for neg, end in (("do not", "."), ("don't", "!"), ("DO NOT", "!!"), ("Do not", "."), ("dont", ""))]
    cn = [f"{lead}{CN_RULE}{end}" for lead in ("", "请", "再说一遍：", "记住，", "注意：", "千万")
          for end in ("。", "！", "!!", "了。", "！！")]
    return en + cn


def test_sixty_repeated_constraints_render_once_and_fit_the_default_budget(stub, scope, session_id):
    rules = _repeated_rules()
    assert len(set(rules)) == 60
    _say(stub, scope, session_id, *rules)
    history = _pins(stub, scope, session_id, include_unpinned=True)
    en, cn = _pins(stub, scope, session_id)
    assert len(history) == 2 and len(en.merged_pin_ids) == len(cn.merged_pin_ids) == 29
    assert (en.text, cn.text) == (rules[0], rules[30])  # the oldest is kept, verbatim
    # Said separately they would not fit the default session_state budget: merging is what makes it fit.
    assert en.tokens * 30 + cn.tokens * 30 > Budget().session_state
    resp = _build(stub, scope, session_id)
    pinned = _section(resp, pb.SECTION_KIND_PINNED_CONSTRAINTS)
    assert [it.text for it in pinned] == [rules[0], rules[30]]
    assert len(pinned[0].source_message_ids) == 30  # one item stands for every message that said it

    # A merged one unpinned by its own id leaves alone; the shown one takes its near duplicates with it.
    _unpin(stub, scope, session_id, cn.merged_pin_ids[0])
    assert len(_pins(stub, scope, session_id)[1].merged_pin_ids) == 28
    gone = _unpin(stub, scope, session_id, en.pin_id, reason="the freeze is over")
    assert list(gone.merged_pin_ids) == list(en.merged_pin_ids)
    assert [p.text for p in _pins(stub, scope, session_id)] == [rules[30]]
    assert _rendered_pins(stub, scope, session_id) == [rules[30]]
    assert sum(p.unpinned_by == "ops-lead" for p in _pins(stub, scope, session_id, include_unpinned=True)) == 31


def test_opposite_or_other_target_rules_are_never_merged(stub, scope, session_id):
    rules = ["You must restart the payment-api production pods before tonight's deploy.",
             "You must not restart the payment-api production pods before tonight's deploy.",
             "You must not restart the payment-api staging pods before tonight's deploy.",
             "Never copy the prod database to staging.", "Never copy the staging database to prod.",
             "必须先备份数据库再重启。", "必须先重启再备份数据库。", PROD, "不要重启测试实例。"]
    _say(stub, scope, session_id, *rules)
    assert [p.text for p in _pins(stub, scope, session_id)] == rules
    assert all(not p.merged_pin_ids for p in _pins(stub, scope, session_id))


def test_distinct_constraints_over_the_budget_fail_with_a_clear_message(stub, scope, session_id):
    rules = [f"Never restart service-{i} in region-{i} during its maintenance window without paging the "
             f"on-call lead of team-{i} first." for i in range(60)]
    _say(stub, scope, session_id, *rules)
    pins = _pins(stub, scope, session_id)
    assert len(pins) == 60
    tokens = sum(p.tokens for p in pins)
    expect_status(lambda: _build(stub, scope, session_id), grpc.StatusCode.FAILED_PRECONDITION,
                  "budget.session_state is 1000", f"60 pinned constraints take {tokens} tokens", "ListPinned", "Unpin")
    # The whole hard zone's message says the same when that is the limit hit.
    expect_status(lambda: _build(stub, scope, session_id, budget=pb.Budget(session_state=5000, max_input=2000,
                                                                           reserved_for_output=500)),
                  grpc.StatusCode.FAILED_PRECONDITION, "budget.max_input - budget.reserved_for_output is 1500",
                  "60 pinned constraints", "ListPinned", "Unpin")
    for p in pins[:30]:
        _unpin(stub, scope, session_id, p.pin_id, reason="the maintenance is done")
    assert _rendered_pins(stub, scope, session_id) == rules[30:]


def test_a_permission_is_pinned_after_the_prohibition_and_unpins_nothing(stub, scope, session_id):
    _say(stub, scope, session_id, PROD + STAGING)
    _say(stub, scope, session_id, "现在可以重启测试环境了", "OK, you may restart staging now.")
    pins = _pins(stub, scope, session_id, include_unpinned=True)
    assert [p.text for p in pins] == [PROD, STAGING, "现在可以重启测试环境了", "OK, you may restart staging now."]
    assert all(p.unpinned_at_ms == 0 for p in pins)  # a statement never unpins anything itself
    assert _rendered_pins(stub, scope, session_id) == [p.text for p in pins]
    # Lifting the staging rule is the user's Unpin; the production rule stays.
    _unpin(stub, scope, session_id, pins[1].pin_id, by="alice", reason="staging restarts allowed again")
    assert _rendered_pins(stub, scope, session_id)[0] == PROD


def test_sub_sessions_inherit_the_parents_constraints(stub, scope, session_id):
    _say(stub, scope, session_id, PROD)
    child = _child(stub, scope, session_id)
    assert _rendered_pins(stub, scope, child) == [PROD]
    (inherited,) = _pins(stub, scope, child)
    assert (inherited.inherited, inherited.session_id, inherited.text) == (True, session_id, PROD)
    expect_status(lambda: _unpin(stub, scope, child, inherited.pin_id), grpc.StatusCode.FAILED_PRECONDITION,
                  f"inherited from session {session_id!r}; unpin it there")

    # Read from the parent at every call: a later pin of the parent reaches the child and its own child.
    _say(stub, scope, session_id, "Never run migrations on ledger-db during business hours.")
    _say(stub, scope, child, "Only use read-only kubectl commands.")
    grandchild = _child(stub, scope, child, task="Read the pool metrics")
    expected = [PROD, "Never run migrations on ledger-db during business hours.",
                "Only use read-only kubectl commands."]
    assert _rendered_pins(stub, scope, child) == expected
    assert _rendered_pins(stub, scope, grandchild) == expected
    assert [(p.inherited, p.session_id) for p in _pins(stub, scope, grandchild)] == [
        (True, session_id), (True, session_id), (True, child)]
    own = _pins(stub, scope, child)[2]
    assert not own.inherited
    _unpin(stub, scope, child, own.pin_id)  # its own constraint a child may unpin
    assert _rendered_pins(stub, scope, grandchild) == expected[:2]
    # Unpinned where it was said, it leaves the whole family.
    _unpin(stub, scope, session_id, inherited.pin_id)
    assert _rendered_pins(stub, scope, grandchild) == expected[1:2]
    assert _pins(stub, scope, child, include_unpinned=True)[0].unpinned_by == "ops-lead"


def test_sub_session_task_is_the_parent_agents_word_not_confirmed_state(stub, scope, session_id):
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="env", value="production", provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="pool_max", value="50", provenance=pb.PROVENANCE_TOOL_VERIFIED)]))
    child = _child(stub, scope, session_id, fact_keys=["env", "pool_max"])
    state = stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id=child))
    assert {f.key: f.provenance for f in state.confirmed} == {"env": pb.PROVENANCE_USER_CONFIRMED,
                                                             "pool_max": pb.PROVENANCE_TOOL_VERIFIED}
    (task,) = state.candidates
    assert (task.key, task.value, task.provenance, task.source) == (
        "task", "Compare pool metrics", pb.PROVENANCE_MODEL_INFERRED, f"handoff:{session_id}")
    # The child still sees its task, in the hard zone, from its session.
    items = _section(_build(stub, scope, child), pb.SECTION_KIND_SESSION_STATE)
    assert items[0].source == f"task:{child}" and items[0].text.endswith(": Compare pool metrics")
    assert {it.source for it in items[1:]} == {"fact:env", "fact:pool_max"}
    # Not confirmed, so it cannot be handed on to a grandchild as if the user had said it.
    expect_status(lambda: _child(stub, scope, child, task="x", fact_keys=["task"]), grpc.StatusCode.NOT_FOUND,
                  "fact_keys[0]")


def test_a_sub_agent_gets_long_term_memories_only_by_relevance_to_its_task(stub, scope, session_id):
    pref = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                              content="I prefer answers with emoji and a joke")).memory
    fact = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                              content="The billing database is payments-db-7 in eu-west-1")).memory
    child = stub.CreateSubSession(pb.CreateSubSessionRequest(
        scope=scope, parent_session_id=session_id, task="check replication lag of the billing database")).session_id

    def memories(sid):
        ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="start"))
        return {i.source for s in ctx.sections for i in s.items if i.source.startswith("memory:")}

    assert memories(child) == {f"memory:{fact.memory_id}"}
    assert f"memory:{pref.memory_id}" in memories(session_id)  # the parent's preferences always compete
