"""mqd.lazy_import: a placeholder imports its module on the first attribute read, then is a plain
module holding the real names (no per-access cost after), and still finds names added later."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from mqd.lazy_import import lazy_import


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("LOADS = []\nLOADS.append(1)\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_imports_on_first_attribute_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is imported until an attribute is read; then the module runs once and the
    placeholder becomes a plain module with the real module's names."""
    _module(tmp_path, monkeypatch, "lazy_probe_a")
    mod = lazy_import("lazy_probe_a")
    assert "lazy_probe_a" not in sys.modules
    assert mod.VALUE == 42
    real = sys.modules["lazy_probe_a"]
    assert type(mod) is types.ModuleType
    assert mod.LOADS is real.LOADS and real.LOADS == [1]
    monkeypatch.delitem(sys.modules, "lazy_probe_a")


def test_names_added_later_and_missing_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name set on the real module after the load is found through the placeholder; a name the
    module never had raises AttributeError as a module would."""
    _module(tmp_path, monkeypatch, "lazy_probe_b")
    mod = lazy_import("lazy_probe_b")
    assert mod.VALUE == 42
    vars(sys.modules["lazy_probe_b"])["LATER"] = "x"
    assert mod.LATER == "x"
    with pytest.raises(AttributeError):
        _ = mod.NEVER
    monkeypatch.delitem(sys.modules, "lazy_probe_b")


def test_an_imported_module_is_returned_as_is() -> None:
    """An already imported module costs nothing: it is returned itself, no placeholder."""
    assert lazy_import("json") is sys.modules["json"]
