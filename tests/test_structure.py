"""Where things happen in the package, checked on the source (AST) and in a fresh interpreter.

- every optimizer step is taken by ``diffattn/train/step.py`` (its :func:`~diffattn.train.step.optimizer_step`, for
  :func:`~diffattn.train.loop.train` and :func:`~diffattn.train.step.fit`): no other module calls ``.step()`` on an
  optimizer;
- ``diffattn`` (``python -m diffattn``, ``diffattn/__main__.py``) is the only entry point: no other module has an
  ``if __name__ == "__main__"`` block;
- importing any module of the package has no side effect: it sets no environment variable, puts no filter on
  transformers' loggers, registers nothing with timm, lm-eval or Ultralytics' model parser.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "diffattn"
#: the one module that steps optimizers
STEP = PKG / "train" / "step.py"
#: the receivers that name an optimizer (``opt.step()``, ``self.optimizer.step()``, ``optim.step()``)
OPTIMIZER_NAMES = ("opt", "optim", "optimizer")


def _receiver(node: ast.expr) -> str:
    """The last name of ``x`` in ``x.step()`` (``self.optimizer`` → ``optimizer``; anything else → "")."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def optimizer_steps(source: str) -> list[int]:
    """Line numbers of ``<optimizer>.step(...)`` calls in ``source``."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
            and _receiver(n.func.value).lower() in OPTIMIZER_NAMES]


def main_guards(source: str) -> list[int]:
    """Line numbers of ``if __name__ == "__main__":`` (either operand order) in ``source``."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.comparators) == 1:
            sides = [n.test.left, n.test.comparators[0]]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            consts = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and consts == ["__main__"]:
                out.append(n.lineno)
    return out


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_only_the_training_loop_steps_an_optimizer():
    found = {str(p.relative_to(SRC)): optimizer_steps(p.read_text(encoding="utf-8")) for p in _modules()}
    outside = {k: v for k, v in found.items() if v and Path(SRC / k) != STEP}
    assert outside == {}, f"optimizer steps outside diffattn/train/step.py: {outside}"
    assert found[str(STEP.relative_to(SRC))], "train/step.py takes the steps (the checker found none there)"


def test_the_step_checker_is_not_vacuous():
    src = textwrap.dedent("""
        def f(model, opt, sched, self):
            opt.step()
            self.optimizer.step()
            sched.step()          # a scheduler: not an optimizer step
            A.step(model)         # λ(t): not an optimizer step
            scaler.step(optim)    # through a GradScaler: its receiver is the scaler
    """)
    assert optimizer_steps(src) == [3, 4]


def test_no_module_but_dunder_main_is_a_script():
    found = {str(p.relative_to(SRC)): main_guards(p.read_text(encoding="utf-8")) for p in _modules()}
    scripts = sorted(k for k, v in found.items() if v)
    assert scripts == [], f"modules with an `if __name__ == '__main__'` block: {scripts} (add a diffattn subcommand)"
    assert main_guards('if __name__ == "__main__":\n    pass\nif "__main__" == __name__:\n    pass\n') == [1, 3]
    assert main_guards('if __name__ == "diffattn":\n    pass\n') == []


#: third-party libraries imported before the snapshot, so that only diffattn's own effects are measured (their
#: imports set environment variables of their own)
THIRD_PARTY = ("torch", "transformers", "transformers.modeling_utils", "timm", "open_clip", "peft", "ultralytics",
               "ultralytics.nn.tasks", "lm_eval", "lm_eval.models", "lm_eval.api.registry")


def test_importing_any_module_changes_nothing_outside_it():
    """Each module of the package imported in turn, in one fresh interpreter with the optional libraries already
    imported: after each import, the environment, the filters on transformers' loggers, timm's registry, lm-eval's
    model registry and Ultralytics' model parser are what they were before the first. A module whose optional
    library is missing is skipped (reported, and at most a few)."""
    names = []
    for p in _modules():
        rel = p.relative_to(SRC).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        if parts[-1] != "__main__":
            names.append(".".join(parts))
    code = textwrap.dedent(f"""
        import importlib, json, logging, os, sys, warnings
        warnings.simplefilter("ignore")
        for lib in {THIRD_PARTY!r}:
            try:
                importlib.import_module(lib)
            except ImportError:
                pass
        os.environ.pop("YOLO_OFFLINE", None)  # set for Ultralytics' import above; diffattn must not set it

        def state():
            s = {{"env": sorted(os.environ.items())}}
            s["filters"] = sorted(f"{{n}}:{{type(f).__name__}}" for n, lg in logging.Logger.manager.loggerDict.items()
                                  if "transformers" in n and isinstance(lg, logging.Logger) for f in lg.filters)
            if "timm" in sys.modules:
                import timm
                s["timm"] = sorted(n for n in ("diff_vit_nano", "dg_vit_nano", "diffattn_vit_nano", "vit_nano")
                                   if timm.is_model(n))
            if "lm_eval.api.registry" in sys.modules:
                s["lm_eval"] = "diffattn" in sys.modules["lm_eval.api.registry"].MODEL_REGISTRY
            if "ultralytics.nn.tasks" in sys.modules:
                t = sys.modules["ultralytics.nn.tasks"]
                s["ultralytics"] = [hasattr(t.parse_model, "diffattn_original"), hasattr(t, "DiffC2PSA")]
            return s

        before = state()
        changed, skipped = {{}}, {{}}
        for name in {names!r}:
            try:
                importlib.import_module(name)
            except ImportError as e:
                skipped[name] = str(e)
                continue
            now = state()
            diff = [k for k in before if now.get(k) != before[k]]
            if diff:
                changed[name] = diff
                before = now
        print(json.dumps({{"changed": changed, "skipped": skipped, "n": len({names!r})}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
               YOLO_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["changed"] == {}, out["changed"]
    assert out["n"] > 100 and len(out["skipped"]) <= 3, out["skipped"]
