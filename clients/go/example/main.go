// Command sidecar-example runs one full agent turn against a Context Sidecar and prints one JSON
// line with what it saw:
//
//	CreateSession -> AppendMessages(user) -> UpsertFacts -> BuildContext (RENDER_MODE_CHAT)
//	-> RecordToolResult -> AppendMessages(assistant) -> CommitTurn
//
// and then times BuildContext over -n calls after -warmup untimed ones (p50/p95 in the JSON).
// Any RPC error is printed on stderr and the command exits 1.
//
// It is written on the library (package contextsidecar, clients/go): Dial waits for the sidecar's
// health, every call has a deadline (-timeout) and the token, reads and keyed writes are retried on
// UNAVAILABLE, and the turn is the library's Turn helper.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"contextsidecar"
	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc/status"
)

const toolSchema = `{"type":"object","properties":{"service":{"type":"string"},"env":{"type":"string"},"since_minutes":{"type":"integer"}},"required":["service","env"]}`

const toolOutput = `2024-05-01T10:00:01Z ERROR payment-api pod=payment-api-7d9f status=503 path=/v1/charge upstream=payment-db timeout after 3000ms
2024-05-01T10:00:02Z ERROR payment-api pod=payment-api-7d9f status=503 path=/v1/charge upstream=payment-db timeout after 3000ms
2024-05-01T10:00:04Z WARN  payment-api pod=payment-api-2c41 db pool exhausted (50/50 in use)
2024-05-01T10:00:05Z ERROR payment-api pod=payment-api-2c41 status=500 path=/v1/refund NullPointerException at RefundService.java:88
2024-05-01T10:00:07Z INFO  payment-api pod=payment-api-2c41 health check ok
summary: 5xx=412 in the last 15 minutes (503: 380, 500: 32); 92% upstream=payment-db`

type result struct {
	Client           string   `json:"client"`
	SessionID        string   `json:"session_id"`
	UserMessageID    string   `json:"user_message_id"`
	Facts            int      `json:"facts"`
	Sections         int      `json:"sections"`
	SectionKinds     []string `json:"section_kinds"`
	ChatMessages     int      `json:"chat_messages"`
	TotalTokens      int32    `json:"total_tokens"`
	TotalBudget      int32    `json:"total_budget"`
	StablePrefixHash string   `json:"stable_prefix_hash"`
	ToolResultID     string   `json:"tool_result_id"`
	ToolResultTokens int32    `json:"tool_result_tokens"`
	AssistantMsgID   string   `json:"assistant_message_id"`
	JobIDs           []string `json:"job_ids"`
	WarmupCalls      int      `json:"warmup_calls"`
	LatencyCalls     int      `json:"latency_calls"`
	P50Ms            float64  `json:"p50_ms"`
	P95Ms            float64  `json:"p95_ms"`
}

