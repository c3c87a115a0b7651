import dev.contextsidecar.client.SidecarClient;
import dev.contextsidecar.client.Turn;
import dev.contextsidecar.v1.BuildContextRequest;
import dev.contextsidecar.v1.BuildContextResponse;
import dev.contextsidecar.v1.ChatMessage;
import dev.contextsidecar.v1.CommitTurnResponse;
import dev.contextsidecar.v1.CreateSessionRequest;
import dev.contextsidecar.v1.FactInput;
import dev.contextsidecar.v1.Message;
import dev.contextsidecar.v1.Provenance;
import dev.contextsidecar.v1.RenderMode;
import dev.contextsidecar.v1.Scope;
import dev.contextsidecar.v1.Section;
import dev.contextsidecar.v1.Session;
import dev.contextsidecar.v1.ToolResultRef;
import dev.contextsidecar.v1.ToolSchema;
import dev.contextsidecar.v1.ToolStatus;
import dev.contextsidecar.v1.UpsertFactsRequest;
import dev.contextsidecar.v1.UpsertFactsResponse;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;

/**
 * Runs one full agent turn against a Context Sidecar with the client library
 * ({@code dev.contextsidecar.client}) and prints one JSON line with what it saw:
 *
 * <pre>
 * connect (health wait) -> CreateSession -> Turn: AppendMessages(user) -> UpsertFacts
 * -> BuildContext (RENDER_MODE_CHAT) -> RecordToolResult -> AppendMessages(assistant) -> CommitTurn
 * </pre>
 *
 * then times BuildContext over -n calls after -warmup untimed ones (p50/p95 in the JSON). Any RPC
 * error is printed on stderr ("&lt;Rpc&gt; failed: &lt;CODE&gt;: &lt;message&gt;") and the process exits 1.
 *
 * <p>Flags: -addr host:port (default 127.0.0.1:50051), -tenant, -user, -n (default 200), -warmup
 * (untimed calls first, default 1000), -token (default $SIDECAR_AUTH_TOKEN), -timeout-ms (default
 * 10000: the deadline of each call, retries included, and of the health wait).
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
    private static final long serialVersionUID = 1L;

    CallFailed(String what, StatusRuntimeException e) {
      super(what + " failed: " + e.getStatus().getCode() + ": " + e.getStatus().getDescription(), e);
    }
  }

  private Example() {}

  public static void main(String[] args) {
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

    Duration timeout = Duration.ofMillis(Long.parseLong(flags.get("timeout-ms")));
    int rc = 0;
    SidecarClient client = null;
    try {
      // One client per process: the channel, the token, a deadline per call, retries on UNAVAILABLE.
      client = SidecarClient.builder(flags.get("addr")).authToken(flags.get("token"))
          .timeout(timeout).healthTimeout(timeout).connect();
      System.out.println(run(client, flags));
    } catch (CallFailed e) {
      System.err.println("Example: " + e.getMessage());
      rc = 1;
    } catch (StatusRuntimeException e) {
      System.err.println("Example: connect failed: " + e.getStatus().getCode() + ": " + e.getStatus().getDescription());
      rc = 1;
    } catch (RuntimeException e) {
      System.err.println("Example: " + e);
      rc = 1;
    } finally {
      if (client != null) {
        client.close();
      }
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

  /** Runs one call, naming it in the error when it fails. */
  private static <T> T step(String what, Supplier<T> call) {
    try {
      return call.get();
    } catch (StatusRuntimeException e) {
      throw new CallFailed(what, e);
    }
  }

  private static String run(SidecarClient cs, Map<String, String> flags) {
    int n = Integer.parseInt(flags.get("n"));
    int warmup = Integer.parseInt(flags.get("warmup"));
    Scope scope = SidecarClient.scope(flags.get("tenant"), flags.get("user"));
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("client", "java");

    // 1. A session for this task.
    Session session = step("CreateSession", () -> cs.createSession(
        CreateSessionRequest.newBuilder().setScope(scope).setTitle("payment-api 5xx").build()));
    String sessionId = session.getSessionId();
    out.put("session_id", sessionId);

    // 2. The user's message opens the turn.
    String query = "查一下生产环境 payment-api 的 5xx";
    Turn turn = step("AppendMessages(user)", () -> cs.startTurn(scope, sessionId, query));
    String userMessageId = turn.userMessage().getMessageId();
    out.put("user_message_id", userMessageId);

    // 3. A fact the user confirmed: pinned into the hard zone of every later BuildContext.
    UpsertFactsResponse facts = step("UpsertFacts", () -> cs.upsertFacts(UpsertFactsRequest.newBuilder()
        .setScope(scope).setSessionId(sessionId)
        .addFacts(FactInput.newBuilder().setKey("env").setValue("production")
            .setProvenance(Provenance.PROVENANCE_USER_CONFIRMED).setSource("message:" + userMessageId))
        .build()));
    out.put("facts", facts.getFactsCount());

    // 4. The prompt for the model call, as chat messages (the turn fills scope, session, query).
    BuildContextRequest template = BuildContextRequest.newBuilder()
        .setSystemRules("You are an SRE assistant. Only query production when the user confirmed it. "
            + "Answer in the user's language.")
        .addTools(ToolSchema.newBuilder().setName("query_logs")
            .setDescription("Search service logs by service, env and time window.").setSchemaJson(TOOL_SCHEMA))
        .setRender(RenderMode.RENDER_MODE_CHAT)
        .build();
    BuildContextResponse bc = step("BuildContext", () -> turn.buildContext(template));
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
    ToolResultRef ref = step("RecordToolResult",
        () -> turn.recordToolResult("query_logs", "call-1", TOOL_OUTPUT, ToolStatus.TOOL_STATUS_OK));
    out.put("tool_result_id", ref.getToolResultId());
    out.put("tool_result_tokens", ref.getTokens());

    // 6. The model's answer.
    Message answer = step("AppendMessages(assistant)", () -> turn.answer(
        "生产环境 payment-api 最近 15 分钟有 412 个 5xx（503: 380，500: 32），"
            + "92% 是 payment-db 超时，连接池已满（50/50）。"));
    out.put("assistant_message_id", answer.getMessageId());

    // 7. Hand the finished turn to the background jobs (memory extraction, summary).
    CommitTurnResponse commit = step("CommitTurn", turn::commit);
    out.put("job_ids", new ArrayList<>(commit.getJobIdsList()));

    // 8. BuildContext latency, client-side, after a warm-up (the JIT needs far more than Go does).
    if (n > 0) {
      BuildContextRequest bcReq = template.toBuilder().setScope(scope).setSessionId(sessionId).setQuery(query).build();
      double[] ms = new double[n];
      step("BuildContext(timed)", () -> {
        for (int i = 0; i < warmup; i++) {
          cs.buildContext(bcReq);
        }
        for (int i = 0; i < n; i++) {
          long t0 = System.nanoTime();
          cs.buildContext(bcReq);
          ms[i] = (System.nanoTime() - t0) / 1e6;
        }
        return null;
      });
      Arrays.sort(ms);
      out.put("warmup_calls", warmup);
      out.put("latency_calls", n);
      out.put("p50_ms", round3(ms[(int) Math.round(0.50 * (n - 1))]));
      out.put("p95_ms", round3(ms[(int) Math.round(0.95 * (n - 1))]));
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
