package dev.contextsidecar.client;

import com.google.protobuf.CodedInputStream;
import com.google.protobuf.CodedOutputStream;
import io.grpc.MethodDescriptor;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;

/**
 * {@code grpc.health.v1.Health/Check} without the grpc-services jar (Debian does not package it,
 * and a Maven user who has it would get duplicate {@code io.grpc.health.v1} classes from generated
 * ones): the two messages have one field each, so they are encoded by hand.
 *
 * <pre>
 * message HealthCheckRequest  { string service = 1; }
 * message HealthCheckResponse { enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2;
 *                               SERVICE_UNKNOWN = 3; } ServingStatus status = 1; }
 * </pre>
 */
final class HealthCheck {
  static final int UNKNOWN = 0;
  static final int SERVING = 1;
  static final int NOT_SERVING = 2;
  static final int SERVICE_UNKNOWN = 3;

  static final MethodDescriptor<String, Integer> CHECK =
      MethodDescriptor.<String, Integer>newBuilder()
          .setType(MethodDescriptor.MethodType.UNARY)
          .setFullMethodName(MethodDescriptor.generateFullMethodName("grpc.health.v1.Health", "Check"))
          .setRequestMarshaller(new RequestMarshaller())
          .setResponseMarshaller(new ResponseMarshaller())
          .setIdempotent(true)
          .build();

  private HealthCheck() {}

  static String statusName(int status) {
    switch (status) {
      case UNKNOWN: return "UNKNOWN";
      case SERVING: return "SERVING";
      case NOT_SERVING: return "NOT_SERVING";
      case SERVICE_UNKNOWN: return "SERVICE_UNKNOWN";
      default: return "status " + status;
    }
  }

  private static final class RequestMarshaller implements MethodDescriptor.Marshaller<String> {
    @Override
    public InputStream stream(String service) {
      try {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        CodedOutputStream out = CodedOutputStream.newInstance(bytes);
        if (!service.isEmpty()) {
          out.writeString(1, service);
        }
        out.flush();
        return new ByteArrayInputStream(bytes.toByteArray());
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    @Override
    public String parse(InputStream stream) {
      try {
        CodedInputStream in = CodedInputStream.newInstance(stream);
        String service = "";
        for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
          if (tag == ((1 << 3) | 2)) {
            service = in.readStringRequireUtf8();
          } else if (!in.skipField(tag)) {
            break;
          }
        }
        return service;
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }

  private static final class ResponseMarshaller implements MethodDescriptor.Marshaller<Integer> {
    @Override
    public InputStream stream(Integer status) {
      try {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        CodedOutputStream out = CodedOutputStream.newInstance(bytes);
        if (status != 0) {
          out.writeEnum(1, status);
        }
        out.flush();
        return new ByteArrayInputStream(bytes.toByteArray());
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    @Override
    public Integer parse(InputStream stream) {
      try {
        CodedInputStream in = CodedInputStream.newInstance(stream);
        int status = UNKNOWN;
        for (int tag = in.readTag(); tag != 0; tag = in.readTag()) {
          if (tag == ((1 << 3) | 0)) {
            status = in.readEnum();
          } else if (!in.skipField(tag)) {
            break;
          }
        }
        return status;
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }
}
