package dev.contextsidecar.client;

import io.grpc.Status;
import java.time.Duration;
import java.util.Collections;
import java.util.EnumSet;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;

/**
 * When and how {@link SidecarClient} retries a call: up to {@code maxAttempts} attempts in all, on
 * the status codes in {@code retryOn} (by default only {@code UNAVAILABLE}), sleeping an
 * exponentially growing, jittered backoff between attempts. Immutable.
 *
 * <p>Only calls that are safe to repeat are retried: reads, and writes that carry an
 * {@code idempotency_key} (the client sets one per logical call unless told not to; see
 * {@link SidecarClient.Builder#autoIdempotencyKeys}). A retry never outlives the call's deadline.
 *
 * <p>The backoff before retry {@code n} (1 for the second attempt) is drawn uniformly from
 * {@code [d * (1 - jitter), d]} where {@code d = min(maxBackoff, initialBackoff * multiplier^(n-1))}.
 */
public final class RetryPolicy {
  private static final RetryPolicy DEFAULTS = builder().build();
  private static final RetryPolicy NONE = builder().maxAttempts(1).build();

  private final int maxAttempts;
  private final Duration initialBackoff;
  private final Duration maxBackoff;
  private final double multiplier;
  private final double jitter;
  private final Set<Status.Code> retryOn;

  private RetryPolicy(Builder b) {
    this.maxAttempts = b.maxAttempts;
    this.initialBackoff = b.initialBackoff;
    this.maxBackoff = b.maxBackoff;
    this.multiplier = b.multiplier;
    this.jitter = b.jitter;
    this.retryOn = Collections.unmodifiableSet(EnumSet.copyOf(b.retryOn));
  }

  /** 4 attempts, backoff 100 ms doubling up to 2 s, jitter 0.5, on UNAVAILABLE. */
  public static RetryPolicy defaults() {
    return DEFAULTS;
  }

  /** One attempt: no retries. */
  public static RetryPolicy none() {
    return NONE;
  }

  public static Builder builder() {
    return new Builder();
  }

  public Builder toBuilder() {
    Builder b = new Builder();
    b.maxAttempts = maxAttempts;
    b.initialBackoff = initialBackoff;
    b.maxBackoff = maxBackoff;
    b.multiplier = multiplier;
    b.jitter = jitter;
    b.retryOn = EnumSet.copyOf(retryOn);
    return b;
  }

  public int maxAttempts() {
    return maxAttempts;
  }

  public Duration initialBackoff() {
    return initialBackoff;
  }

  public Duration maxBackoff() {
    return maxBackoff;
  }

  public double multiplier() {
    return multiplier;
  }

  public double jitter() {
    return jitter;
  }

  public Set<Status.Code> retryOn() {
    return retryOn;
  }

  /** Whether a failed attempt with this code may be retried (for a call that is safe to repeat). */
  public boolean retries(Status.Code code) {
    return retryOn.contains(code);
  }

  /** The upper bound of the backoff before retry {@code retry} (1-based), before jitter. */
  public long ceilingNanos(int retry) {
    if (retry < 1) {
      throw new IllegalArgumentException("retry is 1-based, got " + retry);
    }
    double d = initialBackoff.toNanos() * Math.pow(multiplier, retry - 1);
    return (long) Math.min((double) maxBackoff.toNanos(), d);
  }

  /** The backoff before retry {@code retry} (1-based): jittered down from {@link #ceilingNanos}. */
  public long backoffNanos(int retry) {
    long ceiling = ceilingNanos(retry);
    double factor = 1.0 - jitter * ThreadLocalRandom.current().nextDouble();
    return (long) (ceiling * factor);
  }

  @Override
  public String toString() {
    return "RetryPolicy{maxAttempts=" + maxAttempts + ", initialBackoff=" + initialBackoff + ", maxBackoff="
        + maxBackoff + ", multiplier=" + multiplier + ", jitter=" + jitter + ", retryOn=" + retryOn + "}";
  }

  /** Builds a {@link RetryPolicy}; starts from the defaults. */
  public static final class Builder {
    private int maxAttempts = 4;
    private Duration initialBackoff = Duration.ofMillis(100);
    private Duration maxBackoff = Duration.ofSeconds(2);
    private double multiplier = 2.0;
    private double jitter = 0.5;
    private Set<Status.Code> retryOn = EnumSet.of(Status.Code.UNAVAILABLE);

    private Builder() {}

    /** Attempts in all, the first included (1 = no retries). */
    public Builder maxAttempts(int n) {
      if (n < 1) {
        throw new IllegalArgumentException("maxAttempts must be >= 1, got " + n);
      }
      this.maxAttempts = n;
      return this;
    }

    public Builder initialBackoff(Duration d) {
      this.initialBackoff = positive(d, "initialBackoff");
      return this;
    }

    public Builder maxBackoff(Duration d) {
      this.maxBackoff = positive(d, "maxBackoff");
      return this;
    }

    /** Growth factor of the backoff per retry (>= 1). */
    public Builder multiplier(double m) {
      if (!(m >= 1.0) || Double.isInfinite(m)) {
        throw new IllegalArgumentException("multiplier must be >= 1, got " + m);
      }
      this.multiplier = m;
      return this;
    }

    /** The fraction of the backoff that is random, 0 (none) to 1 (full jitter). */
    public Builder jitter(double j) {
      if (!(j >= 0.0 && j <= 1.0)) {
        throw new IllegalArgumentException("jitter must be in [0, 1], got " + j);
      }
      this.jitter = j;
      return this;
    }

    /** The status codes retried (default UNAVAILABLE only). */
    public Builder retryOn(Status.Code first, Status.Code... rest) {
      this.retryOn = EnumSet.of(Objects.requireNonNull(first), rest);
      return this;
    }

    public RetryPolicy build() {
      if (maxBackoff.compareTo(initialBackoff) < 0) {
        throw new IllegalArgumentException("maxBackoff " + maxBackoff + " < initialBackoff " + initialBackoff);
      }
      return new RetryPolicy(this);
    }

    private static Duration positive(Duration d, String what) {
      if (d == null || d.isNegative() || d.isZero()) {
        throw new IllegalArgumentException(what + " must be > 0, got " + d);
      }
      return d;
    }
  }
}
