package contextsidecar

// Unit tests of the interceptor with a fake invoker: no sidecar needed.

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const svc = "/" + ServiceName + "/"

func testClient(opts ...Option) *Client {
	fast := WithRetry(RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Multiplier: 2, Jitter: 0.2})
	return &Client{addr: "fake", opts: newOptions(append([]Option{fast}, opts...))}
}

// attempt records what one attempt saw.
type attempt struct {
	key      string
	deadline time.Duration
	md       metadata.MD
}

// fake answers the codes in turn (codes.OK: success) and records every attempt.
func fake(seen *[]attempt, answers ...codes.Code) grpc.UnaryInvoker {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		a := attempt{key: IdempotencyKeyOf(req), deadline: -1}
		if d, ok := ctx.Deadline(); ok {
			a.deadline = time.Until(d)
		}
		a.md, _ = metadata.FromOutgoingContext(ctx)
		*seen = append(*seen, a)
		code := answers[len(answers)-1]
		if len(*seen) <= len(answers) {
			code = answers[len(*seen)-1]
		}
		if code == codes.OK {
			return nil
		}
		return status.Error(code, "fake "+code.String())
	}
}

func TestEveryMethodIsAReadOrAKeyedWrite(t *testing.T) {
	methods := pb.File_context_sidecar_v1_context_service_proto.Services().ByName("ContextService").Methods()
	for i := 0; i < methods.Len(); i++ {
		name := string(methods.Get(i).Name())
		if MethodKind(svc+name) == KindUnsafe {
			t.Errorf("%s is neither a read nor a write with an idempotency_key: it would never be retried", name)
		}
	}
	for name, want := range map[string]Kind{"BuildContext": KindRead, "GetSession": KindRead, "SearchKnowledge": KindRead,
		"WaitForJobs": KindRead, "AppendMessages": KindKeyedWrite, "CommitTurn": KindKeyedWrite, "StartRun": KindKeyedWrite} {
		if got := MethodKind(svc + name); got != want {
			t.Errorf("MethodKind(%s) = %d, want %d", name, got, want)
		}
	}
	if MethodKind("/grpc.health.v1.Health/Check") != KindUnsafe || MethodKind("/other.Svc/Do") != KindUnsafe {
		t.Error("methods of other services must not be retried")
	}
}

func TestKeyedWriteRetriedWithOneKeyAndCallerRequestUnchanged(t *testing.T) {
	c := testClient()
	req := &pb.AppendMessagesRequest{SessionId: "s", Messages: []*pb.NewMessage{{Role: pb.Role_ROLE_USER, Text: "hi"}}}
	before := proto.Clone(req)
	var seen []attempt
	err := c.intercept(context.Background(), svc+"AppendMessages", req, &pb.AppendMessagesResponse{}, nil,
		fake(&seen, codes.Unavailable, codes.Unavailable, codes.OK))
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 {
		t.Fatalf("%d attempts, want 3", len(seen))
	}
	if !strings.HasPrefix(seen[0].key, "go-") || len(seen[0].key) != 35 {
		t.Fatalf("key %q, want go- and 32 hex digits", seen[0].key)
	}
	for _, a := range seen[1:] {
		if a.key != seen[0].key {
			t.Fatalf("retry sent key %q, first attempt %q", a.key, seen[0].key)
		}
	}
	if !proto.Equal(req, before) {
		t.Fatal("the caller's request was changed")
	}
	// The next logical call gets a key of its own.
	var next []attempt
	if err := c.intercept(context.Background(), svc+"AppendMessages", req, &pb.AppendMessagesResponse{}, nil,
		fake(&next, codes.OK)); err != nil {
		t.Fatal(err)
	}
	if next[0].key == seen[0].key || next[0].key == "" {
		t.Fatalf("second call reused key %q", next[0].key)
	}
}

func TestCallerKeyIsKept(t *testing.T) {
	c := testClient()
	var seen []attempt
	req := &pb.CommitTurnRequest{SessionId: "s", IdempotencyKey: "turn-7"}
	if err := c.intercept(context.Background(), svc+"CommitTurn", req, &pb.CommitTurnResponse{}, nil,
		fake(&seen, codes.Unavailable, codes.OK)); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0].key != "turn-7" || seen[1].key != "turn-7" {
		t.Fatalf("attempts %+v, want two with key turn-7", seen)
	}
}

func TestOnlyUnavailableIsRetried(t *testing.T) {
	c := testClient()
	for _, code := range []codes.Code{codes.NotFound, codes.InvalidArgument, codes.FailedPrecondition,
		codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal, codes.Unauthenticated} {
		var seen []attempt
		err := c.intercept(context.Background(), svc+"GetSession", &pb.GetSessionRequest{}, &pb.Session{}, nil,
			fake(&seen, code))
		if status.Code(err) != code || len(seen) != 1 {
			t.Errorf("%s: got %v after %d attempts, want the code after 1", code, err, len(seen))
		}
	}
}

