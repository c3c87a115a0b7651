package dev.contextsidecar.client;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import com.google.protobuf.ByteString;
import dev.contextsidecar.v1.AddMemoryRequest;
import dev.contextsidecar.v1.AddMemoryResponse;
import dev.contextsidecar.v1.AppendMessagesRequest;
import dev.contextsidecar.v1.AppendMessagesResponse;
import dev.contextsidecar.v1.BuildContextRequest;
import dev.contextsidecar.v1.BuildContextResponse;
import dev.contextsidecar.v1.CheckpointRequest;
import dev.contextsidecar.v1.CommitTurnResponse;
import dev.contextsidecar.v1.DocumentFormat;
import dev.contextsidecar.v1.GetSessionRequest;
import dev.contextsidecar.v1.IngestDocumentRequest;
import dev.contextsidecar.v1.IngestDocumentResponse;
import dev.contextsidecar.v1.JobStatus;
import dev.contextsidecar.v1.KnowledgeHit;
import dev.contextsidecar.v1.KnowledgeStatus;
import dev.contextsidecar.v1.ListMessagesRequest;
import dev.contextsidecar.v1.MemoryType;
import dev.contextsidecar.v1.Message;
import dev.contextsidecar.v1.NewMessage;
import dev.contextsidecar.v1.RenderMode;
import dev.contextsidecar.v1.ResumeRunRequest;
import dev.contextsidecar.v1.ResumeRunResponse;
import dev.contextsidecar.v1.Role;
import dev.contextsidecar.v1.Run;
import dev.contextsidecar.v1.RunCheckpoint;
import dev.contextsidecar.v1.RunStatus;
import dev.contextsidecar.v1.Scope;
import dev.contextsidecar.v1.ScoredMemory;
import dev.contextsidecar.v1.SearchKnowledgeRequest;
import dev.contextsidecar.v1.SearchKnowledgeResponse;
import dev.contextsidecar.v1.SearchMemoriesRequest;
import dev.contextsidecar.v1.SearchMemoriesResponse;
import dev.contextsidecar.v1.Section;
import dev.contextsidecar.v1.SectionKind;
import dev.contextsidecar.v1.StartRunRequest;
import dev.contextsidecar.v1.ToolCall;
import dev.contextsidecar.v1.ToolResultRef;
import dev.contextsidecar.v1.ToolSchema;
import dev.contextsidecar.v1.ToolStatus;
import dev.contextsidecar.v1.UpdateRunRequest;
import dev.contextsidecar.v1.WaitForJobsRequest;
import dev.contextsidecar.v1.WaitForJobsResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.Before;
import org.junit.Test;

/** The library against a live sidecar (-Dsidecar.addr): test.sh runs it, tests/test_java_client.py drives that. */
public class SidecarClientLiveTest {
  private static final String RUNBOOK = "# Payment API runbook\n"
      + "## Restart procedure\n"
      + "To restart payment-api, drain traffic at the load balancer first, then run a rolling restart with\n"
      + "kubectl rollout restart deployment/payment-api in the payments namespace. Wait for readiness.\n"
      + "## Dependencies\n"
      + "payment-api depends on payment-db and payment-api calls fraud-service.\n";

  @Before
  public void needsSidecar() {
    Live.assumeSidecar();
  }

  private static List<Message> messages(SidecarClient cs, Scope scope, String sid) {
    return cs.listMessages(ListMessagesRequest.newBuilder().setScope(scope).setSessionId(sid).setNewest(100).build())
        .getMessagesList();
  }

  private static AppendMessagesRequest userSays(Scope scope, String sid, String text) {
    return AppendMessagesRequest.newBuilder().setScope(scope).setSessionId(sid)
        .addMessages(NewMessage.newBuilder().setRole(Role.ROLE_USER).setText(text)).build();
  }

  @Test
  public void connectWaitsForServing() {
    try (SidecarClient cs = Live.connect()) {
      cs.awaitHealthy(Duration.ofSeconds(2));  // already SERVING: returns at once
      assertEquals(Live.addr(), cs.target());
    }
  }

