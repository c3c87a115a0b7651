// Command sidecar-loadgen is a compiled load generator for one unary method of a gRPC server:
// -c concurrent callers send the same request for -duration (after -warmup, not counted) and it
// prints one JSON object:
//
//	{"load_generator":"go","method":"/context_sidecar.v1.ContextService/BuildContext","concurrency":8,
//	 "duration_s":10.0,"calls":41234,"errors":0,"error_codes":{},"throughput_rps":4123.4,
//	 "p50_ms":1.9,"p90_ms":2.3,"p99_ms":3.1,"mean_ms":1.94,"max_ms":12.0,"client_cpu_ms_per_call":0.05,...}
//
// calls counts the calls that ended inside the measured window, errors those of them that failed
// (error_codes by status code); throughput_rps and the latencies count only the calls that
// succeeded. Latency is the whole call as a client sees it: send, wait, receive and, with -decode
// (the default), parsing the answer into its message type.
//
// The request is a file: protojson (-format json, or a .json name) or the binary encoding. The
// method is a ContextService method's name ("BuildContext") or any full name
// ("/package.Service/Method", binary request, -decode=false unless it is in the sidecar's proto).
// Requests go out as pre-encoded bytes, so the client's own cost per call is small. Calls are not
// retried: an error is counted, not hidden.
//
// The same command measures the sidecar and a "floor" server that answers the same method with
// fixed bytes and does no work (bench/assembly.py --floor): only -addr differs. With -server-pid,
// the server's CPU per call in the window comes from /proc/<pid>/stat.
//
//	sidecar-loadgen -addr 127.0.0.1:50051 -request req.json -c 8 -duration 10s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"contextsidecar"
	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// rawCodec sends and receives pre-encoded bytes; "proto" is the content-subtype servers expect.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// Result is the JSON the command prints.
type Result struct {
	LoadGenerator      string         `json:"load_generator"`
	Addr               string         `json:"addr"`
	Method             string         `json:"method"`
	Concurrency        int            `json:"concurrency"`
	Conns              int            `json:"conns"`
	GoMaxProcs         int            `json:"gomaxprocs"`
	WarmupS            float64        `json:"warmup_s"`
	DurationS          float64        `json:"duration_s"`
	Calls              int            `json:"calls"`
	Errors             int            `json:"errors"`
	ErrorCodes         map[string]int `json:"error_codes"`
	FirstError         string         `json:"first_error,omitempty"`
	ThroughputRPS      float64        `json:"throughput_rps"`
	P50Ms              float64        `json:"p50_ms"`
	P90Ms              float64        `json:"p90_ms"`
	P99Ms              float64        `json:"p99_ms"`
	MeanMs             float64        `json:"mean_ms"`
	MaxMs              float64        `json:"max_ms"`
	RequestBytes       int            `json:"request_bytes"`
	ResponseBytes      int            `json:"response_bytes"`
	Decoded            bool           `json:"decoded"`
	ClientCPUMsPerCall float64        `json:"client_cpu_ms_per_call"`
	ServerCPUMsPerCall *float64       `json:"server_cpu_ms_per_call,omitempty"`
}

type worker struct {
	ok        []time.Duration
	errors    int
	codes     map[string]int
	firstErr  string
	respBytes int
}

func die(code int, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "sidecar-loadgen: "+format+"\n", args...)
	os.Exit(code)
}

// resolve turns "BuildContext" or "/pkg.Svc/Method" into the full name and, when the method is in
// the sidecar's proto, its request and response types.
func resolve(method string) (string, protoreflect.MessageType, protoreflect.MessageType) {
	full := method
	if !strings.HasPrefix(method, "/") {
		full = "/" + contextsidecar.ServiceName + "/" + method
	}
	parts := strings.Split(strings.TrimPrefix(full, "/"), "/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		die(2, "-method %q: expected a method name (BuildContext) or /package.Service/Method", method)
	}
	if parts[0] != contextsidecar.ServiceName {
		return full, nil, nil
	}
	md := pb.File_context_sidecar_v1_context_service_proto.Services().ByName("ContextService").Methods().
		ByName(protoreflect.Name(parts[1]))
	if md == nil {
		die(2, "-method %q: %s has no such method", method, contextsidecar.ServiceName)
	}
	in, err1 := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	out, err2 := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err1 != nil || err2 != nil {
		die(2, "types of %s not registered: %v %v", full, err1, err2)
	}
	return full, in, out
}