func TestRetriesGiveUpWithTheLastStatus(t *testing.T) {
	c := testClient()
	var seen []attempt
	err := c.intercept(context.Background(), svc+"BuildContext", &pb.BuildContextRequest{}, &pb.BuildContextResponse{}, nil,
		fake(&seen, codes.Unavailable))
	if status.Code(err) != codes.Unavailable || len(seen) != 4 {
		t.Fatalf("got %v after %d attempts, want Unavailable after 4", err, len(seen))
	}
	if !strings.Contains(status.Convert(err).Message(), "(after 4 attempts)") {
		t.Fatalf("message %q does not say the attempts", status.Convert(err).Message())
	}
}

func TestNotRetried(t *testing.T) {
	c := testClient()
	cases := []struct {
		name   string
		method string
		req    interface{}
		opts   []grpc.CallOption
	}{
		{"NoRetry option", svc + "GetSession", &pb.GetSessionRequest{}, []grpc.CallOption{NoRetry()}},
		{"another service", "/other.Svc/Do", &pb.GetSessionRequest{}, nil},
		{"a keyed write sent as raw bytes (no key can be set)", svc + "AppendMessages", &[]byte{1}, nil},
	}
	for _, tc := range cases {
		var seen []attempt
		err := c.intercept(context.Background(), tc.method, tc.req, nil, nil, fake(&seen, codes.Unavailable), tc.opts...)
		if status.Code(err) != codes.Unavailable || len(seen) != 1 {
			t.Errorf("%s: %v after %d attempts, want 1", tc.name, err, len(seen))
		}
	}
}

func TestRetriesStopAtTheDeadline(t *testing.T) {
	c := testClient(WithRetry(RetryPolicy{MaxAttempts: 100, InitialBackoff: 40 * time.Millisecond,
		MaxBackoff: 40 * time.Millisecond, Jitter: 0.01}))
	var seen []attempt
	t0 := time.Now()
	err := c.intercept(context.Background(), svc+"GetSession", &pb.GetSessionRequest{}, &pb.Session{}, nil,
		fake(&seen, codes.Unavailable), Timeout(150*time.Millisecond))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want the last attempt's Unavailable", err)
	}
	// 100 attempts would take 4 s; it stops when the next wait would end past the deadline (slack
	// for a loaded machine, whose timers fire late).
	if el := time.Since(t0); el > time.Second || len(seen) < 2 || len(seen) > 4 {
		t.Fatalf("%d attempts in %s; want 2-4 around the 150 ms deadline", len(seen), el)
	}
}

func TestDeadlines(t *testing.T) {
	c := testClient(WithTimeout(3 * time.Second))
	call := func(ctx context.Context, opts ...grpc.CallOption) time.Duration {
		var seen []attempt
		if err := c.intercept(ctx, svc+"GetSession", &pb.GetSessionRequest{}, &pb.Session{}, nil, fake(&seen, codes.OK),
			opts...); err != nil {
			t.Fatal(err)
		}
		return seen[0].deadline
	}
	near := func(got, want time.Duration) bool { return got <= want && got > want-500*time.Millisecond }
	if d := call(context.Background()); !near(d, 3*time.Second) {
		t.Errorf("default deadline %s, want ~3s", d)
	}
	if d := call(context.Background(), Timeout(time.Second)); !near(d, time.Second) {
		t.Errorf("Timeout(1s) gave %s", d)
	}
	if d := call(context.Background(), Timeout(0)); d != -1 {
		t.Errorf("Timeout(0) gave a deadline %s, want none", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if d := call(ctx); !near(d, 700*time.Millisecond) {
		t.Errorf("the caller's earlier deadline became %s", d)
	}
}

func TestTokenHeader(t *testing.T) {
	for _, token := range []string{"", "s3cret"} {
		c := testClient(WithToken(token))
		var seen []attempt
		if err := c.intercept(context.Background(), svc+"GetSession", &pb.GetSessionRequest{}, &pb.Session{}, nil,
			fake(&seen, codes.Unavailable, codes.OK)); err != nil {
			t.Fatal(err)
		}
		for _, a := range seen {
			got := a.md.Get("authorization")
			if token == "" && len(got) != 0 || token != "" && (len(got) != 1 || got[0] != "Bearer "+token) {
				t.Errorf("token %q: authorization %q", token, got)
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Multiplier: 2,
		Jitter: 0.2}
	for retry, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, 9: time.Second} {
		lo, hi := time.Duration(float64(base)*0.8), time.Duration(float64(base)*1.2)
		seen := map[time.Duration]bool{}
		for i := 0; i < 50; i++ {
			d := p.Backoff(retry)
			if d < lo || d > hi {
				t.Fatalf("Backoff(%d) = %s, want %s-%s", retry, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Backoff(%d) has no jitter: %d distinct waits in 50", retry, len(seen))
		}
	}
	if d := (RetryPolicy{}).withDefaults(); d != DefaultRetryPolicy() {
		t.Errorf("zero policy -> %+v, want the defaults", d)
	}
	still := RetryPolicy{InitialBackoff: time.Second, Jitter: -1}.withDefaults()
	if still.Jitter != 0 || still.Backoff(1) != time.Second {
		t.Errorf("negative jitter -> %+v, %s: want no jitter", still, still.Backoff(1))
	}
}
