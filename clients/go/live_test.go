package contextsidecar_test

// Tests against a live sidecar: SIDECAR_ADDR=host:port (tests/test_clients.py starts one and sets
// it); SIDECAR_AUTH_ADDR and SIDECAR_AUTH_TEST_TOKEN name a second one started with --auth-token.
// Without the addresses they skip.
//
//	SIDECAR_ADDR=127.0.0.1:50051 clients/go/build.sh test -count=1 -v

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"contextsidecar"
	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func liveAddr(t *testing.T) string {
	addr := os.Getenv("SIDECAR_ADDR")
	if addr == "" {
		t.Skip("SIDECAR_ADDR is not set: no live sidecar to test against (tests/test_clients.py sets it)")
	}
	return addr
}

func dial(t *testing.T, addr string, opts ...contextsidecar.Option) *contextsidecar.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := contextsidecar.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatalf("Dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scope is a fresh user per test (and per run), so that reruns against one sidecar do not mix.
func scope(t *testing.T) *pb.Scope {
	return &pb.Scope{TenantId: "go-lib", UserId: fmt.Sprintf("%s-%d", strings.ToLower(t.Name()), time.Now().UnixNano())}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %s: %s", what, status.Code(err), status.Convert(err).Message())
	}
}

func newSession(t *testing.T, c *contextsidecar.Client, s *pb.Scope) string {
	t.Helper()
	sess, err := c.CreateSession(context.Background(), &pb.CreateSessionRequest{Scope: s, Title: t.Name()})
	must(t, "CreateSession", err)
	return sess.GetSessionId()
}

// counter is an attempt interceptor that counts attempts per method and can lose one answer.
type counter struct {
	mu       sync.Mutex
	attempts map[string]int
	keys     map[string][]string
	// loseFirst: the first attempt of this method reaches the sidecar, which stores the write,
	// but its answer is "lost" (UNAVAILABLE), as when the connection drops on the way back.
	loseFirst string
}

func newCounter() *counter { return &counter{attempts: map[string]int{}, keys: map[string][]string{}} }

func (c *counter) intercept(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	name := method[strings.LastIndexByte(method, '/')+1:]
	c.mu.Lock()
	c.attempts[name]++
	n := c.attempts[name]
	c.keys[name] = append(c.keys[name], contextsidecar.IdempotencyKeyOf(req))
	c.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && name == c.loseFirst && n == 1 {
		return status.Error(codes.Unavailable, "test: the answer was lost on the way back")
	}
	return err
}

func (c *counter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempts[name]
}

