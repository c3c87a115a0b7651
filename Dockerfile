# Context Sidecar: builds the package (gRPC stubs + Cython fastpath) and serves on 50051 as a non-root user.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY fastpath ./fastpath
COPY sidecar ./sidecar
RUN pip install --no-cache-dir . && python -c "import fastpath, sidecar.api.context_service_pb2; \
from sidecar.index.word_vectors import default_vectors; default_vectors()"

# A numeric user, so Kubernetes' runAsNonRoot can verify it (deploy/kubernetes runs as 10001 too).
# /data is created and owned before VOLUME so that a fresh volume starts out writable by it.
RUN groupadd --system --gid 10001 sidecar \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin sidecar \
    && mkdir -p /data && chown 10001:10001 /data
USER 10001:10001

# Inside a container the sidecar must bind all interfaces so the agent container can reach it.
# 9464: Prometheus metrics, when started with --metrics-listen 0.0.0.0:9464.
EXPOSE 50051 9464
VOLUME ["/data"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
r = g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=2); \
sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"
CMD ["python", "-m", "sidecar", "serve", "--db", "/data/sidecar.duckdb", "--listen", "0.0.0.0:50051"]
