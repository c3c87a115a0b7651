package dev.contextsidecar.client;

import dev.contextsidecar.v1.AppendMessagesRequest;
import dev.contextsidecar.v1.AppendMessagesResponse;
import dev.contextsidecar.v1.BuildContextRequest;
import dev.contextsidecar.v1.BuildContextResponse;
import dev.contextsidecar.v1.CommitTurnRequest;
import dev.contextsidecar.v1.CommitTurnResponse;
import dev.contextsidecar.v1.Message;
import dev.contextsidecar.v1.NewMessage;
import dev.contextsidecar.v1.RecordToolResultRequest;
import dev.contextsidecar.v1.Role;
import dev.contextsidecar.v1.Scope;
import dev.contextsidecar.v1.ToolCall;
import dev.contextsidecar.v1.ToolResultRef;
import dev.contextsidecar.v1.ToolStatus;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Objects;

/**
 * One agent turn in a session, in the order the sidecar expects:
 *
 * <pre>
 * client.startTurn(scope, sid, userText)   AppendMessages(user)
 *   turn.buildContext(template)            BuildContext (scope, session, query filled in)
 *   -- the model; it may ask for tools --
 *   turn.toolCalls(text, calls)            AppendMessages(assistant with tool_calls), optional
 *   turn.recordToolResult(...)             RecordToolResult, once per tool call
 *   turn.buildContext(template)            again, for the next model call, as often as needed
 *   turn.answer(text)                      AppendMessages(assistant)
 *   turn.commit()                          CommitTurn: memory extraction and summary as jobs
 * </pre>
 *
 * Every call goes through the {@link SidecarClient} (deadline, retries, idempotency keys, token).
 * The template requests may leave scope, session_id, run_id and (for BuildContext) query empty:
 * the turn fills them in. A Turn is not thread-safe; use one per turn.
 */
public final class Turn {
  private final SidecarClient client;
  private final Scope scope;
  private final String sessionId;
  private final String query;
  private final Message userMessage;
  private final List<String> messageIds = new ArrayList<>();
  private String runId = "";
  private BuildContextResponse lastContext;
  private CommitTurnResponse committed;

  private Turn(SidecarClient client, Scope scope, String sessionId, Message userMessage) {
    this.client = client;
    this.scope = scope;
    this.sessionId = sessionId;
    this.userMessage = userMessage;
    this.query = userMessage.getText();
    this.messageIds.add(userMessage.getMessageId());
  }

  static Turn start(SidecarClient client, Scope scope, String sessionId, NewMessage userMessage) {
    Objects.requireNonNull(scope, "scope");
    Objects.requireNonNull(sessionId, "sessionId");
    NewMessage m = userMessage.getRole() == Role.ROLE_UNSPECIFIED
        ? userMessage.toBuilder().setRole(Role.ROLE_USER).build() : userMessage;
    AppendMessagesResponse r = client.appendMessages(AppendMessagesRequest.newBuilder()
        .setScope(scope).setSessionId(sessionId).addMessages(m).build());
    return new Turn(client, scope, sessionId, r.getMessages(0));
  }

  /** Ties BuildContext and RecordToolResult of this turn to a run (StartRun); "" for none. */
  public Turn inRun(String runId) {
    this.runId = runId == null ? "" : runId;
    return this;
  }

  public Scope scope() {
    return scope;
  }

  public String sessionId() {
    return sessionId;
  }

  public String runId() {
    return runId;
  }

  /** The user's message as stored (its id is the source tag "message:&lt;id&gt;"). */
  public Message userMessage() {
    return userMessage;
  }

  /** The ids of the messages this turn appended, in order. */
  public List<String> messageIds() {
    return Collections.unmodifiableList(messageIds);
  }

  /** The answer of the last {@link #buildContext} call, or null. */
  public BuildContextResponse lastContext() {
    return lastContext;
  }

  /**
   * BuildContext for the next model call. {@code template} carries what the turn cannot know
   * (system_rules, tools, render, budget, roles, ...); scope, session_id, run_id and query are
   * filled in where empty (query: the user's text).
   */
  public BuildContextResponse buildContext(BuildContextRequest template) {
    BuildContextRequest.Builder b = template.toBuilder();
    if (!b.hasScope()) {
      b.setScope(scope);
    }
    if (b.getSessionId().isEmpty()) {
      b.setSessionId(sessionId);
    }
    if (b.getRunId().isEmpty()) {
      b.setRunId(runId);
    }
    if (b.getQuery().isEmpty()) {
      b.setQuery(query);
    }
    lastContext = client.buildContext(b.build());
    return lastContext;
  }

  /** {@link #buildContext(BuildContextRequest)} from a builder. */
  public BuildContextResponse buildContext(BuildContextRequest.Builder template) {
    return buildContext(template.build());
  }

  /**
   * Appends the model's assistant message that calls tools (before their results, so that
   * provider renderings pair each call with its result). Returns it as stored.
   */
  public Message toolCalls(String text, List<ToolCall> calls) {
    return append(NewMessage.newBuilder().setRole(Role.ROLE_ASSISTANT).setText(text == null ? "" : text)
        .addAllToolCalls(calls).build()).get(0);
  }

  /** Stores a tool's whole output; later prompts show a trimmed view of it. */
  public ToolResultRef recordToolResult(String toolName, String callId, String fullText, ToolStatus status) {
    return recordToolResult(RecordToolResultRequest.newBuilder().setToolName(toolName)
        .setCallId(callId == null ? "" : callId).setFullText(fullText).setStatus(status).build());
  }

  /** RecordToolResult with scope, session_id and run_id filled in where empty. */
  public ToolResultRef recordToolResult(RecordToolResultRequest template) {
    RecordToolResultRequest.Builder b = template.toBuilder();
    if (!b.hasScope()) {
      b.setScope(scope);
    }
    if (b.getSessionId().isEmpty()) {
      b.setSessionId(sessionId);
    }
    if (b.getRunId().isEmpty()) {
      b.setRunId(runId);
    }
    return client.recordToolResult(b.build());
  }

  /** Appends the model's answer (ROLE_ASSISTANT); returns it as stored. */
  public Message answer(String text) {
    return answer(NewMessage.newBuilder().setText(text).build());
  }

  /** Appends the answer as a whole message; an unset role becomes ROLE_ASSISTANT. */
  public Message answer(NewMessage message) {
    NewMessage m = message.getRole() == Role.ROLE_UNSPECIFIED
        ? message.toBuilder().setRole(Role.ROLE_ASSISTANT).build() : message;
    return append(m).get(0);
  }

  /** Appends messages of any role to the turn, atomically; returns them as stored. */
  public List<Message> append(NewMessage... messages) {
    AppendMessagesRequest.Builder b = AppendMessagesRequest.newBuilder().setScope(scope).setSessionId(sessionId);
    for (NewMessage m : messages) {
      b.addMessages(m);
    }
    List<Message> stored = client.appendMessages(b.build()).getMessagesList();
    for (Message m : stored) {
      messageIds.add(m.getMessageId());
    }
    return stored;
  }

  /**
   * CommitTurn: hands the session's uncommitted messages (this turn's, and tool messages the
   * sidecar stored for it) to the after-turn jobs and returns at once with their ids; wait for
   * them with {@code client.waitForJobs}. A second call returns the first answer.
   */
  public CommitTurnResponse commit() {
    if (committed == null) {
      committed = client.commitTurn(CommitTurnRequest.newBuilder().setScope(scope).setSessionId(sessionId).build());
    }
    return committed;
  }
}
