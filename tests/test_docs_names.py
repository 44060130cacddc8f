"""Every dotted name of diffattn that the documentation writes still names something: ``diffattn.x.y`` (and
``diffattn.x.Y.z``) in README.md, docs/**/*.md and the module, class and function docstrings of src/diffattn, plain
or in a Sphinx role (``:func:`~diffattn.x.y```, ``:class:`.x.Y``` relative to the docstring's module), imports (the
longest importable module prefix) and getattrs (the rest) to an object, and not through a deprecated spelling (a row
of :data:`diffattn.deprecations.DEPRECATIONS`). A name under an optional extra that is not installed is skipped,
and the skip lists it.

Conventions the collection follows: ``<…>`` is a placeholder (``diffattn.studies.<name>`` is read as
``diffattn.studies``); a name after or before a ``/`` is a path, not a dotted name (``src/diffattn/models/vit.py``,
``diffattn/configs/tiny.yaml``), and so is one ending in a file suffix (``.py``, ``.yaml``, …); a deprecated name is
allowed on a line that calls it deprecated or names its replacement (the table of docs/design.md, "Deprecated
spellings"), as the documentation of the deprecation rather than a use.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from diffattn.deprecations import DEPRECATIONS

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "diffattn"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: a dotted name of diffattn in prose or code: not part of a path (no ``/`` either side) nor of a longer word
NAME = re.compile(r"(?<![\w/.\-])diffattn(?:\.[A-Za-z_]\w*)+(?![\w/\-])")
#: a Sphinx cross-reference role and its target (``~`` shortens the rendered text; ``title <target>`` names one)
ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|obj|exc):`([^`]+)`")
#: the last component of a file name written like a dotted name (``diffattn.models.vit.py``)
FILE_SUFFIXES = {"py", "pyi", "md", "yaml", "yml", "json", "jsonl", "toml", "txt", "cfg", "ini", "csv", "log", "pt",
                 "bin", "safetensors", "onnx", "egg", "whl", "gz", "zip"}
#: names that are gone without an alias (an alias would make a lower layer import the application layer that now
#: holds them), which the migration notes cite as what the user wrote before → the pages that may cite them; each
#: must still not resolve (:func:`test_former_names_are_gone`)
FORMER = {
    "diffattn.detect.compare": {"docs/studies.md", "docs/detection.md"},
    "diffattn.detect.compare.run_compare": {"docs/studies.md"},
    "diffattn.train.tasks.vlm.llava_compare": {"docs/studies.md"},
    "diffattn.data.prepare": {"docs/studies.md"},
}
#: the message of :func:`diffattn.deprecations.warn_deprecated`; only these warnings become errors while resolving
DEPRECATED_MESSAGE = r".* is deprecated since diffattn "


@dataclass(frozen=True)
class Mention:
    """A name as written at ``where`` (``path:line``); ``candidates``: the absolute names it may mean (one, or the
    readings of a relative role), the first that resolves is the one meant."""

    where: str
    written: str
    candidates: tuple[str, ...]
    line: str


def _names_in(text: str) -> list[tuple[int, str]]:
    """(offset, name) of the plain dotted names of ``text``, file names left out."""
    return [(m.start(), m.group()) for m in NAME.finditer(text) if m.group().rsplit(".", 1)[-1] not in FILE_SUFFIXES]


def _role_targets(text: str) -> list[tuple[int, str]]:
    """(offset, target) of the Sphinx roles of ``text`` that name diffattn or are relative (``.x.y``)."""
    found = []
    for m in ROLE.finditer(text):
        target = m.group(1)
        if "<" in target and target.endswith(">"):
            target = target[target.rindex("<") + 1:-1]
        target = target.lstrip("~").removesuffix("()").strip()  # whitespace inside stays: it breaks the reference
        if target.startswith(".") or target.startswith("diffattn."):
            found.append((m.start(), target))
    return found


def _line_of(text: str, offset: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text.count("\n", 0, offset), text[start:end if end != -1 else len(text)]


def _relative(target: str, module: str, is_package: bool, owner: str | None) -> tuple[str, ...]:
    """The readings of a relative role ``target`` (``.x.y``, ``..x``) in ``module``: against its package as a
    relative import reads it, then against the module itself and the class whose docstring holds it."""
    dots = len(target) - len(target.lstrip("."))
    rest = target[dots:]
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(dots - 1):
        package = package.rpartition(".")[0]
    readings = [f"{package}.{rest}"]
    if dots == 1 and not is_package:
        readings.append(f"{module}.{rest}")
    if dots == 1 and owner:
        readings.append(f"{module}.{owner}.{rest}")
    return tuple(dict.fromkeys(readings))


def _doc_mentions(path: Path) -> list[Mention]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT).as_posix()
    mentions = []
    for offset, name in _names_in(text):
        n, line = _line_of(text, offset)
        mentions.append(Mention(f"{where}:{n + 1}", name, (name,), line))
    return mentions


def _docstrings(tree: ast.Module) -> list[tuple[ast.Constant, str | None]]:
    """The docstring nodes of a module, its classes and functions (nested too), each with the name of the class it
    belongs to (a class's own docstring or a method's), or None."""
    found = []

    def visit(node: ast.AST, owner: str | None) -> None:
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.value, node.name if isinstance(node, ast.ClassDef) else owner))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{owner}.{child.name}" if owner else child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, owner)
            elif not isinstance(child, (ast.expr, ast.Lambda)):
                visit(child, owner)

    visit(tree, None)
    return found


def _source_mentions(path: Path) -> list[Mention]:
    rel = path.relative_to(SRC.parent)
    is_package = path.name == "__init__.py"
    module = ".".join(rel.parent.parts if is_package else rel.with_suffix("").parts)
    return _docstring_mentions(path.read_text(encoding="utf-8"), module, is_package, path.relative_to(ROOT).as_posix())


def _docstring_mentions(source: str, module: str, is_package: bool, where: str) -> list[Mention]:
    """The names of the docstrings of ``source``, the source of ``module`` at the path ``where``."""
    lines, mentions = source.splitlines(keepends=True), []
    for node, owner in _docstrings(ast.parse(source)):
        raw = "".join(lines[node.lineno - 1:node.end_lineno])  # the docstring's lines as written
        seen = set()
        for offset, target in sorted(_role_targets(raw) + _names_in(raw)):
            n, line = _line_of(raw, offset)
            if (n, target) in seen:
                continue
            seen.add((n, target))
            candidates = _relative(target, module, is_package, owner) if target.startswith(".") else (target,)
            mentions.append(Mention(f"{where}:{node.lineno + n}", target, candidates, line))
    return mentions


def collect() -> list[Mention]:
    """Every mention of a diffattn name in the documentation and the docstrings."""
    mentions = [m for path in DOCS for m in _doc_mentions(path)]
    return mentions + [m for path in sorted(SRC.rglob("*.py")) for m in _source_mentions(path)]


@dataclass(frozen=True)
class Resolution:
    """What a name gave: ``status`` is "ok", "missing", "deprecated" (``detail``: what to use) or "optional"
    (``detail``: the third-party module that is not installed)."""

    status: str
    detail: str = ""


def _deprecated_row(name: str) -> tuple[str, str] | None:
    """(old spelling, replacement) when ``name`` or a package above it is a row of the deprecation table."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        row = DEPRECATIONS.get(".".join(parts[:i]))
        if row is not None:
            return ".".join(parts[:i]), row.replacement
    return None


