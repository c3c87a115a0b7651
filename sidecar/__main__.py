import os

# numpy's BLAS pool fights the gRPC threads on a small pod (p99 of a 2k-vector search went from 0.5 ms
# to 27 ms): one BLAS thread, set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sidecar.cli import main  # noqa: E402

raise SystemExit(main())