func loadRequest(path, format string, in protoreflect.MessageType) []byte {
	if path == "" {
		die(2, "-request FILE is required (protojson or binary %s)", "request")
	}
	data, err := ioutil.ReadFile(path)
	if err != nil {
		die(2, "-request: %v", err)
	}
	if format == "auto" {
		format = "binary"
		if strings.HasSuffix(strings.ToLower(path), ".json") {
			format = "json"
		}
	}
	switch format {
	case "json":
		if in == nil {
			die(2, "a JSON request needs a method of %s (its request type); give a binary request", contextsidecar.ServiceName)
		}
		m := in.New().Interface()
		if err := protojson.Unmarshal(data, m); err != nil {
			die(2, "-request %s is not a %s in protojson: %v", path, in.Descriptor().FullName(), err)
		}
		out, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			die(2, "encode the request: %v", err)
		}
		return out
	case "binary":
		if in != nil {
			if err := proto.Unmarshal(data, in.New().Interface()); err != nil {
				die(2, "-request %s is not a binary %s: %v", path, in.Descriptor().FullName(), err)
			}
		}
		return data
	default:
		die(2, "-format %q: expected auto, json or binary", format)
	}
	return nil
}

// cpuSeconds of a process from /proc/<pid>/stat (utime + stime, in USER_HZ = 100 ticks a second).
func cpuSeconds(pid int) (float64, error) {
	data, err := ioutil.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return (utime + stime) / 100, nil
}

func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// percentile: the nearest-rank value at q of sorted samples (bench/harness.py's rule).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)))
	if i > len(sorted)-1 {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Nanoseconds())/1e3) / 1e3 }

