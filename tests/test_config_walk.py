"""The walk of one config value from ``diffattn train`` to the attention operator, measured on a real run.

A tiny ``diffattn train tiny/classify`` (one step, CPU, offline: scikit-learn's digits) is run through the command
line with the attention set by ``--set``, ``λ_init`` an unusual float (:data:`MARK`), under :func:`sys.setprofile`.
Every call of a function of ``src/diffattn`` is looked at: it *carries* the value when one of its arguments holds it
(the ``--set`` text, the float, a dict / list / dataclass holding either, an :class:`~diffattn.layers.AttentionSpec`
with it, or an object whose own attribute it is: the layer, the λ form, a ``self`` holding the config).

The *walk* is what hands the value on to where it is used: every carrying call that is on the call stack when

- the value is parsed (a function receives the ``--set`` text itself),
- an object that holds the value when the operator runs is made (the ``__init__`` of the layer and of its λ form,
  seen when it returns), or
- the operator (:func:`diffattn.ops.diff_attention` or its packed form, :func:`diffattn.ops.diff_attention_pairs`,
  which the layers call) is called, which ends the measurement: the frames from
  the call out to the layer that holds the value (its callers, the model's forward, the task's loss and the
  training step, hand on the input, not the value).

Calls that receive the value but lead nowhere further (the budget warnings reading other settings of the config,
the saved ``config.yaml`` and ``config.json``) are not part of the walk. A call that receives the value and returns
it changed (the spec made from a dict, the registry's overrides merged into a config) is not on the stack when the
value is handed down; :func:`test_calls_that_return_the_value_are_in_walk_files` checks that every such call is in a
file of the walk all the same, so the count does not leave a file out that way.

A *validation* is a function that received the parsed value (the float) in a parameter and raises under a condition
that reads that parameter (read from its source); the ``--set`` parser, which raises on a malformed ``key=value``,
parses text and is not one.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import inspect
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

import diffattn
from diffattn.layers import AttentionSpec

SRC = str(Path(diffattn.__file__).resolve().parent) + "/"
#: an unusual λ_init: no default, schedule or other setting of the tiny run has this value
MARK = 0.3217
TEXT = "0.3217"
#: the files the walk enters before the config parse, which hand on the command line's text: the command line
#: (:func:`diffattn.cli.main`) and the train command
BEFORE_PARSE = ["cli/__init__.py", "app/train.py"]
#: the walk's files from the config parse on, one room each: the ``--set`` parser, the train config, the trainer,
#: the run's model (built from ``model:`` and size-checked), the factory, the registry, the model family, the block
#: (``layers.blocks``), the kind's spec that builds its layer (``layers.spec``), the layer, the λ form and the
#: operator; the goal is at most 12
WALK_FILES = [
    "configs/__init__.py", "train/config.py", "train/loop.py", "train/build.py", "factory.py", "models/registry.py",
    "models/vit.py", "layers/blocks.py", "layers/spec.py", "layers/attention.py", "lambdas.py", "ops/functional.py",
]
#: files with calls that receive the value and return it, but whose result leads nowhere on the way to the
#: operator: the model's record of its config for ``config.json``, and the task made for the run (it holds the
#: config for its data and saves; the trainer builds the model from its own ``cfg.model``)
RETURNS_ELSEWHERE = {"models/base.py", "train/tasks/__init__.py"}
GOAL = 12


def _carries(obj, depth: int = 0, seen: set | None = None) -> bool:
    if isinstance(obj, float):
        return obj == MARK
    if isinstance(obj, str):
        return obj == TEXT or obj.endswith("=" + TEXT)
    if isinstance(obj, AttentionSpec):
        return getattr(obj, "lambda_init", None) == MARK
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen or isinstance(obj, (bytes, int, type(None), type)):
        return False
    seen.add(id(obj))
    if isinstance(obj, Mapping):
        return any(_carries(v, depth + 1, seen) for v in list(obj.values())[:200])
    if isinstance(obj, (list, tuple)):
        return any(_carries(v, depth + 1, seen) for v in obj[:200])
    if dataclasses.is_dataclass(obj):
        return any(_carries(getattr(obj, f.name, None), depth + 1, seen) for f in dataclasses.fields(obj))
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict) and depth == 0:  # an argument's own attributes (a layer's λ_init, a task's config)
        return any(_carries(v, depth + 1, seen) for k, v in own.items() if not k.startswith("__"))
    return False


def _is_bare(obj) -> bool:
    """The value itself: the ``--set`` text (also as an item of the argument list) or the float."""
    if isinstance(obj, (list, tuple)):
        return any(_is_bare(v) for v in obj)
    return (isinstance(obj, float) and obj == MARK) or (isinstance(obj, str) and _carries(obj))


def _arg_names(code) -> tuple[str, ...]:
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:n]


class Walk:
    """The profiler of one run: :attr:`walk` (file → functions), :attr:`received` ((file, function) → the
    parameter that received the bare value, with the code object) and whether the operator was reached."""

    def __init__(self):
        self.carrying: dict[int, tuple[str, str]] = {}  # frame id → (file, function)
        self.walk: dict[str, list[str]] = collections.defaultdict(list)
        self.received: dict[tuple[str, str], tuple[str, object]] = {}  # the parsed float, not the text
        self.reached = False
        self.before_parse: set[tuple[str, str]] | None = None  # the carrying calls that lead to the config parse
        self.returned: dict[str, set[str]] = collections.defaultdict(set)  # file → calls that returned the value

    def _carrying_stack(self, frame) -> list[tuple[str, str]]:
        out = []
        while frame is not None:
            if id(frame) in self.carrying:
                out.append(self.carrying[id(frame)])
            frame = frame.f_back
        return out

    def from_parse(self) -> dict[str, list[str]]:
        """The walk from the config parse on (:func:`diffattn.train.config.load_config`): without the calls that
        only hand the command line's text to it."""
        before = self.before_parse or set()
        walk = {f: [fn for fn in fns if (f, fn) not in before] for f, fns in self.walk.items()}
        return {f: fns for f, fns in walk.items() if fns}

    def _mark(self, frame) -> None:
        """Add ``frame``'s call to the walk when it carries the value."""
        hit = self.carrying.get(id(frame))
        if hit is not None and hit[1] not in self.walk[hit[0]]:
            self.walk[hit[0]].append(hit[1])

    def _add_stack(self, frame) -> None:
        while frame is not None:
            self._mark(frame)
            frame = frame.f_back

    def _add_holder_frames(self, frame) -> None:
        """At the operator call: the frames from the call outward up to the last method of the object that holds the
        value (the layer, with its λ form: the first ``self`` met that carries it). Its callers (the model's
        forward, the task's loss, the training step) hand on the input, not the value."""
        holder = None
        while frame is not None:
            this = frame.f_locals.get("self")
            if holder is None and id(frame) in self.carrying and this is not None:
                holder = this
            elif holder is not None and this is not holder:
                return
            self._mark(frame)
            frame = frame.f_back

    def __call__(self, frame, event, arg):
        if self.reached or not frame.f_code.co_filename.startswith(SRC):
            return
        code = frame.f_code
        where = (code.co_filename[len(SRC):], code.co_qualname)
        if event == "return":
            if id(frame) in self.carrying and not isinstance(arg, torch.nn.Module) and _carries(arg):
                self.returned[where[0]].add(where[1])  # the value (or a holder of it) handed back, not a model
            if code.co_name == "__init__" and "self" in frame.f_locals and any(
                    isinstance(v, float) and v == MARK for v in vars(frame.f_locals["self"]).values()):
                self._add_stack(frame)  # an object that holds the value at the operator call is made
            self.carrying.pop(id(frame), None)
            return
        if event != "call":
            return
        parse = False
        for name in _arg_names(code):
            value = frame.f_locals.get(name)
            if name in frame.f_locals and _carries(value):
                self.carrying[id(frame)] = where
                if isinstance(value, float):
                    self.received.setdefault(where, (name, code))
                elif _is_bare(value):
                    parse = True
        if where == ("train/config.py", "load_config") and self.before_parse is None:
            self.before_parse = set(self._carrying_stack(frame.f_back))
        if where in (("ops/functional.py", "diff_attention"), ("ops/functional.py", "diff_attention_pairs")):
            self.walk["ops/functional.py"].append(where[1])
            self._add_holder_frames(frame.f_back)
            self.reached = True
        elif parse:
            self._add_stack(frame)


