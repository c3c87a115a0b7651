# Context Sidecar: builds the package (gRPC stubs + Cython fastpath) and serves on 50051.
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

# Inside a container the sidecar must bind all interfaces so the agent container can reach it.
EXPOSE 50051
VOLUME ["/data"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
r = g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(), timeout=2); \
sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"
CMD ["python", "-m", "sidecar", "serve", "--db", "/data/sidecar.duckdb", "--listen", "0.0.0.0:50051"]