func TestLiveTurn(t *testing.T) {
	c := dial(t, liveAddr(t))
	ctx := context.Background()
	s := scope(t)
	sid := newSession(t, c, s)

	turn, err := c.StartTurn(ctx, s, sid, "why is payment-api returning 503s?")
	must(t, "StartTurn", err)
	if turn.UserMessage.GetRole() != pb.Role_ROLE_USER || turn.UserMessage.GetMessageId() == "" {
		t.Fatalf("user message %v", turn.UserMessage)
	}
	req := &pb.BuildContextRequest{SystemRules: "You are an SRE assistant.", Render: pb.RenderMode_RENDER_MODE_CHAT,
		Tools: []*pb.ToolSchema{{Name: "query_logs", Description: "Search logs", SchemaJson: `{"type":"object"}`}}}
	bc, err := turn.BuildContext(ctx, req)
	must(t, "BuildContext", err)
	if req.Scope != nil || req.SessionId != "" || req.Query != "" {
		t.Fatal("Turn.BuildContext changed the caller's request")
	}
	if len(bc.GetChatMessages()) == 0 || bc.GetTotalTokens() <= 0 || bc.GetTotalTokens() > bc.GetTotalBudget() {
		t.Fatalf("BuildContext: %d chat messages, %d/%d tokens", len(bc.GetChatMessages()), bc.GetTotalTokens(), bc.GetTotalBudget())
	}
	found := false
	for _, m := range bc.GetChatMessages() {
		found = found || strings.Contains(m.GetContent(), "payment-api returning 503s")
	}
	if !found {
		t.Fatal("the turn's query is not in the prompt")
	}
	ref, err := turn.RecordToolResult(ctx, &pb.RecordToolResultRequest{ToolName: "query_logs", CallId: "call-1",
		FullText: "ERROR payment-api status=503 upstream=payment-db timeout", Status: pb.ToolStatus_TOOL_STATUS_OK})
	must(t, "RecordToolResult", err)
	if ref.GetToolResultId() == "" || len(turn.ToolResults) != 1 {
		t.Fatalf("tool result %v", ref)
	}
	answer, err := turn.Answer(ctx, "payment-db is timing out.")
	must(t, "Answer", err)
	commit, err := turn.Commit(ctx)
	must(t, "Commit", err)
	if len(commit.GetJobIds()) == 0 {
		t.Fatal("CommitTurn returned no jobs")
	}
	waited, err := c.WaitJobs(ctx, s, 60*time.Second, commit.GetJobIds()...)
	must(t, "WaitJobs", err)
	if !waited.GetAllFinished() {
		t.Fatalf("jobs not finished: %v", waited.GetJobs())
	}

	msgs, err := c.ListMessages(ctx, &pb.ListMessagesRequest{Scope: s, SessionId: sid, Newest: 10})
	must(t, "ListMessages", err)
	var said []string
	for _, m := range msgs.GetMessages() {
		if m.GetRole() == pb.Role_ROLE_USER || m.GetRole() == pb.Role_ROLE_ASSISTANT {
			said = append(said, m.GetMessageId())
		}
	}
	if len(said) != 2 || said[0] != turn.UserMessage.GetMessageId() || said[1] != answer.GetMessageId() {
		t.Fatalf("stored user/assistant messages %v, want [%s %s]", said, turn.UserMessage.GetMessageId(), answer.GetMessageId())
	}
}

func TestLiveMemory(t *testing.T) {
	c := dial(t, liveAddr(t))
	ctx := context.Background()
	s := scope(t)
	added, err := c.AddMemory(ctx, &pb.AddMemoryRequest{Scope: s, Type: pb.MemoryType_MEMORY_TYPE_PREFERENCE,
		Content: "The user prefers PostgreSQL over MySQL for new services."})
	must(t, "AddMemory", err)
	id := added.GetMemory().GetMemoryId()
	if id == "" || added.GetOutcome() != pb.WriteOutcome_WRITE_OUTCOME_CREATED {
		t.Fatalf("AddMemory: %v", added)
	}
	found, err := c.SearchMemories(ctx, &pb.SearchMemoriesRequest{Scope: s, Query: "does the user prefer PostgreSQL or MySQL", TopK: 5})
	must(t, "SearchMemories", err)
	if len(found.GetHits()) == 0 || found.GetHits()[0].GetMemory().GetMemoryId() != id {
		t.Fatalf("SearchMemories: %v, want %s first", found.GetHits(), id)
	}
	// Another user of the tenant sees none of it.
	other, err := c.SearchMemories(ctx, &pb.SearchMemoriesRequest{Scope: scope(t), Query: "which database", TopK: 5})
	must(t, "SearchMemories(other user)", err)
	if len(other.GetHits()) != 0 {
		t.Fatalf("another user found %v", other.GetHits())
	}
}

func TestLiveKnowledge(t *testing.T) {
	c := dial(t, liveAddr(t))
	ctx := context.Background()
	s := &pb.Scope{TenantId: fmt.Sprintf("go-lib-kb-%d", time.Now().UnixNano())}
	doc := "# Runbook: payment-db connection pool\n\nWhen payment-api answers 503 with upstream=payment-db, the " +
		"connection pool is exhausted. Raise max_connections to 200 and restart the pgbouncer pods.\n"
	ing, err := c.IngestDocument(ctx, &pb.IngestDocumentRequest{Scope: s, DocId: "runbook-payment-db",
		Title: "payment-db runbook", Text: doc, Format: pb.DocumentFormat_DOCUMENT_FORMAT_MARKDOWN})
	must(t, "IngestDocument", err)
	if ing.GetJobId() == "" || ing.GetVersion() != 1 || ing.GetChunkCount() < 1 {
		t.Fatalf("IngestDocument: %v", ing)
	}
	waited, err := c.WaitJobs(ctx, s, 60*time.Second, ing.GetJobId())
	must(t, "WaitJobs", err)
	if !waited.GetAllFinished() || len(waited.GetJobs()) != 1 || waited.GetJobs()[0].GetStatus() != pb.JobStatus_JOB_STATUS_DONE {
		t.Fatalf("indexing job: %v", waited.GetJobs())
	}
	hits, err := c.SearchKnowledge(ctx, &pb.SearchKnowledgeRequest{Scope: s, Query: "payment-db connection pool exhausted", K: 3})
	must(t, "SearchKnowledge", err)
	if len(hits.GetHits()) == 0 || hits.GetHits()[0].GetDocId() != "runbook-payment-db" ||
		!strings.Contains(hits.GetHits()[0].GetText(), "max_connections") {
		t.Fatalf("SearchKnowledge: %v", hits.GetHits())
	}
}

