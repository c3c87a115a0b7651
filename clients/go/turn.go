package contextsidecar

import (
	"context"

	pb "contextsidecar/gen/contextsidecarv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Turn is one agent turn in a session:
//
//	StartTurn (AppendMessages: the user's message) -> BuildContext (the prompt, as often as the
//	model loop needs it) -> RecordToolResult (each tool's whole output) -> Answer (AppendMessages:
//	the model's answer) -> Commit (CommitTurn: memory extraction and the summary, as jobs)
//
// Each step is one call with the client's deadline, token and retries; each write carries its own
// idempotency key, so a retried step is stored once. A Turn is not safe for concurrent use.
type Turn struct {
	c *Client
	// Scope and SessionID say whose session this is.
	Scope     *pb.Scope
	SessionID string
	// Query is the user's message text: the default query of BuildContext.
	Query string
	// UserMessage is the stored user message; AnswerMessage the stored answer, once Answer ran.
	UserMessage   *pb.Message
	AnswerMessage *pb.Message
	// ToolResults are the references RecordToolResult returned, in order.
	ToolResults []*pb.ToolResultRef
}

// StartTurn appends the user's message to the session and returns the turn.
func (c *Client) StartTurn(ctx context.Context, scope *pb.Scope, sessionID, userText string, opts ...grpc.CallOption) (*Turn, error) {
	t := &Turn{c: c, Scope: scope, SessionID: sessionID, Query: userText}
	msg, err := t.append(ctx, &pb.NewMessage{Role: pb.Role_ROLE_USER, Text: userText}, opts)
	if err != nil {
		return nil, err
	}
	t.UserMessage = msg
	return t, nil
}

// Turn resumes a turn whose user message is already stored (e.g. after a restart).
func (c *Client) Turn(scope *pb.Scope, sessionID, query string, userMessage *pb.Message) *Turn {
	return &Turn{c: c, Scope: scope, SessionID: sessionID, Query: query, UserMessage: userMessage}
}

func (t *Turn) append(ctx context.Context, m *pb.NewMessage, opts []grpc.CallOption) (*pb.Message, error) {
	resp, err := t.c.AppendMessages(ctx, &pb.AppendMessagesRequest{Scope: t.Scope, SessionId: t.SessionID,
		Messages: []*pb.NewMessage{m}}, opts...)
	if err != nil {
		return nil, err
	}
	if len(resp.GetMessages()) != 1 {
		return nil, status.Errorf(codes.Internal, "AppendMessages stored %d messages for 1", len(resp.GetMessages()))
	}
	return resp.GetMessages()[0], nil
}

// BuildContext assembles the prompt for the next model call. req holds what the turn does not know
// (system rules, tools, budget, render mode, ...); its scope, session and query, when empty, are
// the turn's. req itself is not changed; nil is an empty request.
func (t *Turn) BuildContext(ctx context.Context, req *pb.BuildContextRequest, opts ...grpc.CallOption) (*pb.BuildContextResponse, error) {
	r := &pb.BuildContextRequest{}
	if req != nil {
		r = proto.Clone(req).(*pb.BuildContextRequest)
	}
	if r.Scope == nil {
		r.Scope = t.Scope
	}
	if r.SessionId == "" {
		r.SessionId = t.SessionID
	}
	if r.Query == "" {
		r.Query = t.Query
	}
	return t.c.BuildContext(ctx, r, opts...)
}

// RecordToolResult stores a tool's whole output (later prompts show a trimmed view of it). The
// request's scope and session, when empty, are the turn's; req is not changed.
func (t *Turn) RecordToolResult(ctx context.Context, req *pb.RecordToolResultRequest, opts ...grpc.CallOption) (*pb.ToolResultRef, error) {
	r := proto.Clone(req).(*pb.RecordToolResultRequest)
	if r.Scope == nil {
		r.Scope = t.Scope
	}
	if r.SessionId == "" {
		r.SessionId = t.SessionID
	}
	ref, err := t.c.RecordToolResult(ctx, r, opts...)
	if err != nil {
		return nil, err
	}
	t.ToolResults = append(t.ToolResults, ref)
	return ref, nil
}

// Answer appends the model's answer to the session.
func (t *Turn) Answer(ctx context.Context, text string, opts ...grpc.CallOption) (*pb.Message, error) {
	msg, err := t.append(ctx, &pb.NewMessage{Role: pb.Role_ROLE_ASSISTANT, Text: text}, opts)
	if err != nil {
		return nil, err
	}
	t.AnswerMessage = msg
	return msg, nil
}

// AnswerMessageWith appends an answer given as a whole message (tool calls, speaker, ...); its role
// is ROLE_ASSISTANT when unset. m is not changed.
func (t *Turn) AnswerMessageWith(ctx context.Context, m *pb.NewMessage, opts ...grpc.CallOption) (*pb.Message, error) {
	cp := proto.Clone(m).(*pb.NewMessage)
	if cp.Role == pb.Role_ROLE_UNSPECIFIED {
		cp.Role = pb.Role_ROLE_ASSISTANT
	}
	msg, err := t.append(ctx, cp, opts)
	if err != nil {
		return nil, err
	}
	t.AnswerMessage = msg
	return msg, nil
}

// Commit hands the finished turn to the sidecar's background jobs (memory extraction, the rolling
// summary) and returns their ids at once; Client.WaitJobs waits for them.
func (t *Turn) Commit(ctx context.Context, opts ...grpc.CallOption) (*pb.CommitTurnResponse, error) {
	return t.c.CommitTurn(ctx, &pb.CommitTurnRequest{Scope: t.Scope, SessionId: t.SessionID}, opts...)
}
