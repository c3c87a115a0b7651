"""Plain-Python reference implementation of the fastpath routines: the readable spec.

Every routine here has a compiled twin in the fastpath extension module of the same concern
(``selection`` -> ``fastpath._selection``, ``textkeys`` -> ``fastpath._textkeys``, ``wire``,
``ranking``, ``int8``, ``marks`` likewise) that must return identical results (bit-identical floats). The
algorithms use lists, loops and the ``math`` module only; numpy is used solely to validate inputs
and to package outputs, never for the computation itself. Each module's docstring states its rules.

This package re-exports every module's ``__all__``, so ``fastpath.reference.X`` is the twin of
``fastpath.X``.
"""

# The star imports take exactly each twin module's __all__.
# ruff: noqa: F403
from fastpath.reference import int8, marks, ranking, selection, textkeys, wire
from fastpath.reference._common import MASK64
from fastpath.reference.int8 import *
from fastpath.reference.marks import *
from fastpath.reference.ranking import *
from fastpath.reference.selection import *
from fastpath.reference.textkeys import *
from fastpath.reference.wire import *

__all__ = ["MASK64", *selection.__all__, *textkeys.__all__, *wire.__all__, *ranking.__all__, *int8.__all__,
           *marks.__all__]