func TestLiveRuns(t *testing.T) {
	c := dial(t, liveAddr(t))
	ctx := context.Background()
	s := scope(t)
	sid := newSession(t, c, s)
	run, err := c.StartRun(ctx, &pb.StartRunRequest{Scope: s, SessionId: sid, Goal: "restart payment-api"})
	must(t, "StartRun", err)
	if run.GetStatus() != pb.RunStatus_RUN_STATUS_RUNNING || run.GetRunId() == "" {
		t.Fatalf("StartRun: %v", run)
	}
	state := []byte(`{"step":3,"plan":["query_logs","restart_service"]}`)
	cp, err := c.Checkpoint(ctx, &pb.CheckpointRequest{Scope: s, SessionId: sid, RunId: run.GetRunId(), State: state,
		PendingStep: "restart_service(payment-api, production): awaiting approval"})
	must(t, "Checkpoint", err)
	paused, err := c.UpdateRun(ctx, &pb.UpdateRunRequest{Scope: s, SessionId: sid, RunId: run.GetRunId(),
		Status: pb.RunStatus_RUN_STATUS_INTERRUPTED, Reason: "waiting for a human"})
	must(t, "UpdateRun", err)
	if paused.GetStatus() != pb.RunStatus_RUN_STATUS_INTERRUPTED {
		t.Fatalf("UpdateRun: %v", paused)
	}
	resumed, err := c.ResumeRun(ctx, &pb.ResumeRunRequest{Scope: s, SessionId: sid, RunId: run.GetRunId()})
	must(t, "ResumeRun", err)
	if resumed.GetRun().GetStatus() != pb.RunStatus_RUN_STATUS_RUNNING ||
		resumed.GetCheckpoint().GetCheckpointId() != cp.GetCheckpointId() ||
		!bytes.Equal(resumed.GetCheckpoint().GetState(), state) {
		t.Fatalf("ResumeRun: %v, want checkpoint %s with the state back", resumed, cp.GetCheckpointId())
	}
	// A finished run cannot be resumed: FAILED_PRECONDITION, not retried.
	_, err = c.UpdateRun(ctx, &pb.UpdateRunRequest{Scope: s, SessionId: sid, RunId: run.GetRunId(),
		Status: pb.RunStatus_RUN_STATUS_COMPLETED})
	must(t, "UpdateRun(COMPLETED)", err)
	_, err = c.ResumeRun(ctx, &pb.ResumeRunRequest{Scope: s, SessionId: sid, RunId: run.GetRunId()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ResumeRun of a completed run: %v, want FailedPrecondition", err)
	}
}

func TestLiveErrorStatus(t *testing.T) {
	calls := newCounter()
	c := dial(t, liveAddr(t), contextsidecar.WithAttemptInterceptor(calls.intercept))
	ctx := context.Background()
	s := scope(t)
	_, err := c.GetSession(ctx, &pb.GetSessionRequest{Scope: s, SessionId: "no-such-session"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetSession of a missing session: %v, want NotFound", err)
	}
	if !strings.Contains(status.Convert(err).Message(), "no-such-session") {
		t.Errorf("NotFound message %q does not name the session", status.Convert(err).Message())
	}
	// Another user's session is NOT_FOUND too, never its content.
	sid := newSession(t, c, s)
	_, err = c.GetSession(ctx, &pb.GetSessionRequest{Scope: scope(t), SessionId: sid})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetSession of another user's session: %v, want NotFound", err)
	}
	_, err = c.CreateSession(ctx, &pb.CreateSessionRequest{Scope: &pb.Scope{TenantId: "bad tenant!", UserId: "u"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateSession with a bad tenant id: %v, want InvalidArgument", err)
	}
	if calls.count("GetSession") != 2 || calls.count("CreateSession") != 2 {
		t.Fatalf("attempts %v: errors other than UNAVAILABLE must not be retried", calls.attempts)
	}
	// A deadline that has passed before the call goes out.
	_, err = c.WaitForJobs(ctx, &pb.WaitForJobsRequest{Scope: s, TimeoutMs: 5000}, contextsidecar.Timeout(time.Nanosecond))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a 1 ns deadline: %v, want DeadlineExceeded", err)
	}
}

// A write whose answer is lost is retried with the same idempotency key, and the sidecar stores
// it once.
func TestLiveRetriedWriteIsNotDuplicated(t *testing.T) {
	calls := newCounter()
	calls.loseFirst = "AppendMessages"
	c := dial(t, liveAddr(t), contextsidecar.WithAttemptInterceptor(calls.intercept))
	ctx := context.Background()
	s := scope(t)
	sid := newSession(t, c, s)
	req := &pb.AppendMessagesRequest{Scope: s, SessionId: sid,
		Messages: []*pb.NewMessage{{Role: pb.Role_ROLE_USER, Text: "restart payment-api please"}}}
	resp, err := c.AppendMessages(ctx, req)
	must(t, "AppendMessages", err)
	keys := calls.keys["AppendMessages"]
	if calls.count("AppendMessages") != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("attempts %d with keys %q: want 2 with one key", calls.count("AppendMessages"), keys)
	}
	if req.IdempotencyKey != "" {
		t.Fatal("the caller's request got the key")
	}
	msgs, err := c.ListMessages(ctx, &pb.ListMessagesRequest{Scope: s, SessionId: sid, Newest: 10})
	must(t, "ListMessages", err)
	if len(msgs.GetMessages()) != 1 || msgs.GetMessages()[0].GetMessageId() != resp.GetMessages()[0].GetMessageId() {
		t.Fatalf("stored %d messages %v, want the one the retry answered (%s)", len(msgs.GetMessages()),
			msgs.GetMessages(), resp.GetMessages()[0].GetMessageId())
	}

	// The same logical call again (a new key) is a second message: the key is per call.
	_, err = c.AppendMessages(ctx, req)
	must(t, "AppendMessages(again)", err)
	msgs, err = c.ListMessages(ctx, &pb.ListMessagesRequest{Scope: s, SessionId: sid, Newest: 10})
	must(t, "ListMessages", err)
	if len(msgs.GetMessages()) != 2 {
		t.Fatalf("%d messages after a second call, want 2", len(msgs.GetMessages()))
	}
	// A key reused for another request is the caller's bug: FAILED_PRECONDITION.
	req2 := &pb.AppendMessagesRequest{Scope: s, SessionId: sid, IdempotencyKey: keys[0],
		Messages: []*pb.NewMessage{{Role: pb.Role_ROLE_USER, Text: "something else"}}}
	if _, err = c.AppendMessages(ctx, req2); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a reused key with another request: %v, want FailedPrecondition", err)
	}
}