  @Test
  public void memoryAddAndSearch() {
    Scope scope = Live.freshScope("memory");
    try (SidecarClient cs = Live.connect()) {
      AddMemoryResponse added = cs.addMemory(AddMemoryRequest.newBuilder().setScope(scope)
          .setType(MemoryType.MEMORY_TYPE_SEMANTIC).setContent("payment-api runs in the k8s-prod-eu cluster").build());
      String id = added.getMemory().getMemoryId();
      assertFalse(id.isEmpty());
      cs.addMemory(AddMemoryRequest.newBuilder().setScope(scope).setType(MemoryType.MEMORY_TYPE_HABIT)
          .setContent("Checks Grafana every morning").build());
      SearchMemoriesResponse found = cs.searchMemories(SearchMemoriesRequest.newBuilder().setScope(scope)
          .setQuery("where does payment-api run?").setTopK(5).build());
      assertTrue("hits: " + found, found.getHitsCount() > 0);
      assertEquals(id, found.getHits(0).getMemory().getMemoryId());
      assertEquals("payment-api runs in the k8s-prod-eu cluster", found.getHits(0).getMemory().getContent());
      // Only that user's memories, always.
      SearchMemoriesResponse other = cs.searchMemories(SearchMemoriesRequest.newBuilder()
          .setScope(SidecarClient.scope(scope.getTenantId(), "mallory")).setQuery("payment-api").build());
      for (ScoredMemory h : other.getHitsList()) {
        assertNotEquals(id, h.getMemory().getMemoryId());
      }
    }
  }

  @Test
  public void knowledgeIngestWaitAndSearch() {
    Scope scope = Live.freshScope("kb");
    try (SidecarClient cs = Live.connect()) {
      IngestDocumentResponse ing = cs.ingestDocument(IngestDocumentRequest.newBuilder().setScope(scope)
          .setDocId("runbook-pay").setTitle("Payment API runbook").setText(RUNBOOK)
          .setFormat(DocumentFormat.DOCUMENT_FORMAT_MARKDOWN).build());
      assertEquals(1, ing.getVersion());
      assertTrue(ing.getChunkCount() >= 2);
      assertFalse(ing.getJobId().isEmpty());
      WaitForJobsResponse done = cs.waitForJobs(WaitForJobsRequest.newBuilder().setScope(scope)
          .addJobIds(ing.getJobId()).setTimeoutMs(30000).build());
      assertTrue(done.toString(), done.getAllFinished());
      assertEquals(JobStatus.JOB_STATUS_DONE, done.getJobs(0).getStatus());
      SearchKnowledgeResponse found = cs.searchKnowledge(SearchKnowledgeRequest.newBuilder().setScope(scope)
          .setQuery("how do I restart payment-api?").setK(5).build());
      assertEquals(KnowledgeStatus.KNOWLEDGE_STATUS_MATCHED, found.getStatus());
      KnowledgeHit top = found.getHits(0);
      assertEquals("runbook-pay", top.getDocId());
      assertTrue(top.getSource(), top.getSource().startsWith("kb:runbook-pay@v1#"));
      assertTrue(top.getText(), top.getText().contains("rolling restart"));
    }
  }

  @Test
  public void runsStartCheckpointResume() {
    Scope scope = Live.freshScope("runs");
    try (SidecarClient cs = Live.connect()) {
      String sid = Live.newSession(cs, scope);
      Run run = cs.startRun(StartRunRequest.newBuilder().setScope(scope).setSessionId(sid).setGoal("fix 5xx").build());
      assertEquals(RunStatus.RUN_STATUS_RUNNING, run.getStatus());
      byte[] state = new byte[2560];
      for (int i = 0; i < state.length; i++) {
        state[i] = (byte) i;
      }
      RunCheckpoint cp = cs.checkpoint(CheckpointRequest.newBuilder().setScope(scope).setSessionId(sid)
          .setRunId(run.getRunId()).setState(ByteString.copyFrom(state))
          .setPendingStep("{\"tool\":\"restart\",\"target\":\"staging\"}").build());
      assertEquals(1, cp.getSeq());
      Run paused = cs.updateRun(UpdateRunRequest.newBuilder().setScope(scope).setSessionId(sid)
          .setRunId(run.getRunId()).setStatus(RunStatus.RUN_STATUS_INTERRUPTED).setReason("awaiting approval").build());
      assertEquals(RunStatus.RUN_STATUS_INTERRUPTED, paused.getStatus());
      ResumeRunResponse resumed = cs.resumeRun(ResumeRunRequest.newBuilder().setScope(scope).setSessionId(sid)
          .setRunId(run.getRunId()).build());
      assertEquals(RunStatus.RUN_STATUS_RUNNING, resumed.getRun().getStatus());
      assertArrayEquals(state, resumed.getCheckpoint().getState().toByteArray());
      assertTrue(resumed.getCheckpoint().getPendingStep().startsWith("{\"tool\""));
    }
  }

