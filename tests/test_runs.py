import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status


def _update(stub, scope, session_id, run_id, status, reason=""):
    return stub.UpdateRun(pb.UpdateRunRequest(scope=scope, session_id=session_id, run_id=run_id, status=status,
                                              reason=reason))


def test_interrupt_checkpoint_resume_complete(stub, scope, session_id):
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, goal="fix 5xx"))
    assert run.status == pb.RUN_STATUS_RUNNING
    state = bytes(range(256)) * 10
    cp = stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id=session_id, run_id=run.run_id, state=state,
                                              pending_step='{"tool":"restart","target":"staging"}'))
    assert cp.seq == 1
    _update(stub, scope, session_id, run.run_id, pb.RUN_STATUS_INTERRUPTED, "awaiting approval")
    resumed = stub.ResumeRun(pb.ResumeRunRequest(scope=scope, session_id=session_id, run_id=run.run_id))
    assert resumed.run.status == pb.RUN_STATUS_RUNNING
    assert resumed.checkpoint.state == state and resumed.checkpoint.pending_step.startswith('{"tool"')
    done = _update(stub, scope, session_id, run.run_id, pb.RUN_STATUS_COMPLETED, "ok")
    assert done.status == pb.RUN_STATUS_COMPLETED and done.checkpoint_count == 1


@pytest.mark.parametrize("path,bad", [
    ([pb.RUN_STATUS_COMPLETED], pb.RUN_STATUS_RUNNING),
    ([pb.RUN_STATUS_FAILED], pb.RUN_STATUS_INTERRUPTED),
    ([pb.RUN_STATUS_INTERRUPTED], pb.RUN_STATUS_COMPLETED),
    ([pb.RUN_STATUS_CANCELLED], pb.RUN_STATUS_CANCELLED),
])
def test_illegal_transitions_name_both_states(stub, scope, session_id, path, bad):
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id))
    for status in path:
        _update(stub, scope, session_id, run.run_id, status)
    current = pb.RunStatus.Name(path[-1])
    expect_status(lambda: _update(stub, scope, session_id, run.run_id, bad), grpc.StatusCode.FAILED_PRECONDITION,
                  current, pb.RunStatus.Name(bad))
    assert stub.GetRun(pb.GetRunRequest(scope=scope, session_id=session_id, run_id=run.run_id)).status == path[-1]


def test_run_errors(stub, scope, session_id):
    expect_status(lambda: stub.GetRun(pb.GetRunRequest(scope=scope, session_id=session_id, run_id="nope")),
                  grpc.StatusCode.NOT_FOUND, "run_id")
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, run_id="r1"))
    expect_status(lambda: stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, run_id="r1")),
                  grpc.StatusCode.FAILED_PRECONDITION, "r1")
    expect_status(lambda: _update(stub, scope, session_id, run.run_id, 42), grpc.StatusCode.INVALID_ARGUMENT, "status")
    expect_status(lambda: stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id=session_id, run_id="r1",
                                                               state=b"x" * (4 * 1024 * 1024 + 1))),
                  grpc.StatusCode.INVALID_ARGUMENT, "state")
    _update(stub, scope, session_id, "r1", pb.RUN_STATUS_COMPLETED)
    expect_status(lambda: stub.ResumeRun(pb.ResumeRunRequest(scope=scope, session_id=session_id, run_id="r1")),
                  grpc.StatusCode.FAILED_PRECONDITION, "COMPLETED")
    other = pb.Scope(tenant_id=scope.tenant_id, user_id="mallory")
    expect_status(lambda: stub.GetRun(pb.GetRunRequest(scope=other, session_id=session_id, run_id="r1")),
                  grpc.StatusCode.NOT_FOUND)
