"""The package's import rules (docs/design.md, "Layering"), checked on the source with the AST.

- the library (ops, λ, layers, losses, adapters, convert, models, data, kernels, and ``detect``, the Ultralytics
  integration built on layers and adapters) never imports ``train``, ``eval``, ``diagnostics``, ``studies`` or
  ``cli`` (``python -m diffattn`` is the CLI); every top-level module is placed in one of the two lists;
- ``eval`` and ``diagnostics`` never import ``train``, ``studies`` or ``cli``; ``train`` never imports ``studies`` or
  ``cli``; ``studies`` (the application layer that runs experiments) may import train, eval and diagnostics, and
  only ``cli`` imports it;
- no module-level import cycle inside the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "diffattn"
APPLICATION = ("train", "eval", "diagnostics", "studies", "cli", "__main__")
#: the library: everything an application layer may import (``detect`` sits after ``data``: it uses the ops, λ,
#: layers and adapters, and only ``eval`` and ``studies`` use it)
LIBRARY = ("__init__", "version", "_version", "errors", "extras", "formats", "io", "progress", "utils", "functional",
           "kernels", "lambdas", "layers", "losses", "adapters", "convert", "models", "openclip", "configs", "data",
           "detect")
FORBIDDEN = {"eval": ("train", "studies", "cli"), "diagnostics": ("train", "studies", "cli"),
             "train": ("studies", "cli"), "studies": ("cli",)}


def _module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, *, module_level_only: bool, src: Path = SRC) -> set[str]:
    """Fully qualified diffattn modules imported by ``path`` (relative imports resolved)."""
    name = _module_name(path, src)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "diffattn"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "diffattn":
                continue
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # `from . import x` imports a submodule
    return out


def _files(src: Path = SRC):
    return sorted(p for p in src.rglob("*.py"))


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(src: Path = SRC) -> list[str]:
    bad = []
    for path in _files(src):
        owner = _top(_module_name(path, src))
        for mod in _imports(path, module_level_only=False, src=src):
            target = _top(mod)
            if owner in APPLICATION:
                if target in FORBIDDEN.get(owner, ()):
                    bad.append(f"{_module_name(path, src)} imports {mod}")
            elif owner and target in APPLICATION:
                bad.append(f"{_module_name(path, src)} (library) imports {mod}")
    return bad


def test_every_module_has_a_layer():
    tops = {p.relative_to(SRC).parts[0].removesuffix(".py") for p in SRC.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    unplaced = sorted(tops - set(LIBRARY) - set(APPLICATION))
    assert unplaced == [], f"top-level modules in neither LIBRARY nor APPLICATION: {unplaced}"
    assert "detect" in LIBRARY and not set(LIBRARY) & set(APPLICATION)


def test_detect_is_library_code():
    """The detector integration imports no application layer (its study lives in diffattn.studies.detection)."""
    assert [b for b in _violations() if b.startswith("diffattn.detect")] == []


def test_layering_rules():
    bad = _violations()
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def test_no_import_cycle():
    modules = {_module_name(p): p for p in _files()}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for mod in _imports(path, module_level_only=True):
            while mod and mod not in modules:  # `from .x import name` → module x
                mod = mod.rsplit(".", 1)[0] if "." in mod else ""
            if mod and mod != name and not name.startswith(mod + "."):  # a package's own __init__ is not a cycle
                deps.add(mod)
        graph[name] = deps
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in graph[n]:
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n)


def test_rule_checker_sees_a_violation(tmp_path):
    """The checker is not vacuous: in a made-up tree, a model importing train and eval importing train (also
    lazily, inside a function) are both reported, and a model importing layers is not."""
    src = tmp_path / "diffattn"
    for pkg in ("models", "eval", "train", "layers"):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text("")
    (src / "__init__.py").write_text("")
    (src / "models" / "vit.py").write_text("from ..layers import Block\nfrom ..train import loop\n")
    (src / "eval" / "zero_shot.py").write_text("def f():\n    from diffattn.train.loop import run\n")
    bad = _violations(src)
    assert any(b.startswith("diffattn.models.vit (library) imports diffattn.train") for b in bad)
    assert any(b.startswith("diffattn.eval.zero_shot imports diffattn.train.loop") for b in bad)
    assert not any("layers" in b for b in bad)


def test_rule_checker_sees_a_studies_violation(tmp_path):
    """Only cli imports studies: train importing studies and studies importing cli are reported; studies importing
    train, eval and diagnostics, and cli importing studies, are not."""
    src = tmp_path / "diffattn"
    for pkg in ("studies", "train", "eval", "diagnostics"):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text("")
    (src / "__init__.py").write_text("")
    (src / "studies" / "noise.py").write_text("from ..train import loop\nfrom ..eval import language\n"
                                              "from ..diagnostics import capture\n")
    (src / "studies" / "bad.py").write_text("def f():\n    from ..cli import main\n")
    (src / "train" / "loop.py").write_text("from ..studies import noise\n")
    (src / "cli.py").write_text("from .studies import noise\n")
    bad = _violations(src)
    assert sorted({b.split(" imports ")[0] for b in bad}) == ["diffattn.studies.bad", "diffattn.train.loop"]
