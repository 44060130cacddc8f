"""The registry of the kinds of model ``diffattn eval`` evaluates (``diffattn.eval.kinds``): every registered kind
recognises the tiny models of its kind and no other kind does, an unknown model is an error naming the registered
kinds, ``evaluate`` runs the suite of the model's kind, and the names that moved out of ``diffattn.eval.runner``
still resolve there, warning."""

from __future__ import annotations

import dataclasses
import importlib
import json
import warnings

import pytest
import torch
from torch import nn

from diffattn import create_model
from diffattn.deprecations import DEPRECATIONS
from diffattn.eval import runner
from diffattn.eval.kinds import CLIP, EVAL_KINDS, LM, VIT, EvalKind, get_eval_kind, kind_of, register_eval_kind
from diffattn.eval.report import suite_names

#: tiny registered models of each kind (``diffattn.list_models()``): standard, differential and gated variants
TINY = {"vit": ("vit_nano", "diff_vit_nano", "dg_vit_nano"),
        "clip": ("clip_tiny", "diffclip_tiny", "dgclip_tiny"),
        "lm": ("lm_tiny", "diff_lm_tiny", "diff_v2_lm_tiny", "dg_lm_tiny")}


@pytest.fixture
def registry():
    """:data:`EVAL_KINDS` as it is, restored after the test (which may register kinds or replace one)."""
    saved = dict(EVAL_KINDS)
    yield EVAL_KINDS
    EVAL_KINDS.clear()
    EVAL_KINDS.update(saved)


def _toy(name: str = "toy", suite: str = "toy", recognises=lambda model, layout: False, run=None) -> EvalKind:
    return EvalKind(name=name, label="toy model", suite=suite, groups=("score",), datasets=("digits",),
                    recognises=recognises, run=run or (lambda ctx: {"score": {"value": 1.0}}),
                    sample=lambda protocol: "one toy")


def test_the_registered_kinds_in_their_order():
    assert list(EVAL_KINDS) == ["vit", "clip", "lm"]
    assert [EVAL_KINDS[k] for k in ("vit", "clip", "lm")] == [VIT, CLIP, LM]
    assert suite_names() == ("vision", "clip", "language")
    assert set(TINY) == set(EVAL_KINDS)  # a tiny model of every registered kind is checked below
    for kind in EVAL_KINDS.values():
        assert kind.groups and kind.datasets and kind.label
    assert get_eval_kind("clip") is CLIP


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, names in TINY.items() for n in names])
def test_every_kind_recognises_its_tiny_models_and_no_other_kind_does(kind, name):
    model = create_model(name)
    assert kind_of(model) is EVAL_KINDS[kind]
    assert [k.name for k in EVAL_KINDS.values() if k.recognises(model, "diffattn")] == [kind]


def test_a_retrofit_run_is_a_causal_lm():
    """A retrofit run's model is a transformers causal LM (with adapters, maybe peft-wrapped): its layout says so."""
    assert kind_of(nn.Linear(2, 2), "retrofit") is LM and kind_of(nn.Linear(2, 2), "retrofit_checkpoint") is LM
    with pytest.raises(ValueError, match="cannot evaluate a Linear"):
        kind_of(nn.Linear(2, 2), "diffattn")


@pytest.mark.parametrize("model", [nn.Linear(2, 2), "dgt_tiny", "llava_clip_tiny"])
def test_an_unknown_model_is_an_error_naming_the_registered_kinds(model):
    model = create_model(model) if isinstance(model, str) else model
    with pytest.raises(ValueError) as err:
        kind_of(model)
    assert str(err.value) == (f"diffattn eval cannot evaluate a {type(model).__name__}: no registered kind of model "
                              f"recognises it; registered: vit (vision transformer); clip (CLIP model); lm (causal "
                              f"language model)")


def test_a_model_two_kinds_recognise_is_an_error(registry):
    register_eval_kind(_toy(recognises=lambda model, layout: hasattr(model, "new_kv_caches")))
    with pytest.raises(ValueError, match="the kinds lm, toy all recognise it; registered: vit"):
        kind_of(create_model("lm_tiny"))


