import dev.contextsidecar.v1.AppendMessagesRequest;
import dev.contextsidecar.v1.AppendMessagesResponse;
import dev.contextsidecar.v1.BuildContextRequest;
import dev.contextsidecar.v1.BuildContextResponse;
import dev.contextsidecar.v1.ChatMessage;
import dev.contextsidecar.v1.CommitTurnRequest;
import dev.contextsidecar.v1.CommitTurnResponse;
import dev.contextsidecar.v1.ContextServiceGrpc;
import dev.contextsidecar.v1.CreateSessionRequest;
import dev.contextsidecar.v1.FactInput;
import dev.contextsidecar.v1.NewMessage;
import dev.contextsidecar.v1.Provenance;
import dev.contextsidecar.v1.RecordToolResultRequest;
import dev.contextsidecar.v1.RenderMode;
import dev.contextsidecar.v1.Role;
import dev.contextsidecar.v1.Scope;
import dev.contextsidecar.v1.Section;
import dev.contextsidecar.v1.Session;
import dev.contextsidecar.v1.ToolResultRef;
import dev.contextsidecar.v1.ToolSchema;
import dev.contextsidecar.v1.ToolStatus;
import dev.contextsidecar.v1.UpsertFactsRequest;
import dev.contextsidecar.v1.UpsertFactsResponse;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Runs one full agent turn against a Context Sidecar and prints one JSON line with what it saw:
 *
 * <pre>
 * CreateSession -> AppendMessages(user) -> UpsertFacts -> BuildContext (RENDER_MODE_CHAT)
 * -> RecordToolResult -> AppendMessages(assistant) -> CommitTurn
 * </pre>
 *
 * then times BuildContext over -n calls after -warmup untimed ones (p50/p95 in the JSON). Any RPC
 * error is printed on stderr and the process exits 1.
 *
 * <p>Flags: -addr host:port (default 127.0.0.1:50051), -tenant, -user, -n (default 200), -warmup
 * (untimed calls first, default 1000), -token
 * (default $SIDECAR_AUTH_TOKEN), -timeout-ms (default 10000).
 */
public final class Example {
  private static final String TOOL_SCHEMA =
      "{\"type\":\"object\",\"properties\":{\"service\":{\"type\":\"string\"},\"env\":{\"type\":\"string\"},"
          + "\"since_minutes\":{\"type\":\"integer\"}},\"required\":[\"service\",\"env\"]}";

  private static final String TOOL_OUTPUT =
      "2024-05-01T10:00:01Z ERROR payment-api pod=payment-api-7d9f status=503 path=/v1/charge upstream=payment-db timeout after 3000ms\n"
          + "2024-05-01T10:00:02Z ERROR payment-api pod=payment-api-7d9f status=503 path=/v1/charge upstream=payment-db timeout after 3000ms\n"
          + "2024-05-01T10:00:04Z WARN  payment-api pod=payment-api-2c41 db pool exhausted (50/50 in use)\n"
          + "2024-05-01T10:00:05Z ERROR payment-api pod=payment-api-2c41 status=500 path=/v1/refund NullPointerException at RefundService.java:88\n"
          + "2024-05-01T10:00:07Z INFO  payment-api pod=payment-api-2c41 health check ok\n"
          + "summary: 5xx=412 in the last 15 minutes (503: 380, 500: 32); 92% upstream=payment-db";

  /** An RPC failed: carries which call, for the stderr line. */
  private static final class CallFailed extends RuntimeException {
    CallFailed(String what, StatusRuntimeException e) {
      super(what + " failed: " + e.getStatus().getCode() + ": " + e.getStatus().getDescription(), e);
    }
  }

  private Example() {}

  public static void main(String[] args) throws InterruptedException {
    Map<String, String> flags = new LinkedHashMap<>();
    flags.put("addr", "127.0.0.1:50051");
    flags.put("tenant", "acme");
    flags.put("user", "alice");
    flags.put("n", "200");
    // The JIT needs about a thousand calls (on 2 cores) before p50 settles: 50 warm-up calls gave
    // a p50 of 2.5-5 ms, 1000 give about 1 ms, the same as Go.
    flags.put("warmup", "1000");
    String envToken = System.getenv("SIDECAR_AUTH_TOKEN");
    flags.put("token", envToken == null ? "" : envToken);
    flags.put("timeout-ms", "10000");
    try {
      parseFlags(args, flags);
    } catch (IllegalArgumentException e) {
      System.err.println("Example: " + e.getMessage());
      System.exit(2);
    }

    ManagedChannel channel = ManagedChannelBuilder.forTarget(flags.get("addr")).usePlaintext().build();
    int rc = 0;
    try {
      System.out.println(run(channel, flags));
    } catch (CallFailed e) {
      System.err.println("Example: " + e.getMessage());
      rc = 1;
    } catch (RuntimeException e) {
      System.err.println("Example: " + e);
      rc = 1;
    } finally {
      channel.shutdownNow();
      channel.awaitTermination(5, TimeUnit.SECONDS);
    }
    System.exit(rc);
  }