def _raises_on(code, param: str) -> bool:
    """Whether the function of ``code`` raises under an ``if`` that reads ``param`` (its own source only, not its
    callees')."""
    lines, _ = inspect.findsource(code)
    start = code.co_firstlineno - 1
    block = inspect.getblock(lines[start:])
    tree = ast.parse(textwrap.dedent("".join(block)))
    func = tree.body[0]
    for node in ast.walk(func):
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(node.test)):
            if any(isinstance(n, ast.Raise) for b in node.body for n in ast.walk(b)):
                return True
    return False


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    pytest.importorskip("sklearn")  # the digits of tiny/classify
    from diffattn.cli import main

    out = tmp_path_factory.mktemp("walk") / "run"
    argv = ["train", "tiny/classify", "--out", str(out), "--set", "run.steps=1", "--set", "run.progress=false",
            "--set", "run.device=cpu", "--set", "optim.warmup_steps=0",
            "--set", "model.overrides.attention.kind=diff", "--set", f"model.overrides.attention.lambda_init={TEXT}"]
    walk = Walk()
    sys.setprofile(walk)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    assert status == 0
    return walk


def _validations(walk: Walk) -> list[str]:
    return sorted(f"{file}:{fn}({param})" for (file, fn), (param, code) in walk.received.items()
                  if _raises_on(code, param))