// proxy forwards TCP connections to target once started; before that its port refuses them.
func proxy(t *testing.T, target string) (addr string, start func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close() // refused until start
	var mu sync.Mutex
	var open []io.Closer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
		open = nil
	})
	start = func() {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("proxy listen %s: %v", addr, err)
			return
		}
		mu.Lock()
		open = append(open, l)
		mu.Unlock()
		go func() {
			for {
				in, err := l.Accept()
				if err != nil {
					return
				}
				out, err := net.Dial("tcp", target)
				if err != nil {
					in.Close()
					continue
				}
				mu.Lock()
				open = append(open, in, out)
				mu.Unlock()
				go func() { io.Copy(out, in); out.Close() }()
				go func() { io.Copy(in, out); in.Close() }()
			}
		}()
	}
	return addr, start
}

// A sidecar that is not reachable yet answers UNAVAILABLE; reads and keyed writes are retried with
// backoff until it is, a call with NoRetry is not.
func TestLiveUnavailableIsRetried(t *testing.T) {
	target := liveAddr(t)
	addr, start := proxy(t, target)
	calls := newCounter()
	c := dial(t, addr, contextsidecar.SkipHealthWait(), contextsidecar.WithAttemptInterceptor(calls.intercept),
		contextsidecar.WithRetry(contextsidecar.RetryPolicy{MaxAttempts: 50, InitialBackoff: 20 * time.Millisecond,
			MaxBackoff: 100 * time.Millisecond}),
		contextsidecar.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second})))
	ctx := context.Background()
	s := scope(t)

	_, err := c.ListSessions(ctx, &pb.ListSessionsRequest{Scope: s}, contextsidecar.NoRetry())
	if status.Code(err) != codes.Unavailable || calls.count("ListSessions") != 1 {
		t.Fatalf("with NoRetry and nothing listening: %v after %d attempts, want Unavailable after 1", err,
			calls.count("ListSessions"))
	}
	time.AfterFunc(300*time.Millisecond, start)
	t0 := time.Now()
	list, err := c.ListSessions(ctx, &pb.ListSessionsRequest{Scope: s})
	must(t, "ListSessions through the late proxy", err)
	if n := calls.count("ListSessions") - 1; n < 2 {
		t.Fatalf("ListSessions took %d attempt(s) in %s: want retries while the port refused", n, time.Since(t0))
	}
	if len(list.GetSessions()) != 0 {
		t.Fatalf("a fresh user has sessions: %v", list.GetSessions())
	}
	t.Logf("ListSessions succeeded after %d attempts in %s", calls.count("ListSessions")-1, time.Since(t0))
	// Connected now: a keyed write goes through once.
	sid := newSession(t, c, s)
	if calls.count("CreateSession") != 1 || sid == "" {
		t.Fatalf("CreateSession: %d attempts", calls.count("CreateSession"))
	}
}

