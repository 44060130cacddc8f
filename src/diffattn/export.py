"""ONNX export of any diffattn model: ``export_onnx(model, example_inputs, path)``.

``torch.onnx.export`` (the TorchScript-based exporter, ``dynamo=False``) hands a model's forward every argument it
has, defaults and keyword-only ones included, by position, so a forward with keyword-only arguments
(``CausalLM(input_ids, …, *, position_ids=None)``, ``CLIP(images, tokens, *, image=None, text=None)``) cannot be
exported directly. :func:`export_onnx` exports a thin wrapper whose forward takes exactly the example inputs (by
position or by name) and returns the model's outputs as a flat tuple of tensors, named after a dict output's keys.
The layers need nothing else: the differential layers' RMSNorm is written out in elementary ops while exporting
(the exporter has no ``aten::rms_norm``) and grouped K/V are repeated (it has no SDPA with ``enable_gqa``).

With ``check=True`` (default) the file is run once in onnxruntime on the example inputs and compared with the eager
model: a difference above ``atol`` is a ValueError, so a file that does not compute what the model computes is never
returned silently. onnx and onnxruntime come with the extra ``export`` (``pip install 'diffattn[export]'``).

This module imports nothing from diffattn: it works on any ``nn.Module`` whose outputs are tensors, or dicts, tuples
or lists of tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

__all__ = ["export_onnx"]


def _flatten(out: Any) -> tuple[list[str], list[torch.Tensor]]:
    """(names, tensors) of a forward's output: a tensor → ``output``; a dict → its keys (None values left out); a
    tuple or list → ``output_0``, ``output_1``, …"""
    if isinstance(out, torch.Tensor):
        return ["output"], [out]
    if isinstance(out, Mapping):
        items = [(str(k), v) for k, v in out.items() if v is not None]
    elif isinstance(out, (tuple, list)):
        items = [(f"output_{i}", v) for i, v in enumerate(out) if v is not None]
    else:
        raise TypeError(f"the model's forward must return a tensor, or a dict, tuple or list of tensors, got "
                        f"{type(out).__name__}")
    bad = [k for k, v in items if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"the model's outputs {bad} are not tensors; ONNX exports tensor outputs only")
    return [k for k, _ in items], [v for _, v in items]


class _Traceable(nn.Module):
    """``model`` called with exactly the example inputs (positionally, or as the keywords ``names``), its outputs
    flattened to a tuple of tensors (:func:`_flatten`)."""

    def __init__(self, model: nn.Module, names: Sequence[str] | None) -> None:
        super().__init__()
        self.model, self.names = model, list(names) if names is not None else None

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.names, args))) if self.names is not None else self.model(*args)
        return tuple(_flatten(out)[1])


def export_onnx(model: nn.Module, example_inputs: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
                path: str | os.PathLike, *, dynamic_batch: bool = True, dynamic_axes: dict | None = None,
                opset_version: int | None = None, check: bool = True, atol: float = 1e-4) -> Path:
    """Export ``model`` (in eval mode) to the ONNX file ``path``; returns the path.

    ``example_inputs``: a tensor, a tuple of positional inputs (``(ids,)`` for a ``CausalLM``, ``(images,)`` for a
    ``VisionTransformer``) or a dict of keyword inputs (``{"images": x, "tokens": t}`` for a ``CLIP``); the ONNX
    inputs are named ``input_0``, … or after the dict's keys. Outputs are named ``output`` (one tensor), after a
    dict output's keys (``image_embed``, ``text_embed``, …) or ``output_0``, ….

    ``dynamic_batch``: axis 0 of every input is the dynamic ``batch`` (the file runs at any batch size);
    ``dynamic_axes`` (``torch.onnx.export``'s argument, e.g. ``{"input_0": {0: "batch", 1: "length"}}``) replaces
    that. ``check``: run the file in onnxruntime on ``example_inputs`` and raise ValueError when an output differs
    from the eager model's by more than ``atol`` (skipped, with nothing checked, where onnxruntime is not installed).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, Mapping):
        names, args = [str(k) for k in example_inputs], tuple(example_inputs.values())
    elif isinstance(example_inputs, (tuple, list)):
        names, args = None, tuple(example_inputs)
    else:
        raise TypeError(f"example_inputs must be a tensor, a tuple of tensors or a dict of name → tensor, got "
                        f"{type(example_inputs).__name__}")
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError(f"example_inputs must hold one or more tensors, got {[type(a).__name__ for a in args]}")
    input_names = names if names is not None else [f"input_{i}" for i in range(len(args))]
    if dynamic_axes is None and dynamic_batch:
        dynamic_axes = {n: {0: "batch"} for n, a in zip(input_names, args) if a.dim() > 0}
    path = Path(path)
    wrapper = _Traceable(model, names)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output_names, expected = _flatten(model(**dict(zip(names, args))) if names is not None else model(*args))
            kwargs = {} if opset_version is None else {"opset_version": opset_version}
            torch.onnx.export(wrapper, args, str(path), dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic_axes, **kwargs)
    finally:
        model.train(was_training)
    if check:
        _check(path, input_names, args, output_names, expected, atol)
    return path


def _check(path: Path, input_names: list[str], args: tuple[torch.Tensor, ...], output_names: list[str],
           expected: list[torch.Tensor], atol: float) -> None:
    """Run ``path`` in onnxruntime and compare each output with the eager one (ValueError naming the worst)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed_names = {i.name for i in session.get_inputs()}
    got = session.run(None, {n: a.detach().cpu().numpy() for n, a in zip(input_names, args) if n in feed_names})
    for name, ref, out in zip(output_names, expected, got):
        ref = ref.detach().float().cpu()
        out = torch.from_numpy(out).float()
        if tuple(out.shape) != tuple(ref.shape):
            raise ValueError(f"{path}: output {name!r} has shape {tuple(out.shape)} in onnxruntime, the model gives "
                             f"{tuple(ref.shape)}")
        diff = float((out - ref).abs().max()) if ref.numel() else 0.0
        if not diff <= atol:
            raise ValueError(f"{path}: output {name!r} differs from the model's by {diff:.3g} in onnxruntime "
                             f"(atol {atol:g})")
