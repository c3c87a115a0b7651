package contextsidecar

import (
	"context"
	"fmt"
	"time"

	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// ServiceName is the full name of the sidecar's gRPC service, also the name its health service
// reports on.
const ServiceName = "context_sidecar.v1.ContextService"

// MaxMessageBytes is the largest request or response frame the sidecar accepts or sends (32 MiB):
// documents go up to 16 MiB and tool results up to 8 MiB.
const MaxMessageBytes = 32 << 20

const (
	defaultTimeout     = 10 * time.Second
	defaultDialTimeout = 10 * time.Second
)

// Client is a connection to one sidecar. It is safe for concurrent use; make one per process.
// Every RPC of the proto is a method of it (the embedded pb.ContextServiceClient), with the
// deadline, token and retry behaviour of the package doc.
type Client struct {
	pb.ContextServiceClient
	conn *grpc.ClientConn
	addr string
	opts options
}

type options struct {
	token       string
	timeout     time.Duration
	dialTimeout time.Duration
	healthWait  bool
	retry       RetryPolicy
	creds       credentials.TransportCredentials
	dialOpts    []grpc.DialOption
	attempt     []grpc.UnaryClientInterceptor
	newKey      func() string
}

// Option configures Dial.
type Option func(*options)

// WithToken sends "authorization: Bearer <token>" on every call (the sidecar's --auth-token).
// An empty token sends nothing.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTimeout sets the default deadline of each call, retries included (default 10 s; 0: none,
// only the caller's context bounds a call). Timeout(d) overrides it for one call.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithDialTimeout bounds Dial's wait for a healthy sidecar when the context given to Dial has no
// deadline (default 10 s).
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// SkipHealthWait makes Dial return at once, without waiting for the health service to say
// SERVING (the connection is then made by the first call). Use it for servers without a
// grpc.health.v1 service.
func SkipHealthWait() Option { return func(o *options) { o.healthWait = false } }

// WithRetry sets the retry policy (DefaultRetryPolicy otherwise). MaxAttempts 1 turns retries off.
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p.withDefaults() } }

// WithTLS uses these transport credentials instead of plaintext (the sidecar's --tls-cert/--tls-key).
func WithTLS(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithDialOptions adds grpc.DialOptions (keepalive, connect backoff, a balancer, ...). An
// interceptor given here with grpc.WithUnaryInterceptor wraps whole calls, retries included.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithAttemptInterceptor adds an interceptor that runs around each attempt of a call, inside the
// retry loop (metrics per attempt, fault injection in tests). It sees the request with its
// idempotency key set.
func WithAttemptInterceptor(i grpc.UnaryClientInterceptor) Option {
	return func(o *options) { o.attempt = append(o.attempt, i) }
}

// WithIdempotencyKeys replaces the generator of the keys that writes without one get (default:
// NewIdempotencyKey). Keys are at most 128 characters.
func WithIdempotencyKeys(gen func() string) Option { return func(o *options) { o.newKey = gen } }

func newOptions(opts []Option) options {
	o := options{timeout: defaultTimeout, dialTimeout: defaultDialTimeout, healthWait: true,
		retry: DefaultRetryPolicy(), newKey: NewIdempotencyKey}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Dial connects to the sidecar at addr ("host:port", "unix:/path", or any gRPC target) and, unless
// SkipHealthWait is given, waits until its health service says SERVING: until ctx is done or, when
// ctx has no deadline, WithDialTimeout (10 s). A sidecar that never gets healthy is an error with
// code Unavailable (DeadlineExceeded when ctx ran out first).
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := newOptions(opts)
	c := &Client{addr: addr, opts: o}
	dopts := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(append([]grpc.UnaryClientInterceptor{c.intercept}, o.attempt...)...),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}
	if o.creds != nil {
		dopts = append(dopts, grpc.WithTransportCredentials(o.creds))
	} else {
		dopts = append(dopts, grpc.WithInsecure())
	}
	// grpc-go 1.33 has no grpc.NewClient: DialContext without WithBlock returns at once and
	// connects in the background; the health wait below is what blocks.
	conn, err := grpc.DialContext(ctx, addr, append(dopts, o.dialOpts...)...)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.ContextServiceClient = pb.NewContextServiceClient(conn)
	if o.healthWait {
		wctx := ctx
		if _, ok := ctx.Deadline(); !ok && o.dialTimeout > 0 {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, o.dialTimeout)
			defer cancel()
		}
		if err := c.WaitHealthy(wctx); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return c, nil
}

// Conn is the underlying connection (for other services on the same server, or raw Invoke calls;
// they go through the same deadline, token and retry interceptor).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// WaitHealthy polls grpc.health.v1 Check for ServiceName until it says SERVING or ctx is done. A
// server without a health service is an error at once (code Unimplemented).
func (c *Client) WaitHealthy(ctx context.Context) error {
	hc := healthpb.NewHealthClient(c.conn)
	backoff := 20 * time.Millisecond
	var last error
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := hc.Check(attempt, &healthpb.HealthCheckRequest{Service: ServiceName}, grpc.WaitForReady(true))
		cancel()
		switch {
		case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return nil
		case err == nil:
			last = fmt.Errorf("health says %s", resp.GetStatus())
		case status.Code(err) == codes.Unimplemented:
			return status.Errorf(codes.Unimplemented, "%s has no grpc.health.v1 service (%s); dial it with SkipHealthWait()",
				c.addr, status.Convert(err).Message())
		default:
			last = err
		}
		select {
		case <-ctx.Done():
			code := codes.Unavailable
			if ctx.Err() == context.DeadlineExceeded {
				code = codes.DeadlineExceeded
			}
			return status.Errorf(code, "sidecar at %s is not healthy (%v); last check: %v", c.addr, ctx.Err(), last)
		case <-time.After(backoff):
		}
		if backoff *= 2; backoff > 500*time.Millisecond {
			backoff = 500 * time.Millisecond
		}
	}
}

// WaitJobs waits until the jobs (all of the scope's unfinished jobs when none are named) are DONE
// or FAILED, or until timeout (at most 120 s) passes on the sidecar's side; the call's deadline is
// the timeout plus 5 s, so the client does not give up first. AllFinished in the answer says which.
func (c *Client) WaitJobs(ctx context.Context, scope *pb.Scope, timeout time.Duration, jobIDs ...string) (*pb.WaitForJobsResponse, error) {
	return c.WaitForJobs(ctx, &pb.WaitForJobsRequest{Scope: scope, JobIds: jobIDs, TimeoutMs: int32(timeout / time.Millisecond)},
		Timeout(timeout+5*time.Second))
}