func TestLiveDialWaitsForHealth(t *testing.T) {
	target := liveAddr(t)
	addr, start := proxy(t, target)
	time.AfterFunc(300*time.Millisecond, start)
	t0 := time.Now()
	c := dial(t, addr, contextsidecar.WithDialTimeout(20*time.Second), contextsidecar.WithRetry(contextsidecar.RetryPolicy{MaxAttempts: 1}))
	if el := time.Since(t0); el < 250*time.Millisecond {
		t.Fatalf("Dial returned after %s, before the sidecar was reachable", el)
	}
	// Healthy means a call now succeeds on its first attempt.
	_, err := c.ListSessions(context.Background(), &pb.ListSessionsRequest{Scope: scope(t)})
	must(t, "ListSessions after Dial", err)

	// Nothing ever listening: Dial gives up at its deadline with a status error.
	dead, _ := proxy(t, target)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = contextsidecar.Dial(ctx, dead)
	if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Unavailable {
		t.Fatalf("Dial of a dead address: %v", err)
	}
}

func TestLiveAuthToken(t *testing.T) {
	addr, token := os.Getenv("SIDECAR_AUTH_ADDR"), os.Getenv("SIDECAR_AUTH_TEST_TOKEN")
	if addr == "" || token == "" {
		t.Skip("SIDECAR_AUTH_ADDR / SIDECAR_AUTH_TEST_TOKEN are not set: no sidecar with --auth-token to test against")
	}
	ctx := context.Background()
	s := scope(t)
	// Health needs no token, so Dial works without one; calls do not.
	anon := dial(t, addr)
	if _, err := anon.CreateSession(ctx, &pb.CreateSessionRequest{Scope: s}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want Unauthenticated", err)
	}
	wrong := dial(t, addr, contextsidecar.WithToken(token+"x"))
	if _, err := wrong.CreateSession(ctx, &pb.CreateSessionRequest{Scope: s}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("with a wrong token: %v, want Unauthenticated", err)
	}
	c := dial(t, addr, contextsidecar.WithToken(token))
	newSession(t, c, s)
}