def test_registering_checks_the_kind(registry):
    toy = register_eval_kind(_toy())
    assert EVAL_KINDS["toy"] is toy and list(EVAL_KINDS)[-1] == "toy" and suite_names()[-1] == "toy"
    # the views the runner gives read the registry as it is now
    assert runner.EVAL_DATASETS["toy"] == ("digits",) and runner.KIND_NAMES["toy"] == "toy model"
    with pytest.raises(ValueError, match="kind.name 'toy' is already registered"):
        register_eval_kind(_toy(suite="other"))
    with pytest.raises(ValueError, match="kind.suite 'vision' is already the suite of kind 'vit'"):
        register_eval_kind(_toy(name="toy2", suite="vision"))
    with pytest.raises(TypeError, match="kind must be an EvalKind, got dict"):
        register_eval_kind({"name": "toy3"})
    with pytest.raises(ValueError, match=r"kind must be a registered kind of model, got 'vlm'; registered: vit \("):
        get_eval_kind("vlm")


def test_evaluate_runs_the_suite_of_the_models_kind(tmp_path, registry):
    """``evaluate`` hands the kind's suite what the user gave and writes what it returns under the kind's suite."""
    seen = []

    def run(ctx):
        seen.append(ctx)
        return {"classification": {"top1": 0.25}, "dataset": ctx.dataset}

    registry["vit"] = dataclasses.replace(VIT, run=run)
    torch.manual_seed(0)
    create_model("vit_nano", img_size=8, patch_size=2, in_chans=1, num_classes=10, depth=1).save_pretrained(
        tmp_path / "run" / "model")
    res = runner.evaluate(tmp_path / "run", dataset="digits", quick=True, seed=3, progress=False,
                          protocol={"episodes": 7}, device="cpu")
    (ctx,) = seen
    assert res["vision"] == {"classification": {"top1": 0.25}, "dataset": "digits"}
    assert res["model"]["kind"] == "vit" and res["model"]["architecture"] == "VisionTransformer"
    assert ctx.dataset == "digits" and ctx.seed == 3 and ctx.protocol["episodes"] == 7
    assert ctx.protocol["max_images"] == runner.PROTOCOLS["quick"]["max_images"] and not ctx.progress
    assert ctx.who == "vit_nano, run run" and ctx.model_dir == tmp_path / "run" / "model"
    assert ctx.device == torch.device("cpu") and ctx.text is None and ctx.mmvp is None
    out = tmp_path / "run" / "eval"
    assert json.loads((out / "results.json").read_text())["vision"]["classification"]["top1"] == 0.25
    assert "## vision" in (out / "report.md").read_text()


def test_a_dataset_of_another_kind_is_refused_before_the_suite_runs(tmp_path):
    create_model("lm_tiny", depth=1).save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match="dataset 'digits' is for a vision transformer or CLIP model, but this run "
                                         "is a causal language model; a causal language model is evaluated on "
                                         "moby_dick, state_of_the_union, spamassassin"):
        runner.evaluate(tmp_path / "lm", dataset="digits", progress=False)
    assert not (tmp_path / "lm" / "eval").exists()


MOVED = {"write_report": "report", "summary_table": "report", "headline_metrics": "report", "metric_label": "report",
         "compare": "comparison", "load_results": "comparison", "flatten": "comparison",
         "recorded_chance": "comparison", "stratified_subset": "sampling",
         "classification_chance": "classification"}


@pytest.mark.parametrize(("name", "module"), MOVED.items())
def test_the_names_that_moved_out_of_the_runner_warn_and_resolve(name, module):
    new = getattr(importlib.import_module(f"diffattn.eval.{module}"), name)
    assert DEPRECATIONS[f"diffattn.eval.runner.{name}"].replacement == f"diffattn.eval.{module}.{name}"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = getattr(runner, name)
    assert got is new
    assert [w.category for w in record] == [FutureWarning]
    assert str(record[0].message).startswith(f"diffattn.eval.runner.{name} is deprecated since diffattn 0.2.0")
    assert record[0].filename == __file__
    with pytest.raises(AttributeError, match="module 'diffattn.eval.runner' has no attribute 'no_such_name'"):
        runner.no_such_name  # noqa: B018


def test_no_kind_branching_is_left_in_the_runner():
    """The runner dispatches through the registry: it never asks what a model is, nor compares a kind's name."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(runner))
    asks = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("isinstance", "hasattr") and n.args and "model" in ast.unparse(n.args[0])]
    assert not asks
    compared = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(isinstance(c, ast.Constant) and c.value in EVAL_KINDS for c in [n.left, *n.comparators])]
    assert not compared
