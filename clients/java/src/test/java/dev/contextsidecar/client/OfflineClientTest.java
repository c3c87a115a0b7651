package dev.contextsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import com.google.protobuf.Descriptors.MethodDescriptor;
import com.google.protobuf.Descriptors.ServiceDescriptor;
import dev.contextsidecar.v1.AppendMessagesRequest;
import dev.contextsidecar.v1.ContextServiceProto;
import dev.contextsidecar.v1.GetSessionRequest;
import dev.contextsidecar.v1.NewMessage;
import dev.contextsidecar.v1.Role;
import dev.contextsidecar.v1.Scope;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.Test;

/**
 * The client against an address where nothing listens (every attempt: UNAVAILABLE), and its
 * static contract with the proto. No sidecar needed.
 */
public class OfflineClientTest {
  private static final Scope SCOPE = SidecarClient.scope("acme", "alice");
  private static final RetryPolicy FAST = RetryPolicy.builder().maxAttempts(4).initialBackoff(Duration.ofMillis(40))
      .maxBackoff(Duration.ofMillis(160)).multiplier(2).jitter(0).build();

  private static String deadAddress() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      return "127.0.0.1:" + s.getLocalPort();
    }
  }

  private static AppendMessagesRequest.Builder append(String text) {
    return AppendMessagesRequest.newBuilder().setScope(SCOPE).setSessionId("ses-1")
        .addMessages(NewMessage.newBuilder().setRole(Role.ROLE_USER).setText(text));
  }

  @Test
  public void healthWaitGivesUpWithUnavailable() throws IOException {
    String addr = deadAddress();
    long t0 = System.nanoTime();
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> SidecarClient.builder(addr).healthTimeout(Duration.ofMillis(800)).connect());
    long ms = (System.nanoTime() - t0) / 1_000_000;
    assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
    assertTrue(e.getStatus().getDescription(), e.getStatus().getDescription().contains("not SERVING after 800 ms"));
    assertTrue("waited " + ms + " ms", ms >= 790 && ms < 8000);
  }

  @Test
  public void readIsRetriedWithExponentialBackoffUntilMaxAttempts() throws IOException {
    Faults f = Faults.count("GetSession");
    try (SidecarClient cs = SidecarClient.builder(deadAddress()).retryPolicy(FAST).intercept(f).build()) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.getSession(GetSessionRequest.newBuilder().setScope(SCOPE).setSessionId("s").build()));
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
    }
    assertEquals(4, f.attempts.get());
    long[] minGapMs = {40, 80, 160};  // jitter 0: exactly the ceilings
    for (int i = 1; i < f.startNanos.size(); i++) {
      long gap = (f.startNanos.get(i) - f.startNanos.get(i - 1)) / 1_000_000;
      assertTrue("gap before attempt " + (i + 1) + ": " + gap + " ms < " + minGapMs[i - 1], gap >= minGapMs[i - 1] - 2);
    }
  }

  @Test
  public void writeGetsOneKeyReusedByEveryRetry() throws IOException {
    Faults f = Faults.count("AppendMessages");
    try (SidecarClient cs = SidecarClient.builder(deadAddress()).retryPolicy(FAST).intercept(f).build()) {
      assertThrows(StatusRuntimeException.class, () -> cs.appendMessages(append("one").build()));
      assertThrows(StatusRuntimeException.class, () -> cs.appendMessages(append("two").build()));
    }
    assertEquals(8, f.attempts.get());
    List<String> first = f.keys.subList(0, 4);
    List<String> second = f.keys.subList(4, 8);
    assertFalse(first.get(0).isEmpty());
    assertEquals("one key per logical call", 1, new HashSet<>(first).size());
    assertEquals(1, new HashSet<>(second).size());
    assertFalse("a new key for the next logical call", first.get(0).equals(second.get(0)));
  }

  @Test
  public void explicitKeyIsKept() throws IOException {
    Faults f = Faults.count("AppendMessages");
    try (SidecarClient cs = SidecarClient.builder(deadAddress()).retryPolicy(FAST).intercept(f).build()) {
      assertThrows(StatusRuntimeException.class,
          () -> cs.appendMessages(append("x").setIdempotencyKey("mine-1").build()));
    }
    assertEquals(4, f.attempts.get());
    assertEquals(List.of("mine-1", "mine-1", "mine-1", "mine-1"), f.keys);
  }

  @Test
  public void writeWithoutKeyIsNotRetried() throws IOException {
    Faults f = Faults.count("AppendMessages");
    try (SidecarClient cs = SidecarClient.builder(deadAddress()).retryPolicy(FAST).autoIdempotencyKeys(false)
        .intercept(f).build()) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> cs.appendMessages(append("x").build()));
      assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
    }
    assertEquals(1, f.attempts.get());
    assertEquals(List.of(""), f.keys);
  }

  @Test
  public void retriesStopAtTheCallDeadline() throws IOException {
    Faults f = Faults.count("GetSession");
    RetryPolicy many = FAST.toBuilder().maxAttempts(1000).initialBackoff(Duration.ofMillis(50))
        .maxBackoff(Duration.ofMillis(50)).build();
    long t0 = System.nanoTime();
    try (SidecarClient cs = SidecarClient.builder(deadAddress()).retryPolicy(many).timeout(Duration.ofMillis(400))
        .intercept(f).build()) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.getSession(GetSessionRequest.newBuilder().setScope(SCOPE).setSessionId("s").build()));
      assertEquals("the last real failure, not a timeout", Status.Code.UNAVAILABLE, e.getStatus().getCode());
    }
    long ms = (System.nanoTime() - t0) / 1_000_000;
    assertTrue("took " + ms + " ms", ms < 3000);
    assertTrue("attempts " + f.attempts.get(), f.attempts.get() >= 2 && f.attempts.get() <= 9);
  }

  /** A channel that answers every call NOT_FOUND and keeps the headers each call went out with. */
  private static final class HeaderChannel extends Channel {
    final List<Metadata> sent = new CopyOnWriteArrayList<>();

    @Override
    public <Q, R> ClientCall<Q, R> newCall(io.grpc.MethodDescriptor<Q, R> method, CallOptions options) {
      return new ClientCall<Q, R>() {
        @Override
        public void start(Listener<R> listener, Metadata headers) {
          sent.add(headers);
          listener.onClose(Status.NOT_FOUND.withDescription("test channel"), new Metadata());
        }

        @Override
        public void request(int n) {}

        @Override
        public void cancel(String message, Throwable cause) {}

        @Override
        public void halfClose() {}

        @Override
        public void sendMessage(Q message) {}
      };
    }

    @Override
    public String authority() {
      return "test";
    }
  }

  @Test
  public void tokenGoesOutAsAuthorizationBearer() {
    HeaderChannel wire = new HeaderChannel();
    try (SidecarClient cs = SidecarClient.builder(wire).authToken("s3cret").build()) {
      assertThrows(StatusRuntimeException.class,
          () -> cs.getSession(GetSessionRequest.newBuilder().setScope(SCOPE).setSessionId("s").build()));
    }
    Metadata.Key<String> auth = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    assertEquals(1, wire.sent.size());
    assertEquals(List.of("Bearer s3cret"), iterable(wire.sent.get(0).getAll(auth)));
    HeaderChannel bare = new HeaderChannel();
    try (SidecarClient cs = SidecarClient.builder(bare).authToken("").build()) {
      assertThrows(StatusRuntimeException.class,
          () -> cs.getSession(GetSessionRequest.newBuilder().setScope(SCOPE).setSessionId("s").build()));
    }
    assertEquals("no token, no header", null, bare.sent.get(0).get(auth));
  }

  private static List<String> iterable(Iterable<String> values) {
    List<String> out = new ArrayList<>();
    if (values != null) {
      values.forEach(out::add);
    }
    return out;
  }

  @Test
  public void readMethodsAreExactlyTheRpcsWithoutAnIdempotencyKey() {
    ServiceDescriptor svc = ContextServiceProto.getDescriptor().findServiceByName("ContextService");
    Set<String> withoutKey = new HashSet<>();
    for (MethodDescriptor m : svc.getMethods()) {
      if (m.getInputType().findFieldByName("idempotency_key") == null) {
        withoutKey.add(m.getName());
      }
    }
    assertEquals("SidecarClient.READ_METHODS must list every RPC without an idempotency_key (a new read RPC"
        + " is not retried until it is listed; a write without a key must not be)", withoutKey,
        SidecarClient.READ_METHODS);
  }

  @Test
  public void everyRpcHasATypedMethod() {
    ServiceDescriptor svc = ContextServiceProto.getDescriptor().findServiceByName("ContextService");
    List<String> missing = new ArrayList<>();
    for (MethodDescriptor m : svc.getMethods()) {
      String name = Character.toLowerCase(m.getName().charAt(0)) + m.getName().substring(1);
      try {
        Method jm = SidecarClient.class.getMethod(name,
            Class.forName("dev.contextsidecar.v1." + m.getInputType().getName()));
        assertTrue(Modifier.isPublic(jm.getModifiers()));
        assertEquals(name, "dev.contextsidecar.v1." + m.getOutputType().getName(), jm.getReturnType().getName());
      } catch (NoSuchMethodException | ClassNotFoundException e) {
        missing.add(m.getName());
      }
    }
    assertTrue("SidecarClient lacks typed methods for " + missing + " (client.call(...) reaches them meanwhile)",
        missing.isEmpty());
  }

  @Test
  public void healthMessagesEncodeAsTheProtoSays() throws IOException {
    // HealthCheckRequest{service="x"} is field 1, length-delimited: 0x0a 0x01 'x'.
    byte[] req = HealthCheck.CHECK.getRequestMarshaller().stream("x").readAllBytes();
    assertEquals(List.of((byte) 0x0a, (byte) 0x01, (byte) 'x'), List.of(req[0], req[1], req[2]));
    assertEquals("x", HealthCheck.CHECK.parseRequest(HealthCheck.CHECK.streamRequest("x")));
    for (int s = 0; s <= 3; s++) {
      assertEquals(Integer.valueOf(s), HealthCheck.CHECK.parseResponse(HealthCheck.CHECK.streamResponse(s)));
    }
  }
}