def _third_party(error: ImportError) -> str | None:
    """The module outside diffattn whose absence (or failed import) ``error`` reports, else None."""
    missing = error.name or ""
    if missing and missing.split(".")[0] != "diffattn":
        return missing
    return None


def _declared(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base) annotates or slots ``name``: an attribute of its instances only."""
    return any(name in vars(c).get("__annotations__", {}) or name in (getattr(c, "__slots__", ()) or ())
               for c in cls.__mro__)


@functools.cache
def resolve(name: str) -> Resolution:
    """Import the longest importable module prefix of ``name``, getattr the rest, with diffattn's deprecation
    warnings turned into errors."""
    row = _deprecated_row(name)
    if row is not None:
        return Resolution("deprecated", row[1])
    parts = name.split(".")
    if parts[-1] == "__main__":  # a script: found, never run
        found = importlib.util.find_spec(name) is not None
        return Resolution("ok") if found else Resolution("missing", f"no module {name!r}")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=DEPRECATED_MESSAGE, category=FutureWarning)
        try:
            for i in range(len(parts), 0, -1):
                module_name = ".".join(parts[:i])
                try:
                    obj = importlib.import_module(module_name)
                    break
                except ModuleNotFoundError as e:
                    if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
                        continue  # this prefix is not a module: the next component is an attribute
                    raise
            else:
                return Resolution("missing", f"no module {parts[0]!r}")
            for j in range(i, len(parts)):
                if hasattr(obj, parts[j]):
                    obj = getattr(obj, parts[j])
                elif isinstance(obj, type) and j == len(parts) - 1 and _declared(obj, parts[j]):
                    break  # an instance attribute the class declares (a dataclass field without a default)
                else:
                    return Resolution("missing", f"{'.'.join(parts[:j])} has no attribute {parts[j]!r}")
        except FutureWarning as w:
            use = re.search(r"; use (.*) instead$", str(w), re.S)
            return Resolution("deprecated", use.group(1) if use else str(w))
        except ImportError as e:
            third_party = _third_party(e)
            if third_party is not None:
                return Resolution("optional", third_party)
            return Resolution("missing", f"import fails: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - any failure to import or getattr is a name that does not resolve
            return Resolution("missing", f"{type(e).__name__}: {e}")
    return Resolution("ok")


def _documents_deprecation(mention: Mention, replacement: str) -> bool:
    """A deprecated name on a line that says so, or that names its replacement, documents the deprecation."""
    line = mention.line.lower()
    first = NAME.search(replacement)
    return "deprecat" in line or (first is not None and first.group().lower() in line) or replacement.lower() in line


def check(mentions: list[Mention]) -> tuple[list[str], list[str]]:
    """(problems, skipped): one ``path:line: name: why`` line per mention that does not resolve or is deprecated,
    and one per mention under an optional extra that is not installed."""
    problems, skipped = [], []
    for m in mentions:
        results = [resolve(c) for c in m.candidates]
        if any(r.status == "ok" for r in results):
            continue
        if m.written in FORMER and m.where.rsplit(":", 1)[0] in FORMER[m.written]:
            continue
        if any(c.isspace() for c in m.written):
            problems.append(f"{m.where}: {m.written!r}: a reference broken across lines (write it on one line)")
            continue
        # of several readings: one under a missing extra may be the one meant; a deprecated one tells what to use
        result = min(results, key=lambda r: ("optional", "deprecated", "missing").index(r.status))
        label = m.written if m.candidates == (m.written,) else f"{m.written} (read as {' or '.join(m.candidates)})"
        if result.status == "optional":
            skipped.append(f"{m.where}: {label}: needs {result.detail}")
        elif result.status == "deprecated":
            if not _documents_deprecation(m, result.detail):
                problems.append(f"{m.where}: {label}: deprecated name in docs: use {result.detail}")
        else:
            problems.append(f"{m.where}: {label}: does not resolve ({result.detail})")
    return problems, skipped


@functools.cache
def _checked() -> tuple[tuple[str, ...], tuple[str, ...]]:
    problems, skipped = check(collect())
    return tuple(problems), tuple(skipped)


def test_collect_reads_names_roles_and_skips_paths():
    """The collection on a made-up page and module: plain names, roles (relative ones against the module), paths
    and file names left out, line numbers right."""
    assert [n for _, n in _names_in("see `diffattn.layers.AttentionSpec.updated`, src/diffattn/models/vit.py, "
                                    "diffattn/configs/tiny.yaml, diffattn.models.vit.py and diffattn.models.")] \
        == ["diffattn.layers.AttentionSpec.updated", "diffattn.models"]
    assert [n for _, n in _names_in("`diffattn.studies.<name>` is a module")] == ["diffattn.studies"]
    assert [t for _, t in _role_targets(":func:`~diffattn.x.y` :class:`.a.B` :mod:`torch.nn` :func:`plain` "
                                        ":meth:`the step <.Trainer.step>` :func:`.f()`")] \
        == ["diffattn.x.y", ".a.B", ".Trainer.step", ".f"]
    assert _relative(".synthetic.attention_for", "diffattn.data", True, None) == (
        "diffattn.data.synthetic.attention_for",)
    assert _relative(".mqar_batch", "diffattn.data.synthetic", False, "Gen") == (
        "diffattn.data.mqar_batch", "diffattn.data.synthetic.mqar_batch", "diffattn.data.synthetic.Gen.mqar_batch")
    assert _relative("..layers.Attention", "diffattn.models.vit", False, None) == ("diffattn.layers.Attention",)

    source = ('"""Module: :func:`.lambdas.lambda_init`."""\n\n\nclass A:\n    """Line one.\n\n'
              '    Uses diffattn.functional.attention and :meth:`.f`."""\n\n'
              '    def f(self):\n        """:class:`diffattn.nope`, src/diffattn/io.py"""\n        x = "diffattn.no"\n')
    assert [(d.lineno, owner) for d, owner in _docstrings(ast.parse(source))] == [(1, None), (5, "A"), (10, "A")]
    got = [(m.where, m.written, m.candidates) for m in _docstring_mentions(source, "diffattn.m", False, "m.py")]
    assert got == [("m.py:1", ".lambdas.lambda_init", ("diffattn.lambdas.lambda_init",
                                                       "diffattn.m.lambdas.lambda_init")),
                   ("m.py:7", "diffattn.functional.attention", ("diffattn.functional.attention",)),
                   ("m.py:7", ".f", ("diffattn.f", "diffattn.m.f", "diffattn.m.A.f")),
                   ("m.py:10", "diffattn.nope", ("diffattn.nope",))]


