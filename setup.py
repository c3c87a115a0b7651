"""Build hooks: compile the gRPC stubs from proto/ and the Cython fastpath on every install.

Both `pip install .` and `pip install -e .` run build_py (stubs) and build_ext (Cython), so a fresh
clone needs no manual step. Generated code lands in sidecar/api/ and is not committed.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "proto"
API_DIR = ROOT / "sidecar" / "api"


def generate_stubs() -> None:
    """Run grpcio-tools' protoc over proto/ and place flat modules in sidecar/api/."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {protos}")
        API_DIR.mkdir(parents=True, exist_ok=True)
        for path in Path(tmp).rglob("*_pb2*.py*"):
            text = path.read_text()
            # protoc writes absolute imports of the proto package; make them relative to sidecar.api.
            text = re.sub(r"^from context_sidecar\.v1 import", "from . import", text, flags=re.M)
            (API_DIR / path.name).write_text(text)
    init = API_DIR / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated gRPC stubs (built from proto/ at install time)."""\n')


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


# One extension module per fastpath/*.pyx (fastpath._selection, fastpath._textkeys, ...); cythonize
# follows their cimports of each other's .pxd files.
extensions = cythonize(
    [
        Extension(
            f"fastpath.{pyx.stem}",
            [str(pyx.relative_to(ROOT))],
            include_dirs=[numpy.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=["-O3"],
        )
        for pyx in sorted((ROOT / "fastpath").glob("*.pyx"))
    ],
    compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                         "cdivision": True, "initializedcheck": False},
)

if __name__ == "__main__":
    setup(ext_modules=extensions, cmdclass={"build_py": BuildPyWithStubs})
