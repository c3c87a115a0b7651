package dev.contextsidecar.client;

import dev.contextsidecar.v1.CreateSessionRequest;
import dev.contextsidecar.v1.Scope;
import io.grpc.ClientInterceptor;
import java.time.Duration;
import java.util.UUID;
import org.junit.Assume;

/**
 * Where the live sidecars are, from system properties (test.sh passes them):
 * {@code sidecar.addr} (no auth), and {@code sidecar.auth.addr} + {@code sidecar.auth.token} (one
 * started with --auth-token). Without them the live tests are skipped (JUnit assumptions); the
 * Python test that drives test.sh treats a skip as a failure.
 */
final class Live {
  private Live() {}

  static String addr() {
    return System.getProperty("sidecar.addr", "");
  }

  static String authAddr() {
    return System.getProperty("sidecar.auth.addr", "");
  }

  static String authToken() {
    return System.getProperty("sidecar.auth.token", "");
  }

  static void assumeSidecar() {
    Assume.assumeFalse("no live sidecar: pass -Dsidecar.addr=HOST:PORT", addr().isEmpty());
  }

  static void assumeAuthSidecar() {
    Assume.assumeFalse("no live sidecar with a token: pass -Dsidecar.auth.addr and -Dsidecar.auth.token",
        authAddr().isEmpty() || authToken().isEmpty());
  }

  /** A client of the live sidecar (health wait included) with these interceptors. */
  static SidecarClient connect(ClientInterceptor... interceptors) {
    return builder(interceptors).connect();
  }

  static SidecarClient.Builder builder(ClientInterceptor... interceptors) {
    return SidecarClient.builder(addr()).timeout(Duration.ofSeconds(20)).healthTimeout(Duration.ofSeconds(20))
        .retryPolicy(RetryPolicy.builder().initialBackoff(Duration.ofMillis(20)).maxBackoff(Duration.ofMillis(200))
            .build())
        .intercept(interceptors);
  }

  /** A tenant of its own per test, so tests never see each other's data. */
  static Scope freshScope(String what) {
    return SidecarClient.scope("java-" + what + "-" + UUID.randomUUID().toString().substring(0, 8), "alice");
  }

  static String newSession(SidecarClient cs, Scope scope) {
    return cs.createSession(CreateSessionRequest.newBuilder().setScope(scope).setTitle("java client test").build())
        .getSessionId();
  }
}
