"""The package's import rules (docs/design.md, "Layering"), checked on the source with the AST.

- the library (base, ops, λ, layers, losses, adapters, data, models, convert, factory, detect) never imports
  ``train``, ``eval``, ``diagnostics``, ``studies``, ``app`` or ``cli`` (``python -m diffattn`` is the CLI);
  ``detect``, the Ultralytics integration, uses the library and only the application layers import it;
- ``diagnostics`` never imports ``eval``, ``train``, ``studies``, ``app`` or ``cli``; ``eval`` may import
  ``diagnostics`` (maps for its benchmarks) but never ``train``, ``studies``, ``app`` or ``cli``; ``train`` may import
  ``eval`` (validation) but never ``studies``, ``app`` or ``cli``; ``studies`` (the application layer that runs
  experiments) may import train, eval and diagnostics, never ``app`` or ``cli``; only ``app`` (the commands) imports
  it, and only ``cli`` imports ``app``;
- no import cycle among the package's modules, counting function-level imports and package re-exports
  (:func:`import_graph`);
- docs/design.md's layering table is that graph: each layer imports exactly the layers its row names.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the package checked; DIFFATTN_LAYERING_SRC=<another checkout>/src runs the checks on that tree instead
SRC = Path(os.environ.get("DIFFATTN_LAYERING_SRC", ROOT / "src")).resolve() / "diffattn"
APPLICATION = ("train", "eval", "diagnostics", "studies", "app", "cli", "__main__")
FORBIDDEN = {"eval": ("train", "studies", "app", "cli"), "diagnostics": ("eval", "train", "studies", "app", "cli"),
             "train": ("studies", "app", "cli"), "studies": ("app", "cli"), "app": ("cli",)}
#: library packages only the application layers import
INTEGRATIONS = ("detect",)
DESIGN = ROOT / "docs" / "design.md"


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
            for a in node.names:  # `from . import x` imports submodule x; `from . import name`, the package
                out.add(f"{mod}.{a.name}" if _is_module(f"{mod}.{a.name}", src) else mod)
    return out


def _is_module(mod: str, src: Path = SRC) -> bool:
    path = src.parent.joinpath(*mod.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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
            elif owner and target in INTEGRATIONS and target != owner:
                bad.append(f"{_module_name(path, src)} (library) imports the integration {mod}")
    return bad


def test_layering_rules():
    bad = _violations()
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each library module → the library modules it imports, counting every import that can run: module level,
    inside functions and methods (a lazy import still runs, it only runs later), under ``if TYPE_CHECKING:`` and a
    literal ``importlib.import_module("diffattn.x")``. How an import is counted (grimp's, i.e. import-linter's, rule):

    - ``import diffattn.a.b`` and ``from diffattn.a.b import name`` depend on ``diffattn.a.b``;
    - ``from diffattn.a import b`` where ``diffattn.a.b`` is a module depends on that module only: Python runs
      ``diffattn/a/__init__.py`` first, as it does for any submodule, but the name comes from ``b``; the implicit
      import of a parent package is not an edge;
    - ``from diffattn.a import name`` where ``name`` is not a module depends on the package ``diffattn.a``, which
      re-exports it; and a package ``__init__`` depends on every module it re-exports from, eagerly or lazily
      (PEP 562 ``__getattr__``). So a lazy re-export is an ordinary edge: a module that takes a name from a package
      above it, which re-exports from it, closes a cycle.

    The root's ``__getattr__`` builds its module names from ``_LAZY`` (``importlib.import_module(f"...")``);
    :func:`test_the_root_declares_its_lazy_imports` checks that its ``TYPE_CHECKING`` imports, counted here, name
    each of them."""
    modules = {_module_name(p, src): p for p in _files(src)}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for mod in _imports(path, module_level_only=False, src=src) | _dynamic_imports(path, src):
            while mod and mod not in modules:  # `from .x import name` → module x
                mod = mod.rsplit(".", 1)[0] if "." in mod else ""
            deps.add(mod)
        graph[name] = deps - {name, ""}
    return graph


