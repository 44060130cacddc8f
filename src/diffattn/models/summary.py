"""``summary(model, inputs)``: parameters, FLOPs per sample and activation memory of one forward pass.

- Parameters: all and trainable (``numel``; works on ``device="meta"`` models).
- FLOPs: :class:`torch.utils.flop_counter.FlopCounterMode` over one forward pass (a multiply-add counts 2),
  divided by the batch size. SDPA calls run under PyTorch's math backend while counting (the fused CPU kernels
  report none). The count is that of the layer's own ``backend``: per layer and sample, standard attention's
  core is 4N²D; differential attention's is 4N²D on ``backend="math"`` (one product with the combined map)
  and 8N²D on ``"sdpa"`` (two O(N) calls with Q/K padded to V's width 2d; docs/design.md).
- Activation memory: bytes of the tensors autograd saves for the backward pass (each storage once, parameters
  excluded), per sample: the memory a training step holds between forward and backward.

M-DGSA (2025, App. B.4) reports the same three quantities (Table 9); DiffCLIP (Hammoud & Ghanem 2025, §4.1)
the parameter overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["ModelSummary", "summary", "parameter_count"]


@dataclass(frozen=True)
class ModelSummary:
    """What :func:`summary` measures; ``None`` where no input was given."""

    params: int
    trainable_params: int
    flops_per_sample: float | None = None
    activation_bytes_per_sample: float | None = None
    batch_size: int | None = None

    def __str__(self) -> str:
        parts = [f"params {self.params:,} (trainable {self.trainable_params:,})"]
        if self.flops_per_sample is not None:
            parts.append(f"{self.flops_per_sample / 1e9:.3f} GFLOPs/sample")
        if self.activation_bytes_per_sample is not None:
            parts.append(f"{self.activation_bytes_per_sample / 2**20:.2f} MiB activations/sample")
        return ", ".join(parts)


def parameter_count(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (each shared tensor once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        n += p.numel()
    return n


def _as_args(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)) and inputs and all(isinstance(t, torch.Tensor) for t in inputs):
        return tuple(inputs)
    raise ValueError(f"inputs must be a tensor or a tuple of tensors (model(*inputs)), "
                     f"got {type(inputs).__name__}")


def summary(model: nn.Module, inputs: torch.Tensor | tuple | None = None) -> ModelSummary:
    """Parameters; with ``inputs`` (a tensor, or a tuple passed as ``model(*inputs)``, batch first) also FLOPs
    and saved-activation bytes per sample of one forward pass in the model's current train/eval mode."""
    params, trainable = parameter_count(model), parameter_count(model, trainable_only=True)
    if inputs is None:
        return ModelSummary(params, trainable)
    from torch.utils.flop_counter import FlopCounterMode  # here: it imports triton (0.3 s) where installed

    args = _as_args(inputs)
    batch = args[0].shape[0] if args[0].dim() else 1
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(*args)
    flops = counter.get_total_flops()

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters() if p.device.type != "meta"}
    storages: dict[tuple, int] = {}

    def pack(t: torch.Tensor):
        if t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr not in param_ptrs:
                storages[(t.device.type, ptr)] = t.untyped_storage().nbytes()
        else:
            storages[("meta", id(t))] = t.numel() * t.element_size()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args)
    return ModelSummary(params, trainable, flops / batch, sum(storages.values()) / batch, batch)