func fail(what string, err error) {
	if st, ok := status.FromError(err); ok {
		fmt.Fprintf(os.Stderr, "sidecar-example: %s failed: %s: %s\n", what, st.Code(), st.Message())
	} else {
		fmt.Fprintf(os.Stderr, "sidecar-example: %s failed: %v\n", what, err)
	}
	os.Exit(1)
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "sidecar address host:port")
	tenant := flag.String("tenant", "acme", "tenant id")
	user := flag.String("user", "alice", "user id")
	token := flag.String("token", os.Getenv("SIDECAR_AUTH_TOKEN"), "bearer token when the sidecar runs with --auth-token (default $SIDECAR_AUTH_TOKEN)")
	n := flag.Int("n", 200, "BuildContext calls to time (0: skip the measurement)")
	warmup := flag.Int("warmup", 50, "untimed BuildContext calls before the timed ones")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each RPC and of the wait for a healthy sidecar")
	flag.Parse()

	ctx := context.Background()
	client, err := contextsidecar.Dial(ctx, *addr, contextsidecar.WithToken(*token),
		contextsidecar.WithTimeout(*timeout), contextsidecar.WithDialTimeout(*timeout))
	if err != nil {
		fail("dial "+*addr, err)
	}
	defer client.Close()
	scope := &pb.Scope{TenantId: *tenant, UserId: *user}
	out := result{Client: "go"}

	// 1. A session for this task.
	sess, err := client.CreateSession(ctx, &pb.CreateSessionRequest{Scope: scope, Title: "payment-api 5xx"})
	if err != nil {
		fail("CreateSession", err)
	}
	out.SessionID = sess.GetSessionId()

	// 2. The user's message starts the turn.
	query := "查一下生产环境 payment-api 的 5xx"
	turn, err := client.StartTurn(ctx, scope, out.SessionID, query)
	if err != nil {
		fail("AppendMessages(user)", err)
	}
	out.UserMessageID = turn.UserMessage.GetMessageId()

	// 3. A fact the user confirmed: it is pinned into the hard zone of every later BuildContext.
	facts, err := client.UpsertFacts(ctx, &pb.UpsertFactsRequest{
		Scope: scope, SessionId: out.SessionID,
		Facts: []*pb.FactInput{{Key: "env", Value: "production", Provenance: pb.Provenance_PROVENANCE_USER_CONFIRMED,
			Source: "message:" + out.UserMessageID}},
	})
	if err != nil {
		fail("UpsertFacts", err)
	}
	out.Facts = len(facts.GetFacts())

	// 4. The prompt for the model call, as chat messages (scope, session and query are the turn's).
	bcReq := &pb.BuildContextRequest{
		SystemRules: "You are an SRE assistant. Only query production when the user confirmed it. Answer in the user's language.",
		Tools: []*pb.ToolSchema{{Name: "query_logs", Description: "Search service logs by service, env and time window.",
			SchemaJson: toolSchema}},
		Render: pb.RenderMode_RENDER_MODE_CHAT,
	}
	bc, err := turn.BuildContext(ctx, bcReq)
	if err != nil {
		fail("BuildContext", err)
	}
	out.Sections = len(bc.GetSections())
	out.SectionKinds = []string{}
	for _, s := range bc.GetSections() {
		out.SectionKinds = append(out.SectionKinds, s.GetKind().String())
	}
	out.ChatMessages = len(bc.GetChatMessages())
	out.TotalTokens = bc.GetTotalTokens()
	out.TotalBudget = bc.GetTotalBudget()
	out.StablePrefixHash = bc.GetStablePrefixHash()
	// Here a real service hands bc.GetChatMessages() ({role, content} pairs) to its model and
	// runs the tool call the model asks for.

	// 5. The tool's whole output; later prompts show a trimmed view of it.
	ref, err := turn.RecordToolResult(ctx, &pb.RecordToolResultRequest{
		ToolName: "query_logs", CallId: "call-1", FullText: toolOutput, Status: pb.ToolStatus_TOOL_STATUS_OK,
	})
	if err != nil {
		fail("RecordToolResult", err)
	}
	out.ToolResultID = ref.GetToolResultId()
	out.ToolResultTokens = ref.GetTokens()

	// 6. The model's answer.
	answer, err := turn.Answer(ctx, "生产环境 payment-api 最近 15 分钟有 412 个 5xx（503: 380，500: 32），92% 是 payment-db 超时，连接池已满（50/50）。")
	if err != nil {
		fail("AppendMessages(assistant)", err)
	}
	out.AssistantMsgID = answer.GetMessageId()

	// 7. Hand the finished turn to the background jobs (memory extraction, summary).
	commit, err := turn.Commit(ctx)
	if err != nil {
		fail("CommitTurn", err)
	}
	out.JobIDs = commit.GetJobIds()
	if out.JobIDs == nil {
		out.JobIDs = []string{}
	}

	// 8. BuildContext latency, client-side, after a short warm-up.
	if *n > 0 {
		full := &pb.BuildContextRequest{Scope: scope, SessionId: out.SessionID, Query: query,
			SystemRules: bcReq.SystemRules, Tools: bcReq.Tools, Render: bcReq.Render}
		for i := 0; i < *warmup; i++ {
			if _, err = client.BuildContext(ctx, full); err != nil {
				fail("BuildContext(warm-up)", err)
			}
		}
		ms := make([]float64, 0, *n)
		for i := 0; i < *n; i++ {
			t0 := time.Now()
			_, err = client.BuildContext(ctx, full)
			d := time.Since(t0)
			if err != nil {
				fail("BuildContext(timed)", err)
			}
			ms = append(ms, float64(d.Nanoseconds())/1e6)
		}
		sort.Float64s(ms)
		out.LatencyCalls = *n
		out.WarmupCalls = *warmup
		out.P50Ms = round3(percentile(ms, 0.50))
		out.P95Ms = round3(percentile(ms, 0.95))
	}

	line, err := json.Marshal(out)
	if err != nil {
		fail("encode JSON", err)
	}
	fmt.Println(string(line))
}
