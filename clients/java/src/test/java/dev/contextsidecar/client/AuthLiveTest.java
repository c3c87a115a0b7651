package dev.contextsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;

import dev.contextsidecar.v1.CreateSessionRequest;
import dev.contextsidecar.v1.Scope;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.Before;
import org.junit.Test;

/** The token against a sidecar started with --auth-token (-Dsidecar.auth.addr, -Dsidecar.auth.token). */
public class AuthLiveTest {
  @Before
  public void needsAuthSidecar() {
    Live.assumeAuthSidecar();
  }

  private static SidecarClient.Builder builder(Faults f) {
    return SidecarClient.builder(Live.authAddr()).timeout(Duration.ofSeconds(20)).healthTimeout(Duration.ofSeconds(20))
        .intercept(f);
  }

  private static CreateSessionRequest create(Scope scope) {
    return CreateSessionRequest.newBuilder().setScope(scope).setTitle("auth").build();
  }

  @Test
  public void tokenIsSentAsBearer() {
    Faults f = Faults.count("CreateSession");
    try (SidecarClient cs = builder(f).authToken(Live.authToken()).connect()) {
      assertFalse(cs.createSession(create(Live.freshScope("auth"))).getSessionId().isEmpty());
    }
    assertEquals(1, f.attempts.get());
  }

  @Test
  public void missingTokenIsUnauthenticatedAndNotRetried() {
    Faults f = Faults.count("CreateSession");
    // connect() succeeds: the health service needs no token.
    try (SidecarClient cs = builder(f).connect()) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.createSession(create(Live.freshScope("auth"))));
      assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
    }
    assertEquals(1, f.attempts.get());
  }

  @Test
  public void wrongTokenIsUnauthenticated() {
    try (SidecarClient cs = builder(Faults.count("none")).authToken("not-" + Live.authToken()).connect()) {
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> cs.createSession(create(Live.freshScope("auth"))));
      assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
    }
  }

  @Test
  public void tokenSupplierIsReadPerCall() {
    AtomicReference<String> token = new AtomicReference<>("stale");
    try (SidecarClient cs = builder(Faults.count("none")).authToken(token::get).connect()) {
      assertThrows(StatusRuntimeException.class, () -> cs.createSession(create(Live.freshScope("auth"))));
      token.set(Live.authToken());  // a rotated Secret
      assertFalse(cs.createSession(create(Live.freshScope("auth"))).getSessionId().isEmpty());
    }
  }
}
