"""The adapters package's structure: bindings depend only on the Binding protocol and the methods (and the
operator), never on core; one BINDINGS list; the public names keep working."""

from __future__ import annotations

import ast
from pathlib import Path

import diffattn
import diffattn.adapters as A
from diffattn.adapters.binding import Binding
from diffattn.adapters.bindings import BINDINGS

PKG = Path(A.__file__).parent
ALLOWED = {"diffattn.adapters.binding", "diffattn.adapters.methods", "diffattn.ops"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ["diffattn", "adapters", "bindings"][: 3 - (node.level - 1)]
            out.add(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("diffattn"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("diffattn")}
    return out


def test_bindings_import_only_the_protocol_methods_and_operator():
    files = sorted((PKG / "bindings").glob("*.py"))
    assert {f.stem for f in files} == {"__init__", "transformers", "timm", "open_clip", "ultralytics", "diffattn"}
    for f in files:
        if f.stem == "__init__":
            continue
        got = _imports(f)
        assert got <= ALLOWED, (f.name, got - ALLOWED)
        assert "diffattn.adapters.binding" in got and "diffattn.adapters.methods" in got


def test_one_list_of_bindings_all_typed():
    assert [type(b).__name__ for b in BINDINGS] == ["TransformersBinding", "TimmBinding", "OpenClipBinding",
                                                    "UltralyticsBinding", "DiffattnBinding"]
    assert all(isinstance(b, Binding) for b in BINDINGS)
    assert A.supported_families() == [f for b in BINDINGS for f in b.families]


def test_public_names():
    assert diffattn.retrofit is A.retrofit
    assert diffattn.save_adapter is A.save_adapter and diffattn.load_adapter is A.load_adapter
    for name in ("step", "attach_to_optimizer", "count_parameters", "lambda_summary", "RetrofitConfig",
                 "DiffAttnCallback", "adapters", "retrofit_config", "read_adapter"):
        assert callable(getattr(A, name)), name
    from transformers import TrainerCallback

    assert issubclass(A.DiffAttnCallback, TrainerCallback)
