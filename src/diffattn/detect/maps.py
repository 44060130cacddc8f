"""Attention maps of a YOLO model's attention layers over an image (captured with forward hooks).

Covers :class:`~diffattn.detect.DiffAttention2d`, :class:`~diffattn.detect.DiffPSAAttention`, Ultralytics'
``Attention`` (standard: A = softmax(q_jᵀ k_j / √d_k) per head j) and Ultralytics ``Attention`` modules converted by
:func:`diffattn.retrofit`. Differential maps are signed (A1 − λ A2); nothing is rectified.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from ultralytics.nn.modules.block import Attention

from ..adapters.bindings.ultralytics import standard_attention_weights
from .modules import DiffAttention2d, DiffPSAAttention

__all__ = ["attention_layers", "attention_maps", "standard_attention_maps"]


def standard_attention_maps(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q_jᵀ k_j · s) of Ultralytics' ``Attention`` for input x (B, C, H, W): (B, h, N, N)."""
    return standard_attention_weights(m, x).combined


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every attention layer of ``model`` whose maps :func:`attention_maps` computes."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, (DiffAttention2d, DiffPSAAttention, Attention))]


@torch.no_grad()
def attention_maps(model: nn.Module, x: torch.Tensor) -> list[tuple[str, torch.Tensor, tuple[int, int]]]:
    """Run ``model`` on ``x`` (B, 3, H, W) and return, for every attention layer in call order, its name, its maps
    (B, heads, N, N) as float32 on the CPU (the combined map for differential layers) and its grid (h, w), N = h·w.

    Raises ValueError when ``model`` has no attention layer."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"model ({type(model).__name__}) has no attention layer (DiffAttention2d, "
                         "DiffPSAAttention or Ultralytics Attention)")
    inputs: list[tuple[str, nn.Module, torch.Tensor]] = []
    handles = [m.register_forward_pre_hook(lambda mod, args, n=n: inputs.append((n, mod, args[0].detach())))
               for n, m in layers]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    out = []
    for name, m, inp in inputs:
        maps = m.attention_maps(inp) if hasattr(m, "attention_maps") else standard_attention_maps(m, inp)
        out.append((name, maps.float().cpu(), (int(inp.shape[-2]), int(inp.shape[-1]))))
    return out