  @Test
  public void notFoundIsAStatusRuntimeExceptionAndNotRetried() {
    Scope scope = Live.freshScope("notfound");
    Faults f = Faults.count("GetSession");
    try (SidecarClient cs = Live.connect(f)) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.getSession(GetSessionRequest.newBuilder().setScope(scope).setSessionId("no-such-session").build()));
      assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode());
      assertEquals(Status.Code.NOT_FOUND, Status.fromThrowable(e).getCode());
      assertEquals("NOT_FOUND is final: one attempt", 1, f.attempts.get());
    }
  }

  @Test
  public void retriedAppendIsNotDuplicated() {
    Scope scope = Live.freshScope("retry");
    // The sidecar stores the message twice over, but both answers are lost on the way back: the
    // client retries with the same idempotency key and the third attempt gets the first answer.
    Faults f = Faults.loseAnswers("AppendMessages", 2);
    try (SidecarClient cs = Live.connect(f)) {
      String sid = Live.newSession(cs, scope);
      AppendMessagesResponse r = cs.appendMessages(userSays(scope, sid, "payment-api is down again"));
      assertEquals(3, f.attempts.get());
      assertEquals("one key, reused by every retry", 1, new HashSet<>(f.keys).size());
      assertFalse(f.keys.get(0).isEmpty());
      assertEquals(1, r.getMessagesCount());
      List<Message> stored = messages(cs, scope, sid);
      assertEquals("stored once: " + stored, 1, stored.size());
      assertEquals(r.getMessages(0).getMessageId(), stored.get(0).getMessageId());
      assertEquals("payment-api is down again", stored.get(0).getText());
    }
  }

  @Test
  public void writeWithoutKeyIsNotRetried() {
    Scope scope = Live.freshScope("nokey");
    Faults f = Faults.loseAnswers("AppendMessages", 1);
    try (SidecarClient cs = Live.builder(f).autoIdempotencyKeys(false).connect()) {
      String sid = Live.newSession(cs, scope);
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.appendMessages(userSays(scope, sid, "hello")));
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
      assertEquals(1, f.attempts.get());
      assertEquals("the write happened; the client just never heard", 1, messages(cs, scope, sid).size());
    }
  }

  @Test
  public void eachLogicalWriteGetsItsOwnKey() {
    Scope scope = Live.freshScope("keys");
    Faults f = Faults.count("AppendMessages");
    try (SidecarClient cs = Live.connect(f)) {
      String sid = Live.newSession(cs, scope);
      cs.appendMessages(userSays(scope, sid, "same words"));
      cs.appendMessages(userSays(scope, sid, "same words"));
      assertEquals(2, new HashSet<>(f.keys).size());
      assertEquals("two logical calls, two messages", 2, messages(cs, scope, sid).size());
    }
  }

  @Test
  public void explicitKeyIsKeptAndDeduplicates() {
    Scope scope = Live.freshScope("ownkey");
    Faults f = Faults.count("AppendMessages");
    try (SidecarClient cs = Live.connect(f)) {
      String sid = Live.newSession(cs, scope);
      AppendMessagesRequest req = userSays(scope, sid, "once").toBuilder().setIdempotencyKey("app-key-1").build();
      AppendMessagesResponse a = cs.appendMessages(req);
      AppendMessagesResponse b = cs.appendMessages(req);
      assertEquals(List.of("app-key-1", "app-key-1"), f.keys);
      assertEquals("the second call gets the first answer", a.getMessages(0).getMessageId(),
          b.getMessages(0).getMessageId());
      assertEquals(1, messages(cs, scope, sid).size());
    }
  }

  @Test
  public void readIsRetriedOnUnavailable() {
    Scope scope = Live.freshScope("readretry");
    Faults f = Faults.refuse("ListMessages", 2);
    try (SidecarClient cs = Live.connect(f)) {
      String sid = Live.newSession(cs, scope);
      cs.appendMessages(userSays(scope, sid, "hi"));
      assertEquals(1, messages(cs, scope, sid).size());
      assertEquals(3, f.attempts.get());
    }
  }

  @Test
  public void deadlineExceededIsNotRetried() {
    Scope scope = Live.freshScope("deadline");
    Faults f = Faults.count("GetSession");
    try (SidecarClient cs = Live.connect(f)) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.withTimeout(Duration.ofNanos(1))
              .getSession(GetSessionRequest.newBuilder().setScope(scope).setSessionId("s").build()));
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
      assertEquals(1, f.attempts.get());
      assertEquals(Duration.ofSeconds(20), cs.timeout());  // the view did not change the client
    }
  }

  @Test
  public void turnHelperRunsAWholeTurn() {
    Scope scope = Live.freshScope("turn");
    try (SidecarClient cs = Live.connect()) {
      String sid = Live.newSession(cs, scope);
      String query = "payment-api returns 5xx in production. Do not restart the production instance.";
      Turn turn = cs.startTurn(scope, sid, query);
      assertEquals(Role.ROLE_USER, turn.userMessage().getRole());
      assertEquals(query, turn.userMessage().getText());

      BuildContextResponse ctx = turn.buildContext(BuildContextRequest.newBuilder()
          .setSystemRules("You are an SRE assistant.")
          .addTools(ToolSchema.newBuilder().setName("query_logs").setDescription("Search service logs")
              .setSchemaJson("{\"type\":\"object\"}"))
          .setRender(RenderMode.RENDER_MODE_CHAT));
      List<SectionKind> kinds = ctx.getSectionsList().stream().map(Section::getKind).collect(Collectors.toList());
      assertTrue(kinds.toString(), kinds.contains(SectionKind.SECTION_KIND_SYSTEM_RULES));
      assertTrue(kinds.toString(), kinds.contains(SectionKind.SECTION_KIND_QUERY));
      assertTrue(ctx.getChatMessagesCount() > 0);
      assertTrue(ctx.getTotalTokens() > 0 && ctx.getTotalTokens() <= ctx.getTotalBudget());
      assertEquals(ctx, turn.lastContext());

      Message call = turn.toolCalls("", List.of(ToolCall.newBuilder().setId("call-1").setName("query_logs")
          .setArgumentsJson("{\"service\":\"payment-api\"}").build()));
      assertEquals(Role.ROLE_ASSISTANT, call.getRole());
      ToolResultRef ref = turn.recordToolResult("query_logs", "call-1",
          "2024-05-01T10:00:01Z ERROR payment-api status=503 upstream=payment-db timeout\n", ToolStatus.TOOL_STATUS_OK);
      assertFalse(ref.getToolResultId().isEmpty());
      BuildContextResponse again = turn.buildContext(BuildContextRequest.newBuilder().setRender(RenderMode.RENDER_MODE_CHAT));
      assertTrue(again.getTotalTokens() > 0);

      Message answer = turn.answer("92% of the 5xx are payment-db timeouts; the pool is exhausted.");
      assertEquals(Role.ROLE_ASSISTANT, answer.getRole());
      CommitTurnResponse commit = turn.commit();
      assertTrue(commit.getJobIdsCount() > 0);
      assertEquals("commit is once per turn", commit, turn.commit());
      WaitForJobsResponse done = cs.waitForJobs(WaitForJobsRequest.newBuilder().setScope(scope)
          .addAllJobIds(commit.getJobIdsList()).setTimeoutMs(30000).build());
      assertTrue(done.toString(), done.getAllFinished());

      List<String> said = new ArrayList<>();
      for (Message m : messages(cs, scope, sid)) {
        if (m.getRole() == Role.ROLE_USER || m.getRole() == Role.ROLE_ASSISTANT) {
          said.add(m.getMessageId());
        }
      }
      assertEquals(List.of(turn.userMessage().getMessageId(), call.getMessageId(), answer.getMessageId()), said);
      assertEquals(said, turn.messageIds());
    }
  }
}
