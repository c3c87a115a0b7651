"""CandidateBatch.rescore: a source's scores for what was packed, asked once the selection is made.
It changes the scores reported for the packed items and nothing else: the same items are packed and
dropped as without it."""

import uuid
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app import Sidecar
from sidecar.assembly.budget import DEFAULT_BUDGET
from sidecar.assembly.builder import BuildRequest
from tests.test_exclusion import SCOPE, FixedSource, _batch, _outcome


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["alpha beta", "gamma delta epsilon", "zeta"]), st.floats(0.0, 1.0),
                          st.integers(0, 400)), min_size=1, max_size=20), st.integers(50, 3000))
def test_rescoring_changes_only_the_reported_scores_of_what_was_packed(tmp_path, items, memory_budget):
    texts = [f"{t} {i}" for i, (t, _, _) in enumerate(items)]
    plain = _batch(texts, [r for _, r, _ in items], [n for _, _, n in items])
    seen: list[np.ndarray] = []

    def rescore(packed: np.ndarray, scores: np.ndarray) -> np.ndarray:
        seen.append(packed.copy())
        return 10.0 + packed.astype(np.float64)  # a score that tells which candidate it is

    app = Sidecar(str(tmp_path / f"{uuid.uuid4().hex}.duckdb"))
    try:
        sid = app.sessions.create(SCOPE, "s", "agent", {}).session_id
        req = BuildRequest(session_id=sid, query="alpha gamma", budget=replace(DEFAULT_BUDGET, memories=memory_budget),
                           cache_aware=False)
        app.builder.sources.append(FixedSource(plain))
        packed, dropped, usage = _outcome(app, sid, req)
        app.builder.sources[-1] = FixedSource(replace(plain, rescore=rescore))
        packed2, dropped2, usage2 = _outcome(app, sid, req)
    finally:
        app.close()
    assert (dropped2, usage2) == (dropped, usage)
    assert sorted(s for s, _ in packed2) == sorted(s for s, _ in packed)
    if len(packed) > 1:  # asked with the packed candidates' indices, ascending; its scores are reported
        assert seen and seen[-1].tolist() == sorted(int(s[len("memory:c"):]) for s, _ in packed)
        assert all(score == 10.0 + int(s[len("memory:c"):]) for s, score in packed2)
    else:
        assert not seen and packed2 == packed
