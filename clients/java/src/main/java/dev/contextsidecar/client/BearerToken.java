package dev.contextsidecar.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import java.util.function.Supplier;

/** Adds {@code authorization: Bearer <token>}, the form the sidecar checks, to every call. */
final class BearerToken implements ClientInterceptor {
  static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final Supplier<String> token;

  BearerToken(Supplier<String> token) {
    this.token = token;
  }

  @Override
  public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
      MethodDescriptor<ReqT, RespT> method, CallOptions callOptions, Channel next) {
    return new ForwardingClientCall.SimpleForwardingClientCall<ReqT, RespT>(next.newCall(method, callOptions)) {
      @Override
      public void start(Listener<RespT> listener, Metadata headers) {
        String t = token.get();
        if (t != null && !t.isEmpty()) {
          headers.discardAll(AUTHORIZATION);
          headers.put(AUTHORIZATION, "Bearer " + t);
        }
        super.start(listener, headers);
      }
    };
  }
}
