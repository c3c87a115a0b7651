package dev.contextsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.grpc.Status;
import java.time.Duration;
import java.util.HashSet;
import java.util.Set;
import org.junit.Test;

/** The backoff arithmetic of {@link RetryPolicy}; no sidecar needed. */
public class RetryPolicyTest {
  @Test
  public void defaultsRetryOnlyUnavailableFourAttempts() {
    RetryPolicy p = RetryPolicy.defaults();
    assertEquals(4, p.maxAttempts());
    assertTrue(p.retries(Status.Code.UNAVAILABLE));
    for (Status.Code c : Status.Code.values()) {
      if (c != Status.Code.UNAVAILABLE) {
        assertFalse(c.toString(), p.retries(c));
      }
    }
    assertEquals(1, RetryPolicy.none().maxAttempts());
  }

  @Test
  public void backoffGrowsExponentiallyAndCaps() {
    RetryPolicy p = RetryPolicy.builder().initialBackoff(Duration.ofMillis(100)).maxBackoff(Duration.ofMillis(700))
        .multiplier(2.0).jitter(0).build();
    long[] want = {100, 200, 400, 700, 700, 700};
    for (int i = 0; i < want.length; i++) {
      assertEquals("ceiling of retry " + (i + 1), want[i] * 1_000_000L, p.ceilingNanos(i + 1));
      assertEquals("no jitter: backoff == ceiling", want[i] * 1_000_000L, p.backoffNanos(i + 1));
    }
    assertEquals(700_000_000L, p.ceilingNanos(500));  // no overflow far out
  }

  @Test
  public void jitterStaysWithinItsBandAndVaries() {
    RetryPolicy p = RetryPolicy.builder().initialBackoff(Duration.ofMillis(100)).maxBackoff(Duration.ofSeconds(10))
        .jitter(0.5).build();
    Set<Long> seen = new HashSet<>();
    for (int retry = 1; retry <= 5; retry++) {
      long ceiling = p.ceilingNanos(retry);
      for (int i = 0; i < 500; i++) {
        long b = p.backoffNanos(retry);
        assertTrue("retry " + retry + ": " + b + " > " + ceiling, b <= ceiling);
        assertTrue("retry " + retry + ": " + b + " < half of " + ceiling, b >= ceiling / 2);
        seen.add(b);
      }
    }
    assertTrue("jitter draws vary", seen.size() > 100);
    RetryPolicy full = p.toBuilder().jitter(1.0).build();
    for (int i = 0; i < 200; i++) {
      long b = full.backoffNanos(1);
      assertTrue(b >= 0 && b <= full.ceilingNanos(1));
    }
  }

  @Test
  public void retryOnIsConfigurable() {
    RetryPolicy p = RetryPolicy.builder().retryOn(Status.Code.UNAVAILABLE, Status.Code.RESOURCE_EXHAUSTED).build();
    assertTrue(p.retries(Status.Code.RESOURCE_EXHAUSTED));
    assertFalse(p.retries(Status.Code.DEADLINE_EXCEEDED));
  }

  @Test
  public void badSettingsAreRejected() {
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.builder().maxAttempts(0));
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.builder().jitter(1.5));
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.builder().multiplier(0.5));
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.builder().initialBackoff(Duration.ZERO));
    assertThrows(IllegalArgumentException.class,
        () -> RetryPolicy.builder().initialBackoff(Duration.ofSeconds(5)).maxBackoff(Duration.ofSeconds(1)).build());
    assertThrows(IllegalArgumentException.class, () -> RetryPolicy.defaults().ceilingNanos(0));
  }
}