def _dynamic_imports(path: Path, src: Path = SRC) -> set[str]:
    """The library modules ``importlib.import_module`` may import in ``path``: a literal name
    (``import_module("diffattn.x")``), or, for a computed one, every library module name held as a string constant
    in ``path`` or in the module it takes the table from (``import_module(STUDY_MODULES[name])`` with
    ``from .config import STUDY_MODULES``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "import_module" and n.args]
    if not calls:
        return set()
    if path.name == "__init__.py" and _discovers_submodules(tree):  # every module of the package may be imported
        pkg = _module_name(path, src)
        return {f"{pkg}.{p.stem}" if p.is_file() else f"{pkg}.{p.name}" for p in path.parent.iterdir()
                if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    trees = [tree]
    used = {n.id for c in calls for n in ast.walk(c.args[0]) if isinstance(n, ast.Name)}
    name = _module_name(path, src)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and used & {a.asname or a.name for a in node.names}:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            origin = src.parent.joinpath(*base, *(node.module or "").split("."))
            for candidate in (origin.with_suffix(".py"), origin / "__init__.py"):
                if candidate.is_file():
                    trees.append(ast.parse(candidate.read_text(encoding="utf-8")))
    return {n.value for t in trees for n in ast.walk(t) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.fullmatch(r"diffattn(\.\w+)+", n.value)}


def _discovers_submodules(tree: ast.AST) -> bool:
    """Whether a package ``__init__`` lists its own modules (``pkgutil.iter_modules(__path__)``) to import them:
    then it depends on each of them, as if it named them all."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "iter_modules"
               and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "__path__" for n in ast.walk(tree))


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972), each sorted; iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _describe(graph: dict[str, set[str]], cycles: list[list[str]]) -> str:
    lines = []
    for comp in cycles:
        lines.append(f"{len(comp)} modules: " + ", ".join(comp))
        lines += [f"    {m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp]
    return "\n".join(lines)


def test_no_import_cycle():
    """No cycle among the package's modules, counting lazy (function-level) imports and package re-exports
    (:func:`import_graph`); lazy imports are for optional third-party libraries, not for hiding a cycle."""
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (strongly connected components):\n" + _describe(graph, cycles)


def test_the_root_declares_its_lazy_imports():
    """``diffattn.__getattr__`` imports ``diffattn.<_LAZY[name]>`` and ``diffattn.<_SUBMODULES>``: each is an
    edge of the root in :func:`import_graph` (through its ``TYPE_CHECKING`` imports), so the cycle check sees them."""
    import diffattn

    lazy = {f"diffattn.{m}" for m in (*diffattn._LAZY.values(), *diffattn._SUBMODULES)}
    assert lazy <= import_graph()["diffattn"], sorted(lazy - import_graph()["diffattn"])


def test_cycle_checker_sees_lazy_and_re_export_cycles(tmp_path):
    """The checker is not vacuous: a function-level import closing a loop, a module taking a name from its own
    package's ``__init__`` that re-exports it lazily, and a literal ``importlib.import_module`` are all cycles;
    ``from . import sub`` (a submodule, not the package) and an import of an optional library are not."""
    src = tmp_path / "diffattn"
    for pkg in ("a", "b", "c"):
        (src / pkg).mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "a" / "__init__.py").write_text("def __getattr__(name):\n    from .x import f\n    return f\n")
    (src / "a" / "x.py").write_text("from . import y\ndef f():\n    from diffattn.a import g\n")  # via a's __init__
    (src / "a" / "y.py").write_text("import torch\n")
    (src / "b" / "__init__.py").write_text("")
    (src / "b" / "p.py").write_text("def f():\n    from .q import g\n")
    (src / "b" / "q.py").write_text("from .p import f\n")
    (src / "c" / "__init__.py").write_text("from . import s\n")
    (src / "c" / "s.py").write_text("import importlib\ndef f():\n    importlib.import_module('diffattn.c.t')\n")
    (src / "c" / "t.py").write_text("from . import s\n")
    graph = import_graph(src)
    assert graph["diffattn.a.x"] == {"diffattn.a", "diffattn.a.y"}
    assert import_cycles(graph) == [["diffattn.a", "diffattn.a.x"], ["diffattn.b.p", "diffattn.b.q"],
                                    ["diffattn.c.s", "diffattn.c.t"]]
    (src / "a" / "x.py").write_text("from . import y\n")
    (src / "b" / "p.py").write_text("")
    (src / "c" / "t.py").write_text("")
    assert import_cycles(import_graph(src)) == []


