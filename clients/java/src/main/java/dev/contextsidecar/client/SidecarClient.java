package dev.contextsidecar.client;

import com.google.protobuf.Descriptors.FieldDescriptor;
import dev.contextsidecar.v1.*;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ConnectivityState;
import io.grpc.Deadline;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * A thin client of the Context Sidecar's {@code ContextService} over the generated gRPC stubs
 * ({@code dev.contextsidecar.v1}). One method per RPC, taking and returning the generated messages;
 * what it adds to a bare blocking stub:
 *
 * <ul>
 *   <li><b>Connect with a health wait</b>: {@link Builder#connect()} polls
 *       {@code grpc.health.v1.Health/Check} for {@code context_sidecar.v1.ContextService} until it is
 *       SERVING (or {@link Builder#healthTimeout} passes: {@code UNAVAILABLE}).
 *   <li><b>A deadline on every call</b> ({@link Builder#timeout}, default 10 s; per call:
 *       {@link #withTimeout}). It bounds the whole logical call, retries and backoff included.
 *   <li><b>Retries on UNAVAILABLE</b> with exponential backoff and jitter ({@link RetryPolicy}),
 *       only where a repeat is safe: reads (Get*, List*, Search*, BuildContext, WaitForJobs,
 *       QueryGraph) and writes that carry an {@code idempotency_key}. Every write request has that
 *       field; when it is empty the client sets a random key per logical call and sends the same
 *       key on each retry, so the sidecar answers a retry with the first answer and writes nothing
 *       twice. A key you set yourself is kept. Other failures (NOT_FOUND, INVALID_ARGUMENT, ...) are
 *       thrown at once as {@link StatusRuntimeException}.
 *   <li><b>The auth token</b>: {@code authorization: Bearer <token>} on every call
 *       ({@link Builder#authToken}).
 *   <li><b>A turn helper</b>: {@link #startTurn} (append the user message, then BuildContext, tool
 *       results, the answer, CommitTurn): see {@link Turn}.
 * </ul>
 *
 * <pre>{@code
 * try (SidecarClient cs = SidecarClient.builder("127.0.0.1:50051").authToken(token).connect()) {
 *   Scope scope = SidecarClient.scope("acme", "alice");
 *   String sid = cs.createSession(CreateSessionRequest.newBuilder().setScope(scope).build()).getSessionId();
 *   Turn turn = cs.startTurn(scope, sid, userText);
 *   BuildContextResponse ctx = turn.buildContext(BuildContextRequest.newBuilder()
 *       .setSystemRules("You are an SRE.").setRender(RenderMode.RENDER_MODE_CHAT));
 *   // ... the model and its tools ...
 *   turn.recordToolResult("query_logs", "call-1", logs, ToolStatus.TOOL_STATUS_OK);
 *   turn.answer(answerText);
 *   turn.commit();
 * }
 * }</pre>
 *
 * <p>Thread-safe; make one per process and share it. {@link #withTimeout} and
 * {@link #withRetryPolicy} return views that share the channel; {@link #close()} on any of them
 * shuts down a channel the client created (not one passed to {@link #builder(Channel)}).
 */
public final class SidecarClient implements AutoCloseable {
  /** The version of this library (and of its Maven artifact). */
  public static final String VERSION = "0.1.0";
  /** The service name the health wait asks about. */
  public static final String SERVICE_NAME = ContextServiceGrpc.SERVICE_NAME;
  /** The largest frame the sidecar sends or accepts (32 MiB); gRPC's own default is 4 MiB. */
  public static final int MAX_MESSAGE_BYTES = 32 * 1024 * 1024;
  /** Extra deadline a WaitForJobs call gets beyond the wait it asks the sidecar for. */
  static final Duration WAIT_SLACK = Duration.ofSeconds(5);
  /** How often the health wait asks again. */
  private static final long HEALTH_POLL_MS = 200;

  /** The RPCs that only read: retried on a retryable status without any key. */
  static final Set<String> READ_METHODS = Collections.unmodifiableSet(new HashSet<>(Arrays.asList(
      "GetSession", "ListSessions", "ListMessages", "ListPinned", "GetSessionState", "GetFactHistory",
      "GetRun", "GetToolResult", "ListRunNotes", "BuildContext", "GetJobStatus", "WaitForJobs",
      "SearchMemories", "ListMemories", "GetMemoryHistory", "ListDocuments", "ListDocumentVersions",
      "SearchKnowledge", "QueryGraph")));

  private static final String KEY_FIELD = "idempotency_key";

  /** What the views of one client share. */
  private static final class Shared {
    final String target;
    final Channel channel;            // with the auth and user interceptors
    final ManagedChannel managed;     // the channel underneath, when there is one (for health / close)
    final boolean owned;
    final boolean autoKeys;
    final Supplier<String> keys;

    Shared(String target, Channel channel, ManagedChannel managed, boolean owned, boolean autoKeys,
        Supplier<String> keys) {
      this.target = target;
      this.channel = channel;
      this.managed = managed;
      this.owned = owned;
      this.autoKeys = autoKeys;
      this.keys = keys;
    }
  }

  private final Shared shared;
  private final Duration timeout;
  private final RetryPolicy retry;

  private SidecarClient(Shared shared, Duration timeout, RetryPolicy retry) {
    this.shared = shared;
    this.timeout = timeout;
    this.retry = retry;
  }

  /** A builder for a client of the sidecar at {@code target} ("host:port", or any gRPC target). */
  public static Builder builder(String target) {
    return new Builder(Objects.requireNonNull(target, "target"), null);
  }

  /**
   * A builder for a client over a channel you made and own (TLS, a name resolver, ...): the client
   * never shuts it down. With a {@link ManagedChannel} the health wait can also reset its
   * reconnect backoff.
   */
  public static Builder builder(Channel channel) {
    return new Builder(channel.authority(), Objects.requireNonNull(channel, "channel"));
  }

  /** {@code Scope{tenant_id, user_id}}, which every request carries. */
  public static Scope scope(String tenantId, String userId) {
    return Scope.newBuilder().setTenantId(tenantId).setUserId(userId).build();
  }

  /** A view of this client whose calls get {@code timeout} as their deadline. */
  public SidecarClient withTimeout(Duration timeout) {
    return new SidecarClient(shared, positive(timeout, "timeout"), retry);
  }

  /** A view of this client that retries by {@code policy} ({@link RetryPolicy#none()}: never). */
  public SidecarClient withRetryPolicy(RetryPolicy policy) {
    return new SidecarClient(shared, timeout, Objects.requireNonNull(policy, "policy"));
  }

  public Duration timeout() {
    return timeout;
  }

  public RetryPolicy retryPolicy() {
    return retry;
  }

  /** The target it was built for ("host:port"), or the given channel's authority. */
  public String target() {
    return shared.target;
  }

  /**
   * The channel the calls go through, with the auth token and your interceptors: for stubs of
   * your own ({@code ContextServiceGrpc.newFutureStub(client.channel())}), which get none of this
   * client's deadlines or retries.
   */
  public Channel channel() {
    return shared.channel;
  }

  /**
   * Waits until the sidecar's health service says SERVING for {@link #SERVICE_NAME}, polling
   * {@code grpc.health.v1.Health/Check}. Throws {@code UNAVAILABLE} naming the last answer when
   * {@code timeout} passes first, and {@code CANCELLED} when the thread is interrupted.
   */
  public void awaitHealthy(Duration timeout) {
    Deadline deadline = Deadline.after(positive(timeout, "timeout").toNanos(), TimeUnit.NANOSECONDS);
    String last = "no answer yet";
    while (true) {
      long leftMs = deadline.timeRemaining(TimeUnit.MILLISECONDS);
      if (leftMs <= 0) {
        throw Status.UNAVAILABLE.withDescription("the sidecar at " + shared.target + " is not SERVING after "
            + timeout.toMillis() + " ms (last: " + last + ")").asRuntimeException();
      }
      if (shared.managed != null
          && shared.managed.getState(true) == ConnectivityState.TRANSIENT_FAILURE) {
        shared.managed.resetConnectBackoff();  // reconnect now, not after gRPC's own backoff (up to 2 min)
      }
      try {
        // Fail-fast (no wait-for-ready): a refused connection answers UNAVAILABLE at once, and the
        // loop polls again after a short sleep.
        int status = ClientCalls.blockingUnaryCall(shared.channel, HealthCheck.CHECK,
            CallOptions.DEFAULT.withDeadlineAfter(Math.min(leftMs, 1000), TimeUnit.MILLISECONDS), SERVICE_NAME);
        if (status == HealthCheck.SERVING) {
          return;
        }
        last = HealthCheck.statusName(status);
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() == Status.Code.CANCELLED && Thread.currentThread().isInterrupted()) {
          throw e;
        }
        last = e.getStatus().getCode() + (e.getStatus().getDescription() == null ? ""
            : ": " + e.getStatus().getDescription());
        if (e.getStatus().getCode() == Status.Code.UNIMPLEMENTED) {
          throw Status.FAILED_PRECONDITION.withDescription(shared.target
              + " has no grpc.health.v1 service: is it a Context Sidecar?").withCause(e).asRuntimeException();
        }
      }
      sleepNanos(TimeUnit.MILLISECONDS.toNanos(Math.min(HEALTH_POLL_MS, Math.max(1, deadline.timeRemaining(TimeUnit.MILLISECONDS)))));
    }
  }

  /**
   * Starts a turn: appends the user's message to the session and returns the {@link Turn} that
   * carries the rest (BuildContext, tool results, the answer, CommitTurn).
   */
  public Turn startTurn(Scope scope, String sessionId, String userText) {
    return startTurn(scope, sessionId, NewMessage.newBuilder().setRole(Role.ROLE_USER).setText(userText).build());
  }

  /** {@link #startTurn(Scope, String, String)} with a whole message (speaker, timestamp, ...). */
  public Turn startTurn(Scope scope, String sessionId, NewMessage userMessage) {
    return Turn.start(this, scope, sessionId, userMessage);
  }

  /**
   * Calls any unary RPC of the sidecar with this client's deadline, retries, idempotency keys and
   * token: {@code client.call(ContextServiceGrpc.getGetSessionMethod(), request)}. The typed methods
   * below are this; it also reaches RPCs newer than them.
   */
  public <Req extends com.google.protobuf.Message, Resp> Resp call(MethodDescriptor<Req, Resp> method, Req request) {
    Objects.requireNonNull(method, "method");
    Objects.requireNonNull(request, "request");
    boolean retryable;
    FieldDescriptor keyField = request.getDescriptorForType().findFieldByName(KEY_FIELD);
    if (keyField != null && keyField.getJavaType() == FieldDescriptor.JavaType.STRING && !keyField.isRepeated()) {
      String key = (String) request.getField(keyField);
      if (key.isEmpty() && shared.autoKeys) {
        key = shared.keys.get();
        @SuppressWarnings("unchecked")
        Req keyed = (Req) request.toBuilder().setField(keyField, key).build();
        request = keyed;
      }
      retryable = !key.isEmpty();
    } else {
      retryable = READ_METHODS.contains(method.getBareMethodName());
    }
    Deadline deadline = Deadline.after(timeout.toNanos(), TimeUnit.NANOSECONDS);
    CallOptions options = CallOptions.DEFAULT.withDeadline(deadline);
    for (int attempt = 1; ; attempt++) {
      try {
        return ClientCalls.blockingUnaryCall(shared.channel, method, options, request);
      } catch (StatusRuntimeException e) {
        if (!retryable || attempt >= retry.maxAttempts() || !retry.retries(e.getStatus().getCode())) {
          throw e;
        }
        long backoff = retry.backoffNanos(attempt);
        if (deadline.timeRemaining(TimeUnit.NANOSECONDS) <= backoff) {
          throw e;  // the retry could not finish in time: the caller sees the real failure
        }
        sleepNanos(backoff);
      }
    }
  }

  /** Shuts down the channel if this client created it, waiting up to 5 s for calls in flight. */
  @Override
  public void close() {
    if (!shared.owned || shared.managed == null) {
      return;
    }
    shared.managed.shutdown();
    try {
      if (!shared.managed.awaitTermination(5, TimeUnit.SECONDS)) {
        shared.managed.shutdownNow();
      }
    } catch (InterruptedException e) {
      shared.managed.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  private static void sleepNanos(long nanos) {
    try {
      TimeUnit.NANOSECONDS.sleep(nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw Status.CANCELLED.withDescription("interrupted").withCause(e).asRuntimeException();
    }
  }

  private static Duration positive(Duration d, String what) {
    if (d == null || d.isNegative() || d.isZero()) {
      throw new IllegalArgumentException(what + " must be > 0, got " + d);
    }
    return d;
  }

  /** Builds a {@link SidecarClient}. */
  public static final class Builder {
    private final String target;
    private final Channel channel;
    private Supplier<String> token;
    private Duration timeout = Duration.ofSeconds(10);
    private Duration healthTimeout = Duration.ofSeconds(10);
    private RetryPolicy retry = RetryPolicy.defaults();
    private final List<ClientInterceptor> interceptors = new ArrayList<>();
    private boolean autoKeys = true;
    private Supplier<String> keys = () -> "java-" + UUID.randomUUID();
    private boolean plaintext = true;

    private Builder(String target, Channel channel) {
      this.target = target;
      this.channel = channel;
    }

    /** Sends {@code authorization: Bearer <token>} on every call; null or "" sends none. */
    public Builder authToken(String token) {
      this.token = token == null || token.isEmpty() ? null : () -> token;
      return this;
    }

    /** The token read per call (a rotated, mounted Secret); null or "" from it sends none. */
    public Builder authToken(Supplier<String> token) {
      this.token = token;
      return this;
    }

    /** The deadline of each logical call, its retries included (default 10 s). */
    public Builder timeout(Duration timeout) {
      this.timeout = positive(timeout, "timeout");
      return this;
    }

    /** How long {@link #connect()} waits for the sidecar to be SERVING (default 10 s). */
    public Builder healthTimeout(Duration healthTimeout) {
      this.healthTimeout = positive(healthTimeout, "healthTimeout");
      return this;
    }

    /** The retry policy (default {@link RetryPolicy#defaults()}). */
    public Builder retryPolicy(RetryPolicy retry) {
      this.retry = Objects.requireNonNull(retry, "retry");
      return this;
    }

    /**
     * Adds an interceptor (tracing, logging, ...); it sees every attempt, retries included. The
     * first one added is the outermost; all run outside the token's, so none sees the
     * authorization header.
     */
    public Builder intercept(ClientInterceptor... interceptors) {
      this.interceptors.addAll(Arrays.asList(interceptors));
      return this;
    }

    /**
     * Whether writes without an idempotency_key get a random one per logical call (default true).
     * With false, such writes are never retried: a lost answer would otherwise write twice.
     */
    public Builder autoIdempotencyKeys(boolean on) {
      this.autoKeys = on;
      return this;
    }

    /** Where the random idempotency keys come from (default "java-" + a random UUID). */
    public Builder idempotencyKeys(Supplier<String> keys) {
      this.keys = Objects.requireNonNull(keys, "keys");
      return this;
    }

    /**
     * TLS instead of plaintext (for a sidecar started with --tls-cert). Needs an ALPN-capable
     * netty (netty-tcnative); Debian's netty has none, so there build your own channel.
     */
    public Builder useTransportSecurity() {
      this.plaintext = false;
      return this;
    }

    /** The client, without waiting for the sidecar: the first call fails fast if it is down. */
    public SidecarClient build() {
      ManagedChannel managed;
      boolean owned;
      Channel base;
      if (channel != null) {
        managed = channel instanceof ManagedChannel ? (ManagedChannel) channel : null;
        owned = false;
        base = channel;
      } else {
        ManagedChannelBuilder<?> b = ManagedChannelBuilder.forTarget(target)
            .maxInboundMessageSize(MAX_MESSAGE_BYTES)
            .userAgent("context-sidecar-java/" + VERSION);
        if (plaintext) {
          b.usePlaintext();
        } else {
          b.useTransportSecurity();
        }
        managed = b.build();
        owned = true;
        base = managed;
      }
      List<ClientInterceptor> chain = new ArrayList<>();
      if (token != null) {
        chain.add(new BearerToken(token));
      }
      List<ClientInterceptor> user = new ArrayList<>(interceptors);
      Collections.reverse(user);  // ClientInterceptors.intercept runs the last one first
      chain.addAll(user);
      Channel intercepted = ClientInterceptors.intercept(base, chain);
      return new SidecarClient(new Shared(target, intercepted, managed, owned, autoKeys, keys), timeout, retry);
    }

    /**
     * The client, once the sidecar's health service says SERVING: {@link #build()} then
     * {@link SidecarClient#awaitHealthy} with {@link #healthTimeout}. On failure the channel is shut
     * down and the {@code UNAVAILABLE} is thrown.
     */
    public SidecarClient connect() {
      SidecarClient client = build();
      try {
        client.awaitHealthy(healthTimeout);
        return client;
      } catch (RuntimeException e) {
        client.close();
        throw e;
      }
    }
  }

  // ==== One method per RPC (the generated messages in, the generated messages out) ====

  // ---- Sessions ------------------------------------------------------------------------------
  /**
   * Creates a session for the scope's user. An explicit session_id that already exists for this
   * user answers ALREADY_EXISTS.
   */
  public Session createSession(CreateSessionRequest request) {
    return call(ContextServiceGrpc.getCreateSessionMethod(), request);
  }

  /**
   * Returns one session of the scope's user (NOT_FOUND when absent or owned by someone else).
   */
  public Session getSession(GetSessionRequest request) {
    return call(ContextServiceGrpc.getGetSessionMethod(), request);
  }

  /**
   * Lists the scope's user's sessions, newest first, paged.
   */
  public ListSessionsResponse listSessions(ListSessionsRequest request) {
    return call(ContextServiceGrpc.getListSessionsMethod(), request);
  }

  /**
   * Closes a session: it stays readable, but no longer accepts messages, facts or runs.
   */
  public Session closeSession(CloseSessionRequest request) {
    return call(ContextServiceGrpc.getCloseSessionMethod(), request);
  }

  /**
   * Imports past conversations (a user's history from another system): new sessions with their
   * messages and dates, stored in one transaction (all or none), each session's after-turn work
   * queued with it. A session_id that already exists answers ALREADY_EXISTS and nothing is stored.
   */
  public ImportSessionsResponse importSessions(ImportSessionsRequest request) {
    return call(ContextServiceGrpc.getImportSessionsMethod(), request);
  }

  // ---- Messages ------------------------------------------------------------------------------
  /**
   * Appends a batch of messages to a session atomically (all or none), each token-counted once.
   */
  public AppendMessagesResponse appendMessages(AppendMessagesRequest request) {
    return call(ContextServiceGrpc.getAppendMessagesMethod(), request);
  }

  /**
   * Lists a session's messages: the newest N, or a range of sequence numbers, in order.
   */
  public ListMessagesResponse listMessages(ListMessagesRequest request) {
    return call(ContextServiceGrpc.getListMessagesMethod(), request);
  }

  /**
   * Deletes messages of a session: their rows, their place in every index and summary, and the
   * memories whose only sources they were (memories with other sources lose them as a source).
   */
  public DeleteMessagesResponse deleteMessages(DeleteMessagesRequest request) {
    return call(ContextServiceGrpc.getDeleteMessagesMethod(), request);
  }

  /**
   * Deletes a session and its sub-sessions whole: messages, facts, runs, tool results, notes,
   * summary, pinned constraints, recall entries and the memories whose only sources they were.
   */
  public DeleteSessionResponse deleteSession(DeleteSessionRequest request) {
    return call(ContextServiceGrpc.getDeleteSessionMethod(), request);
  }

  /**
   * Lists a session's pinned constraints (a sub-session's include its parent's).
   */
  public ListPinnedResponse listPinned(ListPinnedRequest request) {
    return call(ContextServiceGrpc.getListPinnedMethod(), request);
  }

  /**
   * Unpins one constraint of this session (kept in history with who and why). An inherited
   * constraint cannot be unpinned in a sub-session: FAILED_PRECONDITION.
   */
  public PinnedConstraint unpin(UnpinRequest request) {
    return call(ContextServiceGrpc.getUnpinMethod(), request);
  }

  // ---- Session state (facts with provenance) -------------------------------------------------
  /**
   * Writes facts. USER_CONFIRMED and TOOL_VERIFIED facts become confirmed state; MODEL_INFERRED
   * facts are stored as candidates and stay out of the confirmed state until ConfirmFact.
   */
  public UpsertFactsResponse upsertFacts(UpsertFactsRequest request) {
    return call(ContextServiceGrpc.getUpsertFactsMethod(), request);
  }

  /**
   * Promotes a candidate fact to confirmed state (by the user or a tool).
   */
  public Fact confirmFact(ConfirmFactRequest request) {
    return call(ContextServiceGrpc.getConfirmFactMethod(), request);
  }

  /**
   * Drops a candidate fact (or a confirmed one) from the state; history keeps it.
   */
  public Fact rejectFact(RejectFactRequest request) {
    return call(ContextServiceGrpc.getRejectFactMethod(), request);
  }

  /**
   * Returns the confirmed facts and, separately, the candidates of a session.
   */
  public SessionState getSessionState(GetSessionStateRequest request) {
    return call(ContextServiceGrpc.getGetSessionStateMethod(), request);
  }

  /**
   * Returns every change of one fact key, oldest first.
   */
  public GetFactHistoryResponse getFactHistory(GetFactHistoryRequest request) {
    return call(ContextServiceGrpc.getGetFactHistoryMethod(), request);
  }

  // ---- Runs ----------------------------------------------------------------------------------
  /**
   * Starts a run (status RUNNING) in a session.
   */
  public Run startRun(StartRunRequest request) {
    return call(ContextServiceGrpc.getStartRunMethod(), request);
  }

  /**
   * Moves a run through its state machine: RUNNING -&gt; INTERRUPTED | COMPLETED | FAILED |
   * CANCELLED; INTERRUPTED -&gt; RUNNING | CANCELLED. Anything else answers FAILED_PRECONDITION
   * naming both states.
   */
  public Run updateRun(UpdateRunRequest request) {
    return call(ContextServiceGrpc.getUpdateRunMethod(), request);
  }

  /**
   * Returns one run.
   */
  public Run getRun(GetRunRequest request) {
    return call(ContextServiceGrpc.getGetRunMethod(), request);
  }

  /**
   * Stores an opaque checkpoint of a run plus the pending step (e.g. a tool call awaiting human
   * approval).
   */
  public RunCheckpoint checkpoint(CheckpointRequest request) {
    return call(ContextServiceGrpc.getCheckpointMethod(), request);
  }

  /**
   * Resumes an interrupted run (INTERRUPTED -&gt; RUNNING) and returns its last checkpoint. On a
   * running run it only returns the last checkpoint; on a finished run FAILED_PRECONDITION.
   */
  public ResumeRunResponse resumeRun(ResumeRunRequest request) {
    return call(ContextServiceGrpc.getResumeRunMethod(), request);
  }

  // ---- Tool results and run notes ------------------------------------------------------------
  /**
   * Stores a tool's whole output and returns its id; BuildContext shows a trimmed view of it.
   */
  public ToolResultRef recordToolResult(RecordToolResultRequest request) {
    return call(ContextServiceGrpc.getRecordToolResultMethod(), request);
  }

  /**
   * Returns a tool result's full text, byte for byte.
   */
  public ToolResult getToolResult(GetToolResultRequest request) {
    return call(ContextServiceGrpc.getGetToolResultMethod(), request);
  }

  /**
   * Adds a note to a run; when the run's notes are over their bounds the oldest fold into one
   * summary note.
   */
  public RunNote addRunNote(AddRunNoteRequest request) {
    return call(ContextServiceGrpc.getAddRunNoteMethod(), request);
  }

  /**
   * Lists a run's notes, oldest first.
   */
  public ListRunNotesResponse listRunNotes(ListRunNotesRequest request) {
    return call(ContextServiceGrpc.getListRunNotesMethod(), request);
  }

  // ---- Sub-agents ----------------------------------------------------------------------------
  /**
   * Starts a child session that inherits only what is handed off (selected facts, a task), never
   * the parent's history.
   */
  public Session createSubSession(CreateSubSessionRequest request) {
    return call(ContextServiceGrpc.getCreateSubSessionMethod(), request);
  }

  /**
   * Finishes a child session; its result summary enters the parent's context as one item.
   */
  public CompleteSubSessionResponse completeSubSession(CompleteSubSessionRequest request) {
    return call(ContextServiceGrpc.getCompleteSubSessionMethod(), request);
  }

  // ---- Working memory ------------------------------------------------------------------------
  /**
   * Assembles the prompt for one model call under a token budget. The hard zone (system rules,
   * tool schemas, pinned constraints, confirmed state) must fit or the call answers
   * FAILED_PRECONDITION naming the block, its tokens and the budget; the soft zone is ranked,
   * deduplicated and greedily packed.
   */
  public BuildContextResponse buildContext(BuildContextRequest request) {
    return call(ContextServiceGrpc.getBuildContextMethod(), request);
  }

  /**
   * Enqueues the after-turn work (long-term memory extraction, rolling summary) as durable jobs
   * and returns at once.
   */
  public CommitTurnResponse commitTurn(CommitTurnRequest request) {
    return call(ContextServiceGrpc.getCommitTurnMethod(), request);
  }

  /**
   * Returns one job of the scope.
   */
  public Job getJobStatus(GetJobStatusRequest request) {
    return call(ContextServiceGrpc.getGetJobStatusMethod(), request);
  }

  /**
   * Waits until the given jobs (or all of the scope's queued jobs) are finished or the timeout
   * passes. The call's deadline is at least timeout_ms plus 5 s.
   */
  public WaitForJobsResponse waitForJobs(WaitForJobsRequest request) {
    // The sidecar waits up to timeout_ms (default 10 s): the deadline must outlast that wait.
    Duration wait = Duration.ofMillis(request.getTimeoutMs() > 0 ? request.getTimeoutMs() : 10_000).plus(WAIT_SLACK);
    SidecarClient client = wait.compareTo(timeout) > 0 ? withTimeout(wait) : this;
    return client.call(ContextServiceGrpc.getWaitForJobsMethod(), request);
  }

  // ---- Long-term memory ----------------------------------------------------------------------
  /**
   * Adds a memory explicitly; it passes the same filters (secrets, dedup, supersede) as
   * extracted ones.
   */
  public AddMemoryResponse addMemory(AddMemoryRequest request) {
    return call(ContextServiceGrpc.getAddMemoryMethod(), request);
  }

  /**
   * Searches the scope's user's active, unexpired memories (hybrid dense + lexical).
   */
  public SearchMemoriesResponse searchMemories(SearchMemoriesRequest request) {
    return call(ContextServiceGrpc.getSearchMemoriesMethod(), request);
  }

  /**
   * Lists the scope's user's memories, paged; inactive ones only when asked, flagged.
   */
  public ListMemoriesResponse listMemories(ListMemoriesRequest request) {
    return call(ContextServiceGrpc.getListMemoriesMethod(), request);
  }

  /**
   * Edits a memory (a user correction); history keeps the old version.
   */
  public Memory updateMemory(UpdateMemoryRequest request) {
    return call(ContextServiceGrpc.getUpdateMemoryMethod(), request);
  }

  /**
   * Deletes a memory from rows and indexes.
   */
  public DeleteMemoryResponse deleteMemory(DeleteMemoryRequest request) {
    return call(ContextServiceGrpc.getDeleteMemoryMethod(), request);
  }

  /**
   * Deletes everything of the scope's user in the tenant: sessions, messages, facts, runs, tool
   * results, memories, history, summaries, jobs and index entries. Returns the counts.
   */
  public ForgetUserResponse forgetUser(ForgetUserRequest request) {
    return call(ContextServiceGrpc.getForgetUserMethod(), request);
  }

  /**
   * Returns every change of one memory, oldest first.
   */
  public GetMemoryHistoryResponse getMemoryHistory(GetMemoryHistoryRequest request) {
    return call(ContextServiceGrpc.getGetMemoryHistoryMethod(), request);
  }

  // ---- Knowledge base ------------------------------------------------------------------------
  /**
   * Stores a document as version 1, or the next version of an existing doc_id, chunked; indexing
   * runs as a job whose id is returned.
   */
  public IngestDocumentResponse ingestDocument(IngestDocumentRequest request) {
    return call(ContextServiceGrpc.getIngestDocumentMethod(), request);
  }

  /**
   * Lists the tenant's documents (live version of each).
   */
  public ListDocumentsResponse listDocuments(ListDocumentsRequest request) {
    return call(ContextServiceGrpc.getListDocumentsMethod(), request);
  }

  /**
   * Lists every version of one document.
   */
  public ListDocumentVersionsResponse listDocumentVersions(ListDocumentVersionsRequest request) {
    return call(ContextServiceGrpc.getListDocumentVersionsMethod(), request);
  }

  /**
   * Makes an existing version the live one (rollback or roll forward).
   */
  public DocumentVersion setLiveVersion(SetLiveVersionRequest request) {
    return call(ContextServiceGrpc.getSetLiveVersionMethod(), request);
  }

  /**
   * Deletes a document, all its versions, chunks and index entries.
   */
  public DeleteDocumentResponse deleteDocument(DeleteDocumentRequest request) {
    return call(ContextServiceGrpc.getDeleteDocumentMethod(), request);
  }

  /**
   * Searches the live chunks visible to the caller's roles.
   */
  public SearchKnowledgeResponse searchKnowledge(SearchKnowledgeRequest request) {
    return call(ContextServiceGrpc.getSearchKnowledgeMethod(), request);
  }

  // ---- Graph facts ---------------------------------------------------------------------------
  /**
   * Inserts or replaces entity-relation edges of the tenant.
   */
  public UpsertEdgesResponse upsertEdges(UpsertEdgesRequest request) {
    return call(ContextServiceGrpc.getUpsertEdgesMethod(), request);
  }

  /**
   * Deletes edges by id.
   */
  public DeleteEdgesResponse deleteEdges(DeleteEdgesRequest request) {
    return call(ContextServiceGrpc.getDeleteEdgesMethod(), request);
  }

  /**
   * Walks the graph from an entity (1-3 hops) and returns the paths with their sources.
   */
  public QueryGraphResponse queryGraph(QueryGraphRequest request) {
    return call(ContextServiceGrpc.getQueryGraphMethod(), request);
  }
}
