"""Capture attention maps from a model with hooks, without changing what it computes.

    with capture_attention(model) as cap:
        logits = model(x)                      # the same logits as without the context
    cap.layers[0].first, .second, .combined    # A1, A2, w1 ⊙ A1 − λ ⊙ A2, each (B, heads, Nq, Nk)
    cap.layers[0].lambda_, .gate               # λ per head (differential) or the gate g (B, H, N, 1) (gated)

Which modules are captured:

- the library's attention layers, every kind of :data:`~diffattn.layers.ATTENTION_TYPES` (standard, diff, gated,
  diff_v2, grouped; anything else whose ``forward`` takes ``need_weights`` is captured as "diff" or "standard"): a
  forward pre-hook asks the layer for its weights (``need_weights=True``) and a forward hook takes them out of the
  result again, so the caller sees exactly the tensor type it asked for. λ and the gate come from the layer's
  public ``lambda_weights(x)`` (w1, λ): for Ye et al. 2024 eq. 2 λ is one scalar per layer, repeated per head;
  for M-DGSA (2025) eq. 3 the gate is g = w1 and λ = 1 − g per token and head; for the Differential Transformer
  V2, λ = σ(x W_λ) per token and head. Grouped differential attention (Motif Technologies 2025, arXiv 2510.06949)
  has H_s signal heads and H_n noise heads, noise head j shared by the r = H_s / H_n signal heads j·r … j·r + r − 1:
  ``first`` and ``combined`` hold the H_s signal heads, ``second`` the H_n noise maps, each once (signal head i
  subtracts ``second[:, i // r]``; a mask that differs between the signal heads of a group makes the noise maps
  differ too, and then ``second`` holds the H_s maps the layer applied), λ one value per signal head (its group's).
- attention modules converted by :func:`diffattn.retrofit` (they carry a ``diff_adapter``; every binding:
  transformers, timm, open_clip): while the context is active the adapter keeps the maps of each call
  (``keep_maps``) and a forward hook records them, the module's inputs and outputs untouched: A1, A2 and the
  combined map A1 − λA2 for DAA / DiffQ / DiffK (A2 from the second query or key), A and no A2 for DiffV and DEX
  (one map), A1, A1 and (1 − λ)A1 for shared-QK, the channel halves' A1, A2 for split-heads (see
  :func:`diffattn.adapters.methods.run_method`); λ comes from the adapter.
- modules that compute their maps from their input on request, through an ``attention_weights(x)`` method returning
  (first, second, combined) (the detector's ``DiffPSAAttention`` over a feature map), and Ultralytics' own standard
  ``Attention`` (the PSA attention of YOLO11 / YOLO26, A = softmax(q_jᵀ k_j / √d_k) per head, read through the
  Ultralytics binding): a forward pre-hook computes the maps from the module's input; the forward itself is
  untouched. λ comes from the module's ``lambda_value()``.

Outputs are unchanged bit for bit, on any CPU and thread count: a layer asked for its weights and a retrofit that
keeps its maps compute the maps on the side (``math`` backend, no dropout) while the output takes the path it takes
without them (the fused or SDPA kernels, which sum in another order than ``math``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..adapters.bindings.ultralytics import is_standard_attention, standard_attention_weights
from ..layers import attention_kind

__all__ = ["LayerMaps", "AttentionCapture", "capture_attention", "attention_modules"]


@dataclass
class LayerMaps:
    """The maps of one attention module for one forward call (float32, on ``AttentionCapture.device``).

    first: A1 (B, heads, Nq, Nk); second: A2 or None (standard attention; retrofits with one map), for a grouped
    layer one map per noise head (B, H_n, Nq, Nk) (module docstring); combined: the signed map the layer applies to
    V (B, heads, Nq, Nk); lambda_: λ as (heads,) or (B, heads, Nq, 1) or None; gate: g (B, heads, Nq, 1) or None;
    kind: the layer's name in :data:`~diffattn.layers.ATTENTION_TYPES`, or "retrofit".
    """

    name: str
    first: torch.Tensor | None
    second: torch.Tensor | None
    combined: torch.Tensor
    lambda_: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    kind: str = "standard"  # "standard" | "diff" | "gated" | "diff_v2" | "grouped" | "retrofit"


def _takes_need_weights(m: nn.Module) -> bool:
    try:
        return "need_weights" in inspect.signature(m.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, how) for every capturable attention module in ``model``, in module order; ``how`` is
    ``"layer"`` (a library layer with ``need_weights``), ``"retrofit"`` (a module converted by retrofit) or
    ``"maps"`` (a module with an ``attention_weights(x)`` method, or Ultralytics' standard ``Attention``).
    Containers that merely forward ``need_weights`` to an inner attention layer (blocks) are skipped."""
    out = []
    for name, m in model.named_modules():
        if hasattr(m, "diff_adapter"):
            out.append((name, m, "retrofit"))
        elif attention_kind(m) is not None or (
                _takes_need_weights(m) and hasattr(m, "q_proj") and not isinstance(m, nn.MultiheadAttention)):
            out.append((name, m, "layer"))
        elif callable(getattr(m, "attention_weights", None)) or is_standard_attention(m):
            out.append((name, m, "maps"))
    return out