def test_dynamic_imports_are_visible():
    """Every ``importlib.import_module`` of a computed name is seen by :func:`import_graph`: the module holds its
    targets as literal module names (a table), or it is the root, whose targets the next test checks."""
    hidden = []
    for path in _files():
        name = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        computed = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "import_module" and not isinstance(n.args[0], ast.Constant)]
        if computed and name != "diffattn" and not _dynamic_imports(path):
            hidden.append(name)
    assert not hidden, f"importlib.import_module of names the cycle check cannot see in {hidden}"


def _layer_table(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(layer, its modules, the layers it imports) per row of the "Layering" table, in table order."""
    section = text.split("## 1. Layering", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        modules = re.findall(r"`(diffattn(?:\.\w+)?)`", cells[1])
        imports = [] if cells[2] in ("—", "") else [c.strip() for c in cells[2].split(",")]
        rows.append((cells[0], modules, imports))
    return rows


def test_design_table_is_the_import_graph():
    """docs/design.md's layering table lists every top-level module once, in an order where each layer imports only
    layers above it, and each row's "imports" are exactly the layers its modules import. The one kind of edge the
    column leaves out is a package ``__init__`` re-exporting, for convenience, from a layer further down
    (``diffattn.models`` → factory, convert); no other module may import downwards."""
    rows = _layer_table(DESIGN.read_text(encoding="utf-8"))
    layer_of = {m: layer for layer, modules, _ in rows for m in modules}
    order = {layer: i for i, (layer, _, _) in enumerate(rows)}
    tops = {".".join(_module_name(p).split(".")[:2]) for p in _files()}
    assert tops == set(layer_of), f"not in the table: {sorted(tops - set(layer_of))}; " \
                                  f"not in the code: {sorted(set(layer_of) - tops)}"
    graph = import_graph()
    found: dict[str, set[str]] = {layer: set() for layer in order}
    downwards = []
    for mod, deps in graph.items():
        layer = layer_of[".".join(mod.split(".")[:2])]
        for dep in deps:
            other = layer_of[".".join(dep.split(".")[:2])]
            if other == layer:
                continue
            if order[other] > order[layer]:
                is_init = (SRC.parent / Path(*mod.split(".")) / "__init__.py").is_file()
                if not is_init:
                    downwards.append(f"{mod} ({layer}) -> {dep} ({other})")
                continue
            found[layer].add(other)
    assert not downwards, "imports of a layer further down the table:\n" + "\n".join(downwards)
    declared = {layer: set(imports) for layer, _, imports in rows}
    wrong = {layer: (sorted(found[layer]), sorted(declared[layer])) for layer in order
             if found[layer] != declared[layer]}
    assert not wrong, f"layer: (imports in the code, imports in the table): {wrong}"


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
    """Only the application layers above it import studies: train importing studies and studies importing cli or app
    are reported; studies importing train, eval and diagnostics, and app or cli importing studies, are not."""
    src = tmp_path / "diffattn"
    for pkg in ("studies", "train", "eval", "diagnostics"):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text("")
    (src / "__init__.py").write_text("")
    (src / "studies" / "noise.py").write_text("from ..train import loop\nfrom ..eval import language\n"
                                              "from ..diagnostics import capture\n")
    (src / "studies" / "bad.py").write_text("def f():\n    from ..cli import main\n")
    (src / "studies" / "worse.py").write_text("from ..app import study\n")
    (src / "train" / "loop.py").write_text("from ..studies import noise\n")
    (src / "cli.py").write_text("from .studies import noise\n")
    (src / "app").mkdir()
    (src / "app" / "__init__.py").write_text("")
    (src / "app" / "study.py").write_text("from ..studies import noise\n")
    bad = _violations(src)
    assert sorted({b.split(" imports ")[0] for b in bad}) == ["diffattn.studies.bad", "diffattn.studies.worse",
                                                              "diffattn.train.loop"]


def test_package_discovery_counts_as_importing_every_module():
    """adapters.methods imports its method files by listing its own package: the graph has an edge to each."""
    graph = import_graph()
    methods_dir = SRC / "adapters" / "methods"
    files = {f"diffattn.adapters.methods.{p.stem}" for p in methods_dir.glob("*.py") if p.name != "__init__.py"}
    assert files <= graph["diffattn.adapters.methods"]
