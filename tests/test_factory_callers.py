"""Every caller builds and loads models through the factory (``diffattn.factory.create_model`` /
``from_pretrained``), not through the convenience re-export of the package ``diffattn.models``, whose edge to the
factory points down the layering table."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "diffattn"
FACTORY_NAMES = {"create_model", "from_pretrained", "load_run"}
#: files still taking the factory's names from diffattn.models (on branches being refactored); may only shrink
PENDING: set[str] = set()


def _takes_factory_names_from_models(path: Path) -> bool:
    pkg = ["diffattn", *path.relative_to(SRC).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and FACTORY_NAMES & {a.name for a in node.names}:
            mod = ".".join(pkg[: len(pkg) - node.level + 1] + [node.module or ""]) if node.level else node.module
            if mod == "diffattn.models":
                return True
    return False


def test_callers_go_through_the_factory():
    found = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
             if not p.relative_to(SRC).as_posix().startswith("models/") and _takes_factory_names_from_models(p)}
    assert found <= PENDING, f"import create_model / from_pretrained from diffattn.factory: {sorted(found - PENDING)}"
    assert not any(p.startswith("studies/") or p.startswith("cli/") for p in found)
    assert found == PENDING, f"remove from PENDING: {sorted(PENDING - found)}"
