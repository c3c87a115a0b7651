package dev.contextsidecar.client;

import com.google.protobuf.Descriptors.FieldDescriptor;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A test interceptor on one RPC: counts its attempts, records the idempotency_key each attempt
 * carried, and fails the first {@code n} attempts with
 * UNAVAILABLE, either before they leave ({@link #refuse}) or after the sidecar has done the work
 * ({@link #loseAnswers}: the answer is dropped, as when a connection breaks on the way back).
 */
final class Faults implements ClientInterceptor {
  private enum Mode { COUNT, REFUSE, LOSE_ANSWER }

  private final String method;
  private final Mode mode;
  private final AtomicInteger failuresLeft;
  final AtomicInteger attempts = new AtomicInteger();
  final List<String> keys = Collections.synchronizedList(new ArrayList<>());
  final List<Long> startNanos = Collections.synchronizedList(new ArrayList<>());

  private Faults(String method, Mode mode, int failures) {
    this.method = method;
    this.mode = mode;
    this.failuresLeft = new AtomicInteger(failures);
  }

  /** Only counts and records the attempts of {@code method} (a bare name: "AppendMessages"). */
  static Faults count(String method) {
    return new Faults(method, Mode.COUNT, 0);
  }

  /** The first {@code n} attempts of {@code method} fail with UNAVAILABLE before reaching the sidecar. */
  static Faults refuse(String method, int n) {
    return new Faults(method, Mode.REFUSE, n);
  }

  /** The first {@code n} attempts reach the sidecar, which does the work; their answers are lost. */
  static Faults loseAnswers(String method, int n) {
    return new Faults(method, Mode.LOSE_ANSWER, n);
  }

  @Override
  public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
      MethodDescriptor<ReqT, RespT> md, CallOptions callOptions, Channel next) {
    if (!method.equals(md.getBareMethodName())) {
      return next.newCall(md, callOptions);
    }
    attempts.incrementAndGet();
    startNanos.add(System.nanoTime());
    boolean fail = mode != Mode.COUNT && failuresLeft.getAndDecrement() > 0;
    if (fail && mode == Mode.REFUSE) {
      return new ClientCall<ReqT, RespT>() {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          listener.onClose(Status.UNAVAILABLE.withDescription("injected: refused"), new Metadata());
        }

        @Override
        public void request(int n) {}

        @Override
        public void cancel(String message, Throwable cause) {}

        @Override
        public void halfClose() {}

        @Override
        public void sendMessage(ReqT message) {
          recordKey(message);
        }
      };
    }
    return new ForwardingClientCall.SimpleForwardingClientCall<ReqT, RespT>(next.newCall(md, callOptions)) {
      @Override
      public void start(Listener<RespT> listener, Metadata headers) {
        Listener<RespT> l = !fail ? listener
            : new ForwardingClientCallListener.SimpleForwardingClientCallListener<RespT>(listener) {
              @Override
              public void onMessage(RespT message) {
                // dropped: the sidecar did the work, the client never hears of it
              }

              @Override
              public void onClose(Status status, Metadata trailers) {
                super.onClose(Status.UNAVAILABLE.withDescription("injected: answer lost (was " + status.getCode()
                    + ")"), new Metadata());
              }
            };
        super.start(l, headers);
      }

      @Override
      public void sendMessage(ReqT message) {
        recordKey(message);
        super.sendMessage(message);
      }
    };
  }

  private void recordKey(Object message) {
    if (message instanceof com.google.protobuf.Message) {
      com.google.protobuf.Message m = (com.google.protobuf.Message) message;
      FieldDescriptor f = m.getDescriptorForType().findFieldByName("idempotency_key");
      keys.add(f == null ? null : (String) m.getField(f));
    }
  }
}
