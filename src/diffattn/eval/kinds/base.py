"""What every kind of model ``diffattn eval`` evaluates declares, the registry of kinds, and the helpers the kinds'
suites share (the attention diagnostics every suite reports).

A kind is one :class:`EvalKind`, declared in its own module of this folder and registered with
:func:`register_eval_kind` into :data:`EVAL_KINDS`, the one table of kinds (the shape of timm's model registry):
its name, how messages name it, the results key of its suite, the metric groups the suite reports, the built-in
datasets it is evaluated on, how it recognises a loaded model, and the suite itself. :func:`kind_of` finds the kind
of a model; nothing else looks at what a model is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...diagnostics import branch_entropy, capture_attention, rollout
from ...diagnostics.plots import plot_cls_maps, plot_lambdas, plot_maps

__all__ = ["EvalContext", "EvalKind", "EVAL_KINDS", "register_eval_kind", "get_eval_kind", "kind_of",
           "bare_model", "image_sample", "attention_diagnostics"]


@dataclass(frozen=True)
class EvalContext:
    """What a suite is given: the model (on ``device``, in eval mode) and the folder it was loaded from, what the
    user asked for (``dataset``, ``text``, ``mmvp``: None where not given), the protocol's numbers (one entry of
    :data:`diffattn.eval.runner.PROTOCOLS`, with the caller's overrides), the folder its plots go to, the seed, whether
    to show progress bars, and ``who``: the model and its run as every figure's title names them
    (``"diffclip_tiny, run tiny_run"``)."""

    model: nn.Module
    model_dir: Path
    dataset: str | None
    text: str | None
    mmvp: str | None
    protocol: dict[str, Any]
    out: Path
    seed: int
    progress: bool
    device: torch.device
    who: str


@dataclass(frozen=True)
class EvalKind:
    """One kind of model ``diffattn eval`` evaluates.

    - ``name``: the kind as ``results.json`` records it (``model.kind``) and :data:`EVAL_KINDS` keys it;
    - ``label``: how messages name it (``"vision transformer"``);
    - ``suite``: the key of its suite's results in ``results.json`` (``"vision"``);
    - ``groups``: the metric groups its suite reports (each a key of the suite's results, or of its ``skipped``
      where the data lacks what the group needs);
    - ``datasets``: the built-in datasets it is evaluated on (``--dataset``);
    - ``recognises(model, layout)``: whether a model loaded by :func:`diffattn.factory.load_run` is of this kind
      (``layout``: :func:`diffattn.factory.run_source`'s name of the folder it came from);
    - ``run(ctx)``: the suite, the results of one evaluation (:class:`EvalContext`);
    - ``sample(protocol)``: what the protocol evaluates, in words (``"at most 2,000 test images"``).
    """

    name: str
    label: str
    suite: str
    groups: tuple[str, ...]
    datasets: tuple[str, ...]
    recognises: Callable[[nn.Module, str], bool]
    run: Callable[[EvalContext], dict]
    sample: Callable[[dict], str]


#: name → kind, in the order of registration (the order of the report's sections and of ``--dataset``'s messages)
EVAL_KINDS: dict[str, EvalKind] = {}


def register_eval_kind(kind: EvalKind) -> EvalKind:
    """Add ``kind`` to :data:`EVAL_KINDS` and return it; a name or suite key already registered is a ValueError."""
    if not isinstance(kind, EvalKind):
        raise TypeError(f"kind must be an EvalKind, got {type(kind).__name__}")
    if kind.name in EVAL_KINDS:
        raise ValueError(f"kind.name {kind.name!r} is already registered; registered: {sorted(EVAL_KINDS)}")
    taken = {k.suite: k.name for k in EVAL_KINDS.values()}
    if kind.suite in taken:
        raise ValueError(f"kind.suite {kind.suite!r} is already the suite of kind {taken[kind.suite]!r}")
    EVAL_KINDS[kind.name] = kind
    return kind


def _registered() -> str:
    return "; ".join(f"{k.name} ({k.label})" for k in EVAL_KINDS.values())


def get_eval_kind(name: str) -> EvalKind:
    """The kind registered as ``name`` (ValueError naming the registered ones)."""
    if name not in EVAL_KINDS:
        raise ValueError(f"kind must be a registered kind of model, got {name!r}; registered: {_registered()}")
    return EVAL_KINDS[name]


def kind_of(model: nn.Module, layout: str = "diffattn") -> EvalKind:
    """The one registered kind that recognises ``model`` (loaded from a folder of ``layout``); a model no kind
    recognises, or more than one, is a ValueError naming the registered kinds."""
    found = [k for k in EVAL_KINDS.values() if k.recognises(model, layout)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"diffattn eval cannot evaluate a {type(model).__name__}: no registered kind of model "
                         f"recognises it; registered: {_registered()}")
    raise ValueError(f"diffattn eval cannot tell which kind of model a {type(model).__name__} is: the kinds "
                     f"{', '.join(k.name for k in found)} all recognise it; registered: {_registered()}")


def bare_model(model: nn.Module) -> nn.Module:
    """The model inside a peft wrapper, or ``model``."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def image_sample(protocol: dict) -> str:
    """The test images ``protocol`` evaluates, in words (an :attr:`EvalKind.sample` for the kinds of images)."""
    n = protocol["max_images"]
    return "every image" if n is None else f"at most {n:,} test images"


def attention_diagnostics(model: nn.Module, run: Callable, inputs: torch.Tensor, out: Path, tag: str, *,
                          grid: tuple[int, int] | None = None, tokens=None, device: torch.device | None = None,
                          who: str = "") -> tuple[dict, list]:
    """Capture the maps of ``model``'s attention layers for one batch (``run(inputs)`` on ``device``, the maps kept
    on the CPU); λ or gate per layer, entropy per branch, plots of the first and last layer's maps (A1, A2,
    combined) and of λ, and for images (``grid``, the patch grid) the CLS attention with its rollout
    (:func:`diffattn.diagnostics.rollout`). ``who`` (the model, run and dataset) ends every figure's title.
    Returns (the results with their ``plots``, the captured layers)."""
    sub = f"\n{who}" if who else ""

    with torch.no_grad(), capture_attention(model) as cap:
        run(inputs.to(device) if device is not None else inputs)
    layers = cap.layers
    res: dict[str, Any] = {"layers": len(layers), "kind": layers[0].kind if layers else None}
    lam = [m.gate.mean().item() if m.gate is not None else (m.lambda_.mean().item() if m.lambda_ is not None
                                                             else None) for m in layers]
    res["lambda_per_layer" if layers and layers[0].gate is None else "gate_per_layer"] = lam
    res["entropy_first"] = [float(branch_entropy(m.first).mean()) for m in layers if m.first is not None]
    res["entropy_second"] = [float(branch_entropy(m.second).mean()) for m in layers if m.second is not None]
    plots = []
    for i in sorted({0, len(layers) - 1}):
        m = layers[i]
        plots.append(plot_maps(m.first, m.second, m.combined, out / f"{tag}_maps_layer{i}.png",
                               title=f"{tag}: layer {i} ({m.kind}){sub}", tokens=tokens, cls=grid is not None).name)
    if any(v is not None for v in lam):
        vals = [(m.gate if m.gate is not None else m.lambda_) for m in layers if
                (m.gate is not None or m.lambda_ is not None)]
        plots.append(plot_lambdas(vals, out / f"{tag}_lambda.png", label="gate g" if layers[0].gate is not None
                                  else "λ", title=f"{tag}: per layer{sub}").name)
    if grid is not None:
        maps = [m.combined for m in layers]
        r = rollout(maps)  # (B, N, N)
        plots.append(plot_cls_maps({"A1 (last layer)": layers[-1].first, "combined (last layer)": maps[-1][:1],
                                    "rollout": r[:1, None]}, grid, out / f"{tag}_cls.png",
                                   image=inputs[0], title=f"{tag}: CLS attention{sub}").name)
    res["plots"] = plots
    return res, layers
