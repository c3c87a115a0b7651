// Package contextsidecar is a thin Go client of the Context Sidecar
// (proto/context_sidecar/v1/context_service.proto).
//
// The generated stubs live in contextsidecar/gen/contextsidecarv1 (imported as pb below); they are
// generated from the proto by clients/go/build.sh and never committed, so they cannot go stale.
// The Client embeds pb.ContextServiceClient, so every RPC of the proto is a method of the Client,
// and adds, for every call:
//
//   - a deadline: WithTimeout sets the default (10 s), Timeout(d) one call's; a deadline already on
//     the caller's context is kept when it is earlier. It bounds the whole call, retries included;
//   - the bearer token (WithToken): metadata "authorization: Bearer <token>", what the sidecar's
//     --auth-token / SIDECAR_AUTH_TOKEN expects (health checks need none);
//   - retries on UNAVAILABLE with exponential backoff and jitter (WithRetry), only for calls that
//     are safe to repeat: reads (Get*, List*, Search*, Query*, BuildContext, WaitForJobs) and
//     writes whose request has an idempotency_key field, which is every write of the proto. A
//     write whose key is empty gets a random one ("go-" + 32 hex digits) before its first attempt,
//     on a copy of the request (the caller's message is never changed), and every retry of that
//     logical call sends the same key, so the sidecar answers a retry of a write that already
//     happened with the first answer and writes nothing twice. A key the caller set is kept as is.
//     Any other status (NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION, ...) is returned at once;
//     NoRetry() turns retries off for one call.
//
// Errors are gRPC status errors: status.Code(err) == codes.NotFound and so on. After retries the
// last attempt's status is returned, its message suffixed with "(after N attempts)".
//
// Dial waits until the sidecar's grpc.health.v1 service says SERVING (SkipHealthWait turns this
// off), so a service that starts next to its sidecar can dial at once.
//
//	c, err := contextsidecar.Dial(ctx, "127.0.0.1:50051", contextsidecar.WithToken(token))
//	if err != nil { ... }
//	defer c.Close()
//	scope := &pb.Scope{TenantId: "acme", UserId: "alice"}
//	turn, err := c.StartTurn(ctx, scope, sessionID, userText)          // AppendMessages(user)
//	bc, err := turn.BuildContext(ctx, &pb.BuildContextRequest{SystemRules: rules, Tools: tools,
//		Render: pb.RenderMode_RENDER_MODE_CHAT})                        // scope, session, query filled in
//	// ... the model runs on bc.GetChatMessages(), asks for a tool ...
//	ref, err := turn.RecordToolResult(ctx, &pb.RecordToolResultRequest{ToolName: "query_logs",
//		CallId: "call-1", FullText: output, Status: pb.ToolStatus_TOOL_STATUS_OK})
//	_, err = turn.Answer(ctx, answerText)                               // AppendMessages(assistant)
//	commit, err := turn.Commit(ctx)                                     // CommitTurn
//
// The package builds in GOPATH mode against Debian's grpc-go 1.33 (see clients/README.md).
package contextsidecar
