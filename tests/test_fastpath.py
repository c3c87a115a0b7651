"""fastpath as a package: every concern is a compiled extension module, re-exported under the same
names as its plain-Python twin in fastpath.reference."""

from __future__ import annotations

import importlib.machinery

import pytest

import fastpath
from fastpath import reference as ref

MODULES = ["_common", "_selection", "_textkeys", "_wire", "_ranking", "_int8"]


@pytest.mark.parametrize("name", MODULES)
def test_compiled_extensions_are_loaded(name):
    module = importlib.import_module(f"fastpath.{name}")
    assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_every_routine_has_its_reference_twin():
    for name in fastpath.__all__:
        if name != "reference":
            assert hasattr(ref, name), name
    assert fastpath.select is not ref.select
    assert fastpath.Selection is ref.Selection
    for name in ("SELECTED", "OVER_BUDGET", "DUPLICATE", "LOW_SCORE"):
        assert getattr(fastpath, name) == getattr(ref, name)
