"""The one deprecation mechanism (``diffattn.deprecations``): every row of :data:`DEPRECATIONS` is dated and not yet
due for removal, no other code raises a deprecation warning, each deprecated spelling warns (a FutureWarning naming
its replacement, pointing at the caller's line) and still gives what it gave, and docs/design.md ("Deprecated
spellings") lists exactly the rows of the table."""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest
import torch.nn as nn

import diffattn
from diffattn.deprecations import DEPRECATIONS, Deprecation, moved_attribute, version_tuple, warn_deprecated

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "diffattn"
VERSION = re.compile(r"\d+\.\d+\.\d+")


# ------------------------------------------------------------------------------------------------- the table is dated

@pytest.mark.parametrize("old", sorted(DEPRECATIONS))
def test_no_row_has_reached_its_removal_version(old):
    """Once ``diffattn.__version__`` reaches a row's ``removed_in``, the spelling (its alias, key or keyword) and its
    row are deleted in that release: this test fails until they are."""
    row = DEPRECATIONS[old]
    assert version_tuple(diffattn.__version__) < version_tuple(row.removed_in), (
        f"diffattn {diffattn.__version__} removes {old!r} (removed_in {row.removed_in}): delete the spelling and its "
        f"row of diffattn.deprecations.DEPRECATIONS")


@pytest.mark.parametrize("old", sorted(DEPRECATIONS))
def test_every_row_is_dated_deprecated_before_it_is_removed(old):
    row = DEPRECATIONS[old]
    assert isinstance(row, Deprecation) and row.replacement.strip()
    assert VERSION.fullmatch(row.since) and VERSION.fullmatch(row.removed_in), row
    assert version_tuple(row.since) < version_tuple(row.removed_in), row
    assert version_tuple(row.since) <= version_tuple(diffattn.__version__), f"{old}: since a future release"


def test_version_tuple_reads_the_release_segments():
    assert version_tuple("0.2.0") == (0, 2, 0) and version_tuple("1.10.3.dev1") == (1, 10, 3)
    assert version_tuple("0.2.0") < version_tuple("0.3.0") < version_tuple("0.10.0")


def test_warn_deprecated_names_the_row_and_needs_one(monkeypatch):
    monkeypatch.setitem(DEPRECATIONS, "old.name", Deprecation("new.name", "0.2.0", "0.3.0"))
    with pytest.warns(FutureWarning) as record:
        warn_deprecated("old.name")
        warn_deprecated("old.name", detail="new.name(x=1)")
    assert [str(w.message) for w in record] == [
        "old.name is deprecated since diffattn 0.2.0 and removed in diffattn 0.3.0; use new.name instead",
        "old.name is deprecated since diffattn 0.2.0 and removed in diffattn 0.3.0; use new.name(x=1) instead"]
    assert {w.filename for w in record} == {__file__}  # the caller's line
    with pytest.raises(KeyError):
        warn_deprecated("no.such.spelling")
    getattr_ = moved_attribute("old", {"name": lambda: 42})
    with pytest.warns(FutureWarning, match="^old.name is deprecated"):
        assert getattr_("name") == 42
    with pytest.raises(AttributeError, match="module 'old' has no attribute 'other'"):
        getattr_("other")


# --------------------------------------------------------------------- no deprecation warning outside the one mechanism

_CATEGORIES = {"DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"}


