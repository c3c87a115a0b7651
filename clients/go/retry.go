package contextsidecar

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	mrand "math/rand"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// RetryPolicy says how calls that are safe to repeat are retried after UNAVAILABLE (the sidecar
// is restarting, the connection dropped, a request or its answer was lost on the way). The n-th
// retry waits min(MaxBackoff, InitialBackoff * Multiplier^(n-1)), scaled by a random factor in
// [1-Jitter, 1+Jitter]; no retry starts when its wait would end after the call's deadline.
type RetryPolicy struct {
	// MaxAttempts counts the first attempt too: 1 means no retries. Default 5.
	MaxAttempts int
	// InitialBackoff is the wait before the first retry. Default 50 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps each wait. Default 2 s.
	MaxBackoff time.Duration
	// Multiplier grows the wait from one retry to the next. Default 2.
	Multiplier float64
	// Jitter, 0-1, spreads each wait by up to this fraction either way, so that clients cut off
	// together do not retry together. Default (0) 0.2; negative: no jitter.
	Jitter float64
}

// DefaultRetryPolicy is 5 attempts, waits of 50 ms, 100 ms, 200 ms, 400 ms (±20%), at most 2 s each.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 5, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second,
		Multiplier: 2, Jitter: 0.2}
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = d.MaxBackoff
	}
	if p.Multiplier < 1 {
		p.Multiplier = d.Multiplier
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = d.Jitter
	case p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	return p
}

var jitterRand = struct {
	sync.Mutex
	*mrand.Rand
}{Rand: mrand.New(mrand.NewSource(time.Now().UnixNano()))}

// Backoff is the wait before retry number retry (1 = the first retry), jitter included.
func (p RetryPolicy) Backoff(retry int) time.Duration {
	d := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(retry-1))
	if d > float64(p.MaxBackoff) {
		d = float64(p.MaxBackoff)
	}
	if p.Jitter > 0 {
		jitterRand.Lock()
		r := jitterRand.Float64()
		jitterRand.Unlock()
		d *= 1 + p.Jitter*(2*r-1)
	}
	return time.Duration(d)
}

// NewIdempotencyKey is a random key, "go-" and 32 hex digits (128 bits).
func NewIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("contextsidecar: crypto/rand failed: " + err.Error())
	}
	return "go-" + hex.EncodeToString(b[:])
}

// ---- per-call options ----------------------------------------------------------------------------

type timeoutOption struct {
	grpc.EmptyCallOption
	d time.Duration
}

type noRetryOption struct{ grpc.EmptyCallOption }

// Timeout is a CallOption: this call's deadline, retries included, instead of the client's
// default (WithTimeout). 0: none, only the context's.
func Timeout(d time.Duration) grpc.CallOption { return timeoutOption{d: d} }

// NoRetry is a CallOption: this call is tried once, whatever the method.
func NoRetry() grpc.CallOption { return noRetryOption{} }

// ---- which calls may be retried -------------------------------------------------------------------

// Kind is how a method may be retried.
type Kind int

const (
	// KindUnsafe: not known to be safe to repeat (a method of another service, or a write without an
	// idempotency_key field in a future proto); never retried.
	KindUnsafe Kind = iota
	// KindRead: no side effects; retried.
	KindRead
	// KindKeyedWrite: a write whose request has an idempotency_key; retried with the same key.
	KindKeyedWrite
)

var readPrefixes = []string{"Get", "List", "Search", "Query"}
var readMethods = map[string]bool{"BuildContext": true, "WaitForJobs": true}

var methodKinds = func() map[string]Kind {
	kinds := map[string]Kind{}
	methods := pb.File_context_sidecar_v1_context_service_proto.Services().ByName("ContextService").Methods()
	for i := 0; i < methods.Len(); i++ {
		m := methods.Get(i)
		name := string(m.Name())
		kind := KindUnsafe
		if fd := m.Input().Fields().ByName("idempotency_key"); fd != nil && fd.Kind() == protoreflect.StringKind {
			kind = KindKeyedWrite
		} else if readMethods[name] {
			kind = KindRead
		} else {
			for _, p := range readPrefixes {
				if strings.HasPrefix(name, p) {
					kind = KindRead
				}
			}
		}
		kinds["/"+ServiceName+"/"+name] = kind
	}
	return kinds
}()

// MethodKind says how the full method name ("/context_sidecar.v1.ContextService/AppendMessages")
// is retried.
func MethodKind(fullMethod string) Kind { return methodKinds[fullMethod] }

// IdempotencyKeyOf is the idempotency_key of a request ("" when it has none or no such field).
func IdempotencyKeyOf(req interface{}) string {
	m, ok := req.(proto.Message)
	if !ok {
		return ""
	}
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName("idempotency_key")
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return ""
	}
	return r.Get(fd).String()
}

// withKey returns req, or a copy of it with a fresh idempotency key when its key is empty, and
// whether what it returns carries a key (raw bytes, e.g. from a load generator, do not).
func withKey(req interface{}, newKey func() string) (interface{}, bool) {
	m, ok := req.(proto.Message)
	if !ok {
		return req, false
	}
	fd := m.ProtoReflect().Descriptor().Fields().ByName("idempotency_key")
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return req, false
	}
	if m.ProtoReflect().Get(fd).String() != "" {
		return req, true
	}
	cp := proto.Clone(m)
	cp.ProtoReflect().Set(fd, protoreflect.ValueOfString(newKey()))
	return cp, true
}

// ---- the interceptor --------------------------------------------------------------------------------

func (c *Client) intercept(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	timeout, retry := c.opts.timeout, true
	for _, o := range opts {
		switch o := o.(type) {
		case timeoutOption:
			timeout = o.d
		case noRetryOption:
			retry = false
		}
	}
	if c.opts.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.token)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	kind := methodKinds[method]
	if kind == KindKeyedWrite {
		var keyed bool
		// Once per logical call: every retry sends the same key.
		if req, keyed = withKey(req, c.opts.newKey); !keyed {
			kind = KindUnsafe // a write without a key is never repeated
		}
	}
	attempts := 1
	if retry && kind != KindUnsafe {
		attempts = c.opts.retry.MaxAttempts
	}
	for attempt := 1; ; attempt++ {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || attempt >= attempts || status.Code(err) != codes.Unavailable {
			return withAttempts(err, attempt)
		}
		wait := c.opts.retry.Backoff(attempt)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return withAttempts(err, attempt)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return withAttempts(err, attempt)
		case <-t.C:
		}
		if m, ok := reply.(proto.Message); ok {
			proto.Reset(m) // an attempt that failed after its answer arrived leaves nothing behind
		}
	}
}

// withAttempts keeps err's status (code and details) and says how many attempts were made.
func withAttempts(err error, attempts int) error {
	if err == nil || attempts == 1 {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	p := st.Proto()
	p.Message = p.Message + " (after " + strconv.Itoa(attempts) + " attempts)"
	return status.ErrorProto(p)
}