def test_resolve_tells_missing_deprecated_and_optional(monkeypatch):
    assert resolve("diffattn.layers.AttentionSpec.settings_of") == Resolution("ok")
    assert resolve("diffattn.diagnostics.LayerMaps.first") == Resolution("ok")  # a dataclass field, no default
    assert resolve("diffattn.functional.diff_attention").status == "ok"
    assert resolve("diffattn.layers.no_such_name") == Resolution(
        "missing", "diffattn.layers has no attribute 'no_such_name'")
    assert resolve("diffattn.no_such_module.x").status == "missing"
    assert resolve("diffattn.layers.KIND_SETTINGS") == Resolution(
        "deprecated", DEPRECATIONS["diffattn.layers.KIND_SETTINGS"].replacement)
    # found by the warning alone too (a moved attribute whose row is spelt otherwise than the name read)
    monkeypatch.setitem(globals(), "_deprecated_row", lambda name: None)
    assert resolve.__wrapped__("diffattn.layers.KIND_SETTINGS") == Resolution(
        "deprecated", DEPRECATIONS["diffattn.layers.KIND_SETTINGS"].replacement)
    assert _third_party(ModuleNotFoundError("No module named 'ultralytics'", name="ultralytics")) == "ultralytics"
    assert _third_party(ModuleNotFoundError("No module named 'diffattn.ops'", name="diffattn.ops")) is None

    on_line = Mention("x.md:1", "diffattn.train.loop.fit", ("diffattn.train.loop.fit",),
                      "| `diffattn.train.loop.fit` | `diffattn.train.step.fit` | 0.2.0 | 0.3.0 |")
    in_prose = Mention("x.md:2", "diffattn.train.loop.fit", ("diffattn.train.loop.fit",),
                       "call `diffattn.train.loop.fit`")
    problems, skipped = check([on_line, in_prose])
    assert problems == ["x.md:2: diffattn.train.loop.fit: deprecated name in docs: use diffattn.train.step.fit"]
    assert skipped == []


def test_every_documented_name_resolves():
    problems, _ = _checked()
    assert not problems, "names in the docs and docstrings that do not resolve:\n" + "\n".join(problems)


def test_names_under_missing_extras_are_listed():
    """The names the check above skipped because an optional extra is not installed here."""
    _, skipped = _checked()
    if skipped:
        pytest.skip("not checked, an optional extra is not installed:\n" + "\n".join(skipped))


def test_former_names_are_gone():
    """A name the migration notes cite as removed really is (else the notes, and :data:`FORMER`, are stale)."""
    back = {name: resolve(name) for name in FORMER}
    assert all(r.status == "missing" for r in back.values()), {n: r for n, r in back.items() if r.status != "missing"}