def _grouped_maps(module: nn.Module, second: torch.Tensor, lam: torch.Tensor | None,
                  attn_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A grouped layer's A2 once per noise head and λ per signal head (module docstring). The layer returns A2 per
    signal head, noise head j repeated for its r signal heads; λ per noise head (a per-head or per-token form)
    scales the maps of the r signal heads of its group."""
    r, noise = module.group_ratio, module.num_noise_heads
    per_head_mask = isinstance(attn_mask, torch.Tensor) and attn_mask.dim() >= 3 and attn_mask.shape[-3] > 1
    if not per_head_mask:
        second = second[:, ::r]  # (B, H_n, Nq, Nk)
    if lam is not None and lam.dim() >= 3 and lam.shape[-3] == noise:
        lam = lam.repeat_interleave(r, dim=-3)
    return second, lam


@dataclass
class AttentionCapture:
    """Collects :class:`LayerMaps` while active; ``layers`` holds one entry per captured module call, in call
    order (a model called twice inside the context records every module twice)."""

    model: nn.Module
    device: torch.device | str = "cpu"
    names: list[str] | None = None
    layers: list[LayerMaps] = field(default_factory=list)
    _handles: list = field(default_factory=list, repr=False)
    _pending: dict = field(default_factory=dict, repr=False)
    _kept: list = field(default_factory=list, repr=False)

    def __enter__(self) -> AttentionCapture:
        mods = attention_modules(self.model)
        if self.names is not None:
            unknown = set(self.names) - {n for n, _, _ in mods}
            if unknown:
                raise ValueError(f"names must be attention modules of the model; {sorted(unknown)} are not (known: "
                                 f"{[n for n, _, _ in mods]})")
            mods = [t for t in mods if t[0] in self.names]
        if not mods:
            raise ValueError(f"model ({type(self.model).__name__}) has no attention module that capture_attention "
                             f"can hook: it needs diffattn layers, a model converted by diffattn.retrofit or "
                             f"Ultralytics' Attention")
        for name, m, how in mods:
            if how == "layer":
                self._handles.append(m.register_forward_pre_hook(self._pre_layer(name), with_kwargs=True))
                self._handles.append(m.register_forward_hook(self._post_layer(name), with_kwargs=True))
            elif how == "maps":
                self._handles.append(m.register_forward_pre_hook(self._pre_maps(name)))
            else:
                m.diff_adapter.keep_maps = True
                self._kept.append(m.diff_adapter)
                self._handles.append(m.register_forward_hook(self._post_retrofit(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        for ad in self._kept:
            ad.keep_maps, ad.last_maps = False, None
        self._handles.clear()
        self._kept.clear()
        self._pending.clear()

    def _store(self, t):
        return None if t is None else t.detach().to(self.device, torch.float32)

    # -- library layers: forward(x, attn_mask=None, need_weights=False, ...)
    def _pre_layer(self, name: str):
        def hook(module, args, kwargs):
            asked = bool(args[2]) if len(args) > 2 else bool(kwargs.get("need_weights", False))
            x = args[0] if args else kwargs["x"]
            lam = gate = None
            lw = getattr(module, "lambda_weights", None)
            if callable(lw):
                with torch.no_grad():
                    w1, lam = lw(x)
                if callable(getattr(getattr(module, "lambda_fn", None), "gate", None)):
                    gate = torch.as_tensor(w1)  # a gate λ form (M-DGSA): w1 = g, λ = 1 − g
                lam = torch.as_tensor(lam, dtype=torch.float32)
                if lam.dim() == 0:  # one λ per layer: repeat it per differential head
                    lam = lam.expand(getattr(module, "diff_heads", 1)).clone()
            self._pending[id(module)] = (asked, lam, gate)
            if len(args) > 2:
                args = (*args[:2], True, *args[3:])
            else:
                kwargs = dict(kwargs, need_weights=True)
            return args, kwargs
        return hook

    def _post_layer(self, name: str):
        def hook(module, args, kwargs, output):
            asked, lam, gate = self._pending.pop(id(module), (False, None, None))
            out, w = output
            kind = attention_kind(module) or ("diff" if w.second is not None else "standard")
            second = w.second
            if getattr(module, "group_ratio", 1) > 1:  # noise heads shared by groups of signal heads
                second, lam = _grouped_maps(module, second, lam, args[1] if len(args) > 1 else
                                            kwargs.get("attn_mask"))
            self.layers.append(LayerMaps(name, self._store(w.first), self._store(second),
                                         self._store(w.combined), self._store(lam), self._store(gate), kind))
            return output if asked else out
        return hook

    # -- modules with attention_weights(x): the maps computed from the input before the forward runs
    def _pre_maps(self, name: str):
        def hook(module, args):
            fn = getattr(module, "attention_weights", None)
            w = fn(args[0]) if callable(fn) else standard_attention_weights(module, args[0])
            lam = getattr(module, "lambda_value", None)
            if callable(lam) and w.second is not None:  # one λ per layer: repeat it per differential head
                lam = torch.as_tensor(lam()).detach().float().reshape(-1).expand(w.combined.shape[1]).clone()
            else:
                lam = None
            kind = "diff" if w.second is not None else "standard"
            self.layers.append(LayerMaps(name, self._store(w.first), self._store(w.second), self._store(w.combined),
                                         self._store(lam), None, kind))
            return None
        return hook

    # -- retrofitted modules (any binding): the adapter keeps its maps while the context is active
    def _post_retrofit(self, name: str):
        def hook(module, args, output):
            ad = module.diff_adapter
            maps = getattr(ad, "last_maps", None)
            if maps is not None:
                ad.last_maps = None
                lam = ad.lambda_value().detach().float().reshape(-1)
                self.layers.append(LayerMaps(name, self._store(maps.first), self._store(maps.second),
                                             self._store(maps.combined), self._store(lam), None, "retrofit"))
            return None
        return hook

    # -- views
    def combined(self) -> list[torch.Tensor]:
        """The combined (signed) map of every captured call, in order."""
        return [m.combined for m in self.layers]


def capture_attention(model: nn.Module, *, names: list[str] | None = None,
                      device: torch.device | str = "cpu") -> AttentionCapture:
    """Context manager that records the attention maps of ``model`` (module docstring). ``names`` restricts it
    to those module names (see :func:`attention_modules`); maps are stored as float32 on ``device``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return AttentionCapture(model, device=device, names=names)