  private static void parseFlags(String[] args, Map<String, String> flags) {
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (!a.startsWith("-")) {
        throw new IllegalArgumentException("unexpected argument " + a);
      }
      String name = a.replaceFirst("^--?", "");
      String value;
      int eq = name.indexOf('=');
      if (eq >= 0) {
        value = name.substring(eq + 1);
        name = name.substring(0, eq);
      } else if (i + 1 < args.length) {
        value = args[++i];
      } else {
        throw new IllegalArgumentException("flag -" + name + " needs a value");
      }
      if (!flags.containsKey(name)) {
        throw new IllegalArgumentException("unknown flag -" + name + " (known: " + flags.keySet() + ")");
      }
      flags.put(name, value);
    }
  }

  private static String run(ManagedChannel channel, Map<String, String> flags) {
    long timeoutMs = Long.parseLong(flags.get("timeout-ms"));
    int n = Integer.parseInt(flags.get("n"));
    int warmup = Integer.parseInt(flags.get("warmup"));
    ContextServiceGrpc.ContextServiceBlockingStub base = ContextServiceGrpc.newBlockingStub(channel);
    if (!flags.get("token").isEmpty()) {
      Metadata md = new Metadata();
      md.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + flags.get("token"));
      base = base.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(md));
    }
    final ContextServiceGrpc.ContextServiceBlockingStub stub = base;
    // A deadline per call: stubs are immutable, withDeadlineAfter returns a new one.
    java.util.function.Supplier<ContextServiceGrpc.ContextServiceBlockingStub> call =
        () -> stub.withDeadlineAfter(timeoutMs, TimeUnit.MILLISECONDS);

    Scope scope = Scope.newBuilder().setTenantId(flags.get("tenant")).setUserId(flags.get("user")).build();
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("client", "java");

    // 1. A session for this task.
    Session session;
    try {
      session = call.get().createSession(
          CreateSessionRequest.newBuilder().setScope(scope).setTitle("payment-api 5xx").build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("CreateSession", e);
    }
    String sessionId = session.getSessionId();
    out.put("session_id", sessionId);

    // 2. The user's message.
    String query = "查一下生产环境 payment-api 的 5xx";
    AppendMessagesResponse app;
    try {
      app = call.get().appendMessages(AppendMessagesRequest.newBuilder().setScope(scope).setSessionId(sessionId)
          .addMessages(NewMessage.newBuilder().setRole(Role.ROLE_USER).setText(query)).build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("AppendMessages(user)", e);
    }
    String userMessageId = app.getMessagesCount() > 0 ? app.getMessages(0).getMessageId() : "";
    out.put("user_message_id", userMessageId);

    // 3. A fact the user confirmed: pinned into the hard zone of every later BuildContext.
    UpsertFactsResponse facts;
    try {
      facts = call.get().upsertFacts(UpsertFactsRequest.newBuilder().setScope(scope).setSessionId(sessionId)
          .addFacts(FactInput.newBuilder().setKey("env").setValue("production")
              .setProvenance(Provenance.PROVENANCE_USER_CONFIRMED).setSource("message:" + userMessageId))
          .build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("UpsertFacts", e);
    }
    out.put("facts", facts.getFactsCount());

    // 4. The prompt for the model call, as chat messages.
    BuildContextRequest bcReq = BuildContextRequest.newBuilder().setScope(scope).setSessionId(sessionId)
        .setQuery(query)
        .setSystemRules("You are an SRE assistant. Only query production when the user confirmed it. "
            + "Answer in the user's language.")
        .addTools(ToolSchema.newBuilder().setName("query_logs")
            .setDescription("Search service logs by service, env and time window.").setSchemaJson(TOOL_SCHEMA))
        .setRender(RenderMode.RENDER_MODE_CHAT)
        .build();
    BuildContextResponse bc;
    try {
      bc = call.get().buildContext(bcReq);
    } catch (StatusRuntimeException e) {
      throw new CallFailed("BuildContext", e);
    }
    List<String> kinds = new ArrayList<>();
    for (Section s : bc.getSectionsList()) {
      kinds.add(s.getKind().name());
    }
    out.put("sections", bc.getSectionsCount());
    out.put("section_kinds", kinds);
    out.put("chat_messages", bc.getChatMessagesCount());
    out.put("total_tokens", bc.getTotalTokens());
    out.put("total_budget", bc.getTotalBudget());
    out.put("stable_prefix_hash", bc.getStablePrefixHash());
    // Here a real service maps bc.getChatMessagesList() ({role, content}) onto its model API's
    // messages and runs the tool call the model asks for.
    for (ChatMessage m : bc.getChatMessagesList()) {
      if (m.getRole().isEmpty()) {
        throw new IllegalStateException("BuildContext returned a chat message without a role");
      }
    }

    // 5. The tool's whole output; later prompts show a trimmed view of it.
    ToolResultRef ref;
    try {
      ref = call.get().recordToolResult(RecordToolResultRequest.newBuilder().setScope(scope)
          .setSessionId(sessionId).setToolName("query_logs").setCallId("call-1").setFullText(TOOL_OUTPUT)
          .setStatus(ToolStatus.TOOL_STATUS_OK).build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("RecordToolResult", e);
    }
    out.put("tool_result_id", ref.getToolResultId());
    out.put("tool_result_tokens", ref.getTokens());

    // 6. The model's answer.
    try {
      app = call.get().appendMessages(AppendMessagesRequest.newBuilder().setScope(scope).setSessionId(sessionId)
          .addMessages(NewMessage.newBuilder().setRole(Role.ROLE_ASSISTANT)
              .setText("生产环境 payment-api 最近 15 分钟有 412 个 5xx（503: 380，500: 32），"
                  + "92% 是 payment-db 超时，连接池已满（50/50）。"))
          .build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("AppendMessages(assistant)", e);
    }
    out.put("assistant_message_id", app.getMessagesCount() > 0 ? app.getMessages(0).getMessageId() : "");

    // 7. Hand the finished turn to the background jobs (memory extraction, summary).
    CommitTurnResponse commit;
    try {
      commit = call.get().commitTurn(CommitTurnRequest.newBuilder().setScope(scope).setSessionId(sessionId).build());
    } catch (StatusRuntimeException e) {
      throw new CallFailed("CommitTurn", e);
    }
    out.put("job_ids", new ArrayList<>(commit.getJobIdsList()));

    // 8. BuildContext latency, client-side, after a warm-up (the JIT needs far more than Go does).
    if (n > 0) {
      try {
        for (int i = 0; i < warmup; i++) {
          call.get().buildContext(bcReq);
        }
        double[] ms = new double[n];
        for (int i = 0; i < n; i++) {
          ContextServiceGrpc.ContextServiceBlockingStub s = call.get();
          long t0 = System.nanoTime();
          s.buildContext(bcReq);
          ms[i] = (System.nanoTime() - t0) / 1e6;
        }
        Arrays.sort(ms);
        out.put("warmup_calls", warmup);
        out.put("latency_calls", n);
        out.put("p50_ms", round3(ms[(int) Math.round(0.50 * (n - 1))]));
        out.put("p95_ms", round3(ms[(int) Math.round(0.95 * (n - 1))]));
      } catch (StatusRuntimeException e) {
        throw new CallFailed("BuildContext(timed)", e);
      }
    } else {
      out.put("warmup_calls", 0);
      out.put("latency_calls", 0);
      out.put("p50_ms", 0.0);
      out.put("p95_ms", 0.0);
    }
    return toJson(out);
  }

  private static double round3(double v) {
    return Math.round(v * 1000.0) / 1000.0;
  }

  // ---- a minimal JSON writer (no JSON library among Debian's gRPC jars) -----------------------

  private static String toJson(Object v) {
    StringBuilder sb = new StringBuilder();
    write(sb, v);
    return sb.toString();
  }

  private static void write(StringBuilder sb, Object v) {
    if (v == null) {
      sb.append("null");
    } else if (v instanceof String) {
      quote(sb, (String) v);
    } else if (v instanceof Number || v instanceof Boolean) {
      sb.append(v);
    } else if (v instanceof Map) {
      sb.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
        if (!first) {
          sb.append(',');
        }
        first = false;
        quote(sb, String.valueOf(e.getKey()));
        sb.append(':');
        write(sb, e.getValue());
      }
      sb.append('}');
    } else if (v instanceof List) {
      sb.append('[');
      boolean first = true;
      for (Object o : (List<?>) v) {
        if (!first) {
          sb.append(',');
        }
        first = false;
        write(sb, o);
      }
      sb.append(']');
    } else {
      quote(sb, v.toString());
    }
  }

  private static void quote(StringBuilder sb, String s) {
    sb.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"': sb.append("\\\""); break;
        case '\\': sb.append("\\\\"); break;
        case '\n': sb.append("\\n"); break;
        case '\r': sb.append("\\r"); break;
        case '\t': sb.append("\\t"); break;
        default:
          // Everything outside printable ASCII is escaped, so the line is the same bytes whatever
          // the platform's default charset (Java 17's System.out follows the locale).
          if (c < 0x20 || c > 0x7e) {
            sb.append(String.format("\\u%04x", (int) c));
          } else {
            sb.append(c);
          }
      }
    }
    sb.append('"');
  }
}