func main() {
	addr := flag.String("addr", "", "server address host:port (required)")
	method := flag.String("method", "BuildContext", "a ContextService method name, or /package.Service/Method")
	reqPath := flag.String("request", "", "the request: a protojson (.json) or binary file (required)")
	format := flag.String("format", "auto", "request format: auto (by the file name), json or binary")
	concurrency := flag.Int("c", 8, "concurrent callers")
	conns := flag.Int("conns", 1, "connections the callers share")
	duration := flag.Duration("duration", 10*time.Second, "measured time")
	warmup := flag.Duration("warmup", time.Second, "time before the measurement, not counted")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each call")
	token := flag.String("token", os.Getenv("SIDECAR_AUTH_TOKEN"), "bearer token (default $SIDECAR_AUTH_TOKEN)")
	decode := flag.Bool("decode", true, "parse each answer into the method's response type (a ContextService method)")
	health := flag.Bool("health", false, "wait for grpc.health.v1 SERVING first (a floor server has no health service)")
	serverPID := flag.Int("server-pid", 0, "the server's pid: its CPU per call from /proc/PID/stat")
	flag.Parse()
	if *addr == "" {
		die(2, "-addr is required")
	}
	if *concurrency < 1 || *conns < 1 || *duration <= 0 {
		die(2, "-c, -conns and -duration must be positive")
	}
	full, inType, outType := resolve(*method)
	reqBytes := loadRequest(*reqPath, *format, inType)
	if *decode && outType == nil {
		*decode = false
	}

	opts := []contextsidecar.Option{contextsidecar.WithToken(*token), contextsidecar.WithTimeout(*timeout),
		contextsidecar.WithDialTimeout(*timeout), contextsidecar.WithRetry(contextsidecar.RetryPolicy{MaxAttempts: 1})}
	if !*health {
		opts = append(opts, contextsidecar.SkipHealthWait())
	}
	clients := make([]*contextsidecar.Client, *conns)
	for i := range clients {
		// Distinct connections: grpc-go shares nothing between ClientConns.
		c, err := contextsidecar.Dial(context.Background(), *addr, opts...)
		if err != nil {
			die(2, "dial %s: %v", *addr, err)
		}
		defer c.Close()
		clients[i] = c
	}
	codec := grpc.ForceCodec(rawCodec{})

	// One probe call, waiting for the connection: a wrong address, method or request stops here.
	var probe []byte
	pctx, cancel := context.WithTimeout(context.Background(), *timeout)
	err := clients[0].Conn().Invoke(pctx, full, &reqBytes, &probe, codec, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		die(2, "probe call %s on %s failed: %s: %s", full, *addr, status.Code(err), status.Convert(err).Message())
	}
	if *decode {
		if err := proto.Unmarshal(probe, outType.New().Interface()); err != nil {
			die(2, "the answer of %s is not a %s: %v", full, outType.Descriptor().FullName(), err)
		}
	}

	start := time.Now()
	warmEnd := start.Add(*warmup)
	end := warmEnd.Add(*duration)
	workers := make([]*worker, *concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{codes: map[string]int{}}
		workers[i] = w
		wg.Add(1)
		go func(conn *grpc.ClientConn) {
			defer wg.Done()
			var resp []byte
			var msg proto.Message
			if *decode {
				msg = outType.New().Interface()
			}
			ctx := context.Background()
			for {
				t0 := time.Now()
				err := conn.Invoke(ctx, full, &reqBytes, &resp, codec)
				if err == nil && msg != nil {
					err = proto.Unmarshal(resp, msg)
				}
				t1 := time.Now()
				if t1.After(end) {
					return
				}
				if t1.Before(warmEnd) {
					continue
				}
				if err != nil {
					w.errors++
					w.codes[status.Code(err).String()]++
					if w.firstErr == "" {
						w.firstErr = err.Error()
					}
					if status.Code(err) == codes.Unavailable {
						time.Sleep(10 * time.Millisecond) // a server that is down: no busy loop
					}
					continue
				}
				w.ok = append(w.ok, t1.Sub(t0))
				w.respBytes = len(resp)
			}
		}(clients[i%len(clients)].Conn())
	}

	time.Sleep(time.Until(warmEnd))
	cpu0 := selfCPUSeconds()
	var srv0 float64
	if *serverPID > 0 {
		if srv0, err = cpuSeconds(*serverPID); err != nil {
			die(2, "-server-pid: %v", err)
		}
	}
	time.Sleep(time.Until(end))
	cpu1 := selfCPUSeconds()
	var srv1 float64
	if *serverPID > 0 {
		srv1, _ = cpuSeconds(*serverPID)
	}
	wg.Wait()

	res := Result{LoadGenerator: "go", Addr: *addr, Method: full, Concurrency: *concurrency, Conns: *conns,
		GoMaxProcs: runtime.GOMAXPROCS(0), WarmupS: warmup.Seconds(), DurationS: duration.Seconds(),
		ErrorCodes: map[string]int{}, RequestBytes: len(reqBytes), ResponseBytes: len(probe), Decoded: *decode}
	var all []time.Duration
	for _, w := range workers {
		all = append(all, w.ok...)
		res.Errors += w.errors
		for k, v := range w.codes {
			res.ErrorCodes[k] += v
		}
		if res.FirstError == "" {
			res.FirstError = w.firstErr
		}
		if w.respBytes > 0 {
			res.ResponseBytes = w.respBytes
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	res.Calls = len(all) + res.Errors
	res.ThroughputRPS = math.Round(float64(len(all))/duration.Seconds()*10) / 10
	if len(all) > 0 {
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		res.P50Ms, res.P90Ms, res.P99Ms = ms(percentile(all, 0.50)), ms(percentile(all, 0.90)), ms(percentile(all, 0.99))
		res.MeanMs, res.MaxMs = ms(sum/time.Duration(len(all))), ms(all[len(all)-1])
	}
	if res.Calls > 0 {
		res.ClientCPUMsPerCall = math.Round((cpu1-cpu0)*1e6/float64(res.Calls)) / 1e3
		if *serverPID > 0 {
			v := math.Round((srv1-srv0)*1e6/float64(res.Calls)) / 1e3
			res.ServerCPUMsPerCall = &v
		}
	}
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
	if len(all) == 0 {
		os.Exit(1)
	}
}