def _deprecation_warnings(source: str) -> list[int]:
    """Lines of ``source`` that raise a deprecation warning themselves: ``warnings.warn(..., <category>)`` (or
    ``category=``) and any call of a deprecation warning class (``FutureWarning("...")``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name in _CATEGORIES:
            lines.append(node.lineno)
        elif name == "warn" and any(isinstance(n, ast.Name) and n.id in _CATEGORIES
                                    for a in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(a)):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_scan_finds_each_way_of_raising_a_deprecation_warning():
    assert _deprecation_warnings("import warnings\nwarnings.warn('x', DeprecationWarning, stacklevel=2)\n"
                                 "warnings.warn('y', category=FutureWarning)\nwarn('z', FutureWarning)\n"
                                 "warnings.warn(FutureWarning('w'))\nraise PendingDeprecationWarning('v')\n") == [
        2, 3, 4, 5, 6]
    assert not _deprecation_warnings("import warnings\nwarnings.warn('x', UserWarning)\nwarn_deprecated('a.b')\n")


def test_only_the_table_raises_deprecation_warnings():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "deprecations.py":
            continue
        found += [f"{rel}:{line}" for line in _deprecation_warnings(path.read_text(encoding="utf-8"))]
    assert not found, f"add a row to diffattn.deprecations.DEPRECATIONS and call warn_deprecated instead: {found}"


def test_every_literal_warn_deprecated_call_names_a_row():
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "warn_deprecated" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                calls.append(node.args[0].value)
    assert calls and not set(calls) - set(DEPRECATIONS), f"no row for {sorted(set(calls) - set(DEPRECATIONS))}"


# ----------------------------------------------------------------------- each spelling warns and gives what it gave


def _attribute(module: str, name: str):
    return lambda: getattr(importlib.import_module(module), name)


def _vlm(name: str, new: str):
    return ("diffattn.train.tasks.vlm." + name, _attribute("diffattn.train.tasks.vlm", name),
            lambda got: got is getattr(importlib.import_module(new), name))


def _apply_overrides():
    from diffattn.train.config import apply_overrides

    d = {"run": {"steps": 1}}
    out = apply_overrides(d, ["run.steps=3", "optim.betas=[0.9, 0.95]"])
    assert d == {"run": {"steps": 1}}  # a copy is changed
    return out


def _pretrained_backend(monkeypatch):
    """``build_run_model`` of a ``model.pretrained`` run whose config sets the backend by the loose key: the
    keyword arguments it hands ``load_released``."""
    from diffattn.train.build import build_run_model
    from diffattn.train.config import ModelConfig

    seen = {}

    def load_released(path, **kwargs):
        seen.update(kwargs)
        return nn.Linear(2, 2), None

    monkeypatch.setitem(build_run_model.__globals__, "load_released", load_released)

    class Task:
        def own_model(self):
            return None

        def pretrained_dir(self):
            return Path("released")

    build_run_model(Task(), ModelConfig(pretrained="released", overrides={"backend": "math"}))
    return seen


def _task_classes():
    from diffattn.train.tasks import TASKS

    return tuple(TASKS)


def _methods(group: str):
    from diffattn.adapters import methods

    return getattr(methods, group)


#: (the deprecated spelling, a function that uses it, a check of what it gives)
CASES = [
    ("diffattn.train.tasks.TASK_CLASSES", _attribute("diffattn.train.tasks", "TASK_CLASSES"),
     lambda got: got == _task_classes() and "clip" in got),
    _vlm("word_tokenizer", "diffattn.models.paligemma"),
    _vlm("paligemma_batch", "diffattn.models.paligemma"),
    _vlm("paligemma_transform", "diffattn.models.paligemma"),
    _vlm("PALIGEMMA_SPECIAL", "diffattn.models.paligemma"),
    _vlm("load_paligemma", "diffattn.eval.paligemma"),
    _vlm("answer_paligemma", "diffattn.eval.paligemma"),
    _vlm("paligemma_image_attention", "diffattn.eval.paligemma"),
    ("diffattn.train.tasks.vlm.build_paligemma", _attribute("diffattn.train.tasks.vlm", "build_paligemma"),
     callable),
    ("diffattn.train.config.apply_overrides", _apply_overrides,
     lambda got: got == {"run": {"steps": 3}, "optim": {"betas": [0.9, 0.95]}}),
    ("model.overrides.backend", _pretrained_backend, lambda got: got == {"backend": "math"}),
    *[(f"{module}.{old}", _attribute(module, old), lambda got, new=new: got == _methods(new))
      for module in ("diffattn.adapters", "diffattn.adapters.methods")
      for old, new in (("SEED001_METHODS", "ANNEALED_METHODS"), ("SEED002_METHODS", "BLENDED_METHODS"))],
]


@pytest.mark.parametrize(("old", "use", "gives"), CASES, ids=[c[0] for c in CASES])
def test_each_spelling_warns_once_naming_its_replacement(old, use, gives, monkeypatch):
    row = DEPRECATIONS[old]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        args = (monkeypatch,) if use is _pretrained_backend else ()
        got = use(*args)
    deprecations = [w for w in record if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert len(deprecations) == 1, [str(w.message) for w in deprecations]
    w = deprecations[0]
    assert w.category is FutureWarning and w.filename == __file__
    message = str(w.message)
    assert message.startswith(f"{old} is deprecated since diffattn {row.since} and removed in ")
    assert f" {row.removed_in}; use " in message
    replacement = row.replacement.split(" (")[0]
    assert replacement in message
    assert gives(got)


def test_the_moved_names_of_the_vlm_recipe_each_have_a_row():
    from diffattn.train.tasks import vlm

    assert {f"diffattn.train.tasks.vlm.{n}" for n in vlm.MOVED} | {"diffattn.train.tasks.vlm.build_paligemma"} == {
        old for old in DEPRECATIONS if old.startswith("diffattn.train.tasks.vlm.")}
    for name, module in vlm.MOVED.items():
        assert DEPRECATIONS[f"diffattn.train.tasks.vlm.{name}"].replacement == f"{module}.{name}"


def test_an_unknown_attribute_is_still_an_attribute_error():
    import diffattn.adapters as adapters
    import diffattn.adapters.methods as methods
    import diffattn.train.tasks as tasks
    import diffattn.train.tasks.vlm as vlm

    for module in (adapters, methods, tasks, vlm):
        with pytest.raises(AttributeError, match=f"module '{module.__name__}' has no attribute 'no_such_name'"):
            module.no_such_name  # noqa: B018


# ------------------------------------------------------------------------------------ the docs list the same rows

def _docs_rows() -> dict[str, tuple[str, str, str]]:
    """The table of docs/design.md's section "Deprecated spellings", backticks removed: old → (use instead, since,
    removed in)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## 8. Deprecated spellings", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and VERSION.fullmatch(cells[2]):
            assert cells[0] not in rows, f"listed twice: {cells[0]}"
            rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


def test_the_docs_list_every_row_of_the_table():
    want = {old: (row.replacement, row.since, row.removed_in) for old, row in DEPRECATIONS.items()}
    expected = "\n".join(f"| `{old}` | `{r}` | {s} | {x} |" for old, (r, s, x) in want.items())
    assert _docs_rows() == want, f"docs/design.md, 'Deprecated spellings', should list these rows:\n{expected}"