def test_the_value_reaches_the_operator_through_the_measured_files(measured):
    """The walk enters exactly the files of :data:`BEFORE_PARSE` and :data:`WALK_FILES` (so a file added to it is
    seen here): 14 from ``diffattn train``, 12 from the config parse."""
    assert measured.reached, "the run never called diff_attention"
    assert sorted(measured.walk) == sorted(BEFORE_PARSE + WALK_FILES), dict(measured.walk)
    assert sorted(measured.from_parse()) == sorted(WALK_FILES), measured.from_parse()


def test_calls_that_return_the_value_are_in_walk_files(measured):
    """A call that receives the value and hands it back (parsed, merged, made into a spec) is not on the stack when
    the value is handed down, so the walk does not see it: every such call is in a file the walk enters anyway, or
    in :data:`RETURNS_ELSEWHERE`."""
    assert set(measured.returned) - set(measured.walk) == RETURNS_ELSEWHERE, dict(measured.returned)
    assert "models/registry.py" in measured.returned  # the overrides merged into the registered config (seen)


def test_the_walk_enters_at_most_goal_files(measured):
    assert len(measured.from_parse()) <= GOAL, measured.from_parse()


def test_the_value_is_validated_in_one_place(measured):
    """One function raises on a bad λ_init: ``check_lambda_init``, which the spec calls when it is made and the
    public constructors below it (the layer, the λ form) call for their own callers."""
    assert _validations(measured) == ["lambdas.py:check_lambda_init(lambda_init)"]


def test_the_measurement_sees_a_second_validation(tmp_path):
    """The check is not vacuous: a function that receives the value and raises on it is counted."""
    def extra_check(lambda_init):
        if lambda_init != lambda_init:
            raise ValueError("nan")
        return lambda_init

    walk = Walk()
    walk.received[("x.py", "extra_check")] = ("lambda_init", extra_check.__code__)
    walk.received[("y.py", "passes_on")] = ("value", _carries.__code__)
    assert _validations(walk) == ["x.py:extra_check(lambda_init)"]

