"""Attention logits and hidden states: activation outliers and quantised logits (Ye et al. 2024, §3.8).

Ye et al. 2024 ("Differential Transformer", §3.8, Table 5) compare the largest activations of a Transformer and a
Diff Transformer: top-1, top-10 and median of |S| over the attention logits S = Q Kᵀ / √d and of |h| over the
hidden states; and (Fig. 8) quantise the attention logits per head with absmax scaling to 8, 6 and 4 bits.

    with capture_logits(model) as cap:          # the model computes what it computes without the context
        model(ids)
    logit_stats(cap, per_map=True)              # {"top1", "top10", "median", "count", "per_map": {"A1": …, "A2": …}}
    with capture_hidden_states(model) as hs:
        model(ids)
    hidden_stats(hs)                            # {"top1", "top10", "median", "count"}
    with quantized_logits(model, 4):            # every map from logits rounded to 4 bits per head
        loss = model(ids)

Which layers: the library's attention layers, every kind of :data:`~diffattn.layers.ATTENTION_TYPES`
(:class:`~diffattn.layers.Attention`, :class:`~diffattn.layers.DiffAttention`,
:class:`~diffattn.layers.GatedDiffAttention`, :class:`~diffattn.layers.DiffAttentionV2`,
:class:`~diffattn.layers.GroupedDiffAttention`). While a context is active each of them runs the ``math`` backend
(the one that materialises the maps; the same equation as the fused ones) and a private hook of
:mod:`diffattn.functional` sees the logits S = Q Kᵀ · s of every softmax map it computes: after the rotary
embedding (and Gemma-2's soft-capping, when the layer has it), before the mask and the softmax. Standard attention
has one map per call ("A"); the differential layers two, A1 and A2, in that order. Grouped differential attention
(Motif Technologies 2025, arXiv 2510.06949) has H_s signal maps A1 and H_n < H_s noise maps A2, each noise head
shared by r = H_s / H_n signal heads: its A2 logits are recorded once per noise head, (B, H_n, Nq, Nk), as the
layer's parameters define them (the operator evaluates each r times; a mask that differs between the signal heads
of a group makes the copies differ, and then all H_s are kept). Without a context nothing
changes: the layers keep their backend and the fused kernels never see the hook. Contexts restore the layers on
exit, also when the body raises; nested contexts compose (the inner one sees the logits the outer one produces, so
``capture_logits`` inside ``quantized_logits`` records the quantised logits).

Stable Audio 3's DiT (diffusers' ``StableAudio3DiTModel`` with ``use_differential_attention=True``; Stability AI
2026, arXiv 2605.17991): its differential self- and cross-attention modules count as layers of kind
``"stable_audio"`` (:func:`~diffattn.adapters.diffusers.stable_audio_attention_modules`). While a context is
active each of them runs :class:`~diffattn.adapters.diffusers.StableAudio3DiffattnProcessor` on the ``math``
backend (whatever processor it had, diffusers' own or diffattn's with another backend, comes back on exit; an
``on_maps`` callback is kept), so the hook sees S1 = Q1 K1ᵀ · s and S2 = Q2 K2ᵀ · s per head, s = 1/√d, after the
modules' QK-norm and, in self-attention, the partial rotary embedding. The blocks around them
(``StableAudio3DiTBlock``) are the blocks of :func:`capture_hidden_states`.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..adapters.diffusers import StableAudio3DiffattnProcessor, stable_audio_attention_modules
from ..layers import ATTENTION_TYPES, StableAudioAttention, attention_kind
from ..ops import SCORE_HOOK, PreparedMask, causal_mask

__all__ = ["LogitCapture", "HiddenStateCapture", "capture_logits", "logit_stats", "capture_hidden_states",
           "hidden_stats", "quantized_logits", "quantize_absmax", "logit_layers"]

ScoreHook = Callable[[torch.Tensor, PreparedMask], torch.Tensor]


def logit_layers(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, layer, kind) for every diffattn attention layer of ``model`` (``model`` itself included), in module
    order; kind is the layer's name in :data:`~diffattn.layers.ATTENTION_TYPES` (``"standard"``, ``"diff"``,
    ``"gated"``, ``"diff_v2"``, ``"grouped"``, ``"stable_audio"``, ``"gdla"``;
    :func:`~diffattn.layers.attention_kind`). The differential attention modules of diffusers' Stable Audio 3 DiT
    are layers of kind ``"stable_audio"`` (module docstring). Raises ValueError when there is none."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    audio = {id(m) for _, m in stable_audio_attention_modules(model)}
    out = [(name, m, k) for name, m in model.named_modules()
           if (k := attention_kind(m) or (StableAudioAttention.kind if id(m) in audio else None)) is not None]
    if not out:
        classes = ", ".join(cls.__name__ for cls in ATTENTION_TYPES.values())
        raise ValueError(f"model ({type(model).__name__}) has no diffattn attention layer (one of {classes}, or "
                         f"the differential attention of diffusers' StableAudio3DiTModel); the logit diagnostics "
                         f"need the library's layers (a model converted by diffattn.retrofit keeps its own "
                         f"attention)")
    return out


def _on_math(m: nn.Module) -> Callable[[], None]:
    """Route ``m`` to the ``math`` backend; returns what puts it back. A library layer has a ``backend``; a
    Stable Audio 3 module of diffusers (no ``backend``) runs diffattn's processor on ``math`` instead of the one it
    has (module docstring)."""
    if attention_kind(m) is not None:
        backend, m.backend = m.backend, "math"
        return lambda: setattr(m, "backend", backend)
    old = m.processor
    m.set_processor(StableAudio3DiffattnProcessor("math", on_maps=getattr(old, "on_maps", None)))
    return lambda: m.set_processor(old)


def _seen(s: torch.Tensor, mask: PreparedMask) -> torch.Tensor | None:
    """Bool mask of the logits ``s`` (B, H, Nq, Nk) the softmax sees, broadcastable to ``s`` (4-D), or None when
    it sees them all. Rows the caller masked entirely (their output is 0) are not seen."""
    nq, nk = s.shape[-2:]
    if mask.sdpa_causal:
        return causal_mask(nq, nk, s.device)[None, None]  # (1, 1, Nq, Nk)
    if mask.keep is None:
        return None
    return mask.keep if mask.row_ok is None else mask.keep & mask.row_ok  # (1|B, 1|H, Nq, Nk)


@contextlib.contextmanager
def _routed(layers: list[tuple[str, nn.Module, str]], make_hook: Callable[[str, nn.Module, str], ScoreHook],
            on_call: Callable[[str, str], None] | None = None) -> Iterator[None]:
    """While active, each layer runs the ``math`` backend with the score hook ``make_hook(name, layer, kind)`` set
    around its forward (composed after any hook an outer context set); ``on_call(name, kind)`` runs before each
    call. Everything is restored on exit."""
    handles, restores, tokens = [], [], {}

    def pre(name, kind, hook):
        def fn(module, args, kwargs):
            if on_call is not None:
                on_call(name, kind)
            outer = SCORE_HOOK.get()
            h = hook if outer is None else (lambda s, m: hook(outer(s, m), m))
            tokens.setdefault(id(module), []).append(SCORE_HOOK.set(h))
            return None
        return fn

    def post(module, args, kwargs, output):
        stack = tokens.get(id(module))
        if stack:
            SCORE_HOOK.reset(stack.pop())
        return None

    try:
        for name, m, kind in layers:
            restores.append(_on_math(m))
            handles.append(m.register_forward_pre_hook(pre(name, kind, make_hook(name, m, kind)), with_kwargs=True))
            # prepend: an inner context's post-hook runs before an outer one's, so the hooks unwind in order
            handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True, prepend=True))
        yield
    finally:
        for h in handles:
            h.remove()
        for restore in reversed(restores):
            restore()


# ------------------------------------------------------------------------------------------------ logits


@dataclass
class LogitCapture:
    """Records the attention logits of every diffattn attention layer while active (module docstring).

    ``layers`` holds one dict per layer call, in call order: ``{"name": module name, "kind": "standard" | "diff" |
    "gated" | "diff_v2" | "grouped" | "stable_audio" | "gdla", "logits": [S (B, H, Nq, Nk) per map: one for standard
    attention, A1's and A2's for the differential layers; a grouped layer's A2 has its H_n noise heads (module
    docstring)], "mask": bool (Nq, Nk), or (1|B, 1|H, Nq, Nk), True where the softmax sees the entry (causal
    mask, ``attn_mask``, sliding window)}``. Logits are detached, in the dtype the layer computes them (at least
    float32), on ``device`` (None: where they were computed).
    """

    model: nn.Module
    device: torch.device | str | None = None
    layers: list[dict] = field(default_factory=list)
    _ctx: contextlib.AbstractContextManager | None = field(default=None, repr=False)

    def __enter__(self) -> LogitCapture:
        mods = logit_layers(self.model)
        processed = {id(m) for _, m in stable_audio_attention_modules(self.model)}  # diffusers modules

        def on_call(name, kind):
            self.layers.append({"name": name, "kind": kind, "logits": [], "mask": None})

        def make_hook(name, m, kind):
            def hook(s, mask):
                entry = self.layers[-1]
                if id(m) in processed and len(entry["logits"]) == 2:
                    return s  # the processor's second call for its on_maps: the same S1, S2 again
                seen = _seen(s, mask)
                if getattr(m, "group_ratio", 1) > 1 and entry["logits"] and (seen is None or seen.shape[1] == 1):
                    # A2: the operator met noise head j as the query of signal heads j·r … j·r + r − 1
                    entry["logits"].append(self._store(s[:, ::m.group_ratio]))
                else:
                    entry["logits"].append(self._store(s))
                if entry["mask"] is None:
                    nq, nk = s.shape[-2:]
                    if seen is None:
                        seen = torch.ones(nq, nk, dtype=torch.bool, device=s.device)
                    elif seen.shape[:2] == (1, 1):
                        seen = seen[0, 0]  # (Nq, Nk)
                    entry["mask"] = seen if self.device is None else seen.to(self.device)
                return s
            return hook

        self._ctx = _routed(mods, make_hook, on_call)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(*exc)

    def _store(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t if self.device is None else t.to(self.device)


def capture_logits(model: nn.Module, *, device: torch.device | str | None = None) -> LogitCapture:
    """Context manager that records the attention logits S = Q Kᵀ · s of every diffattn attention layer of
    ``model`` (one map for standard attention, the two branches of the differential layers; after RoPE, before the
    mask and the softmax), as :attr:`LogitCapture.layers`. The model's outputs are those of the ``math`` backend
    (equal to the fused backends' up to rounding). ``device`` moves the recorded tensors (None: leave them).

        with capture_logits(model) as cap:
            model(ids)
        cap.layers[0]["logits"][0]        # S of the first map of the first layer, (B, H, Nq, Nk)
    """
    logit_layers(model)  # the errors now, not at ``with``
    return LogitCapture(model, device=device)


# ----------------------------------------------------------------------------------------------- statistics


def _abs_stats(values: list[torch.Tensor]) -> dict:
    """top1, top10 (the 10th largest; the smallest when fewer than 10), median (mean of the two middle values for
    an even count) and count of the absolute values of the 1-D tensors ``values``."""
    v = torch.cat([t.reshape(-1) for t in values]).abs() if values else torch.zeros(0)
    n = v.numel()
    if n == 0:
        raise ValueError("no entries to summarise: the capture is empty (was the model called inside the context?) "
                         "or every entry is masked")
    top = torch.topk(v, min(10, n)).values  # order statistics: exact in the values' own dtype
    lo, hi = float(torch.kthvalue(v, (n + 1) // 2).values), float(torch.kthvalue(v, n // 2 + 1).values)
    return {"top1": float(top[0]), "top10": float(top[-1]), "median": (lo + hi) / 2, "count": int(n)}


def _logit_entries(capture_or_layers) -> list[dict]:
    layers = capture_or_layers.layers if isinstance(capture_or_layers, LogitCapture) else capture_or_layers
    if not isinstance(layers, (list, tuple)) or not all(
            isinstance(e, dict) and "logits" in e and "mask" in e for e in layers):
        raise ValueError(f"capture_or_layers must be a LogitCapture or its list of layer dicts (each with 'logits' "
                         f"and 'mask'), got {type(capture_or_layers).__name__}")
    return list(layers)


def _map_name(i: int, n: int) -> str:
    return "A" if n == 1 else f"A{i + 1}"


def logit_stats(capture_or_layers: LogitCapture | list[dict], *, per_map: bool = False) -> dict:
    """Top-1, top-10 and median of |S| over the attention logits the softmax sees (Ye et al. 2024, §3.8, Table 5):
    masked entries (causal, padding) are left out; all layers and maps together.

    Returns ``{"top1", "top10", "median", "count"}`` (top10 is the 10th largest value, median the mean of the two
    middle values for an even count, count the number of entries); with ``per_map`` also ``"per_map": {map:
    stats}`` for each map name present: ``"A"`` (standard attention's one map), ``"A1"`` and ``"A2"`` (the first
    and second branch of the differential layers).
    """
    groups: dict[str, list[torch.Tensor]] = {}
    for e in _logit_entries(capture_or_layers):
        maps, mask = e["logits"], e["mask"]
        for i, s in enumerate(maps):
            a = s.detach()
            if mask is not None:
                a = a[mask.to(a.device).expand_as(a)]  # the entries the softmax sees, 1-D
            groups.setdefault(_map_name(i, len(maps)), []).append(a)
    out = _abs_stats([t for ts in groups.values() for t in ts])
    if per_map:
        out["per_map"] = {k: _abs_stats(v) for k, v in sorted(groups.items())}
    return out


# --------------------------------------------------------------------------------------------- hidden states


def _blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules with a diffattn attention layer as a direct child (the transformer blocks), in module order."""
    layers = {id(m) for _, m, _ in logit_layers(model)}
    out = [(name, m) for name, m in model.named_modules() if any(id(c) in layers for c in m.children())]
    if not out:
        raise ValueError(f"model ({type(model).__name__}) has no block around its attention layers (a module with "
                         f"a diffattn attention layer as a direct child); pass the model that holds the blocks")
    return out


@dataclass
class HiddenStateCapture:
    """Records the output hidden states of every block while active: ``states`` holds one dict per block call, in
    call order, ``{"name": module name, "hidden": (B, N, dim) detached, on ``device`` (None: where computed)}``.
    A block is a module with a diffattn attention layer as a direct child (``LMBlock``, ``Block``)."""

    model: nn.Module
    device: torch.device | str | None = None
    states: list[dict] = field(default_factory=list)
    _handles: list = field(default_factory=list, repr=False)

    def __enter__(self) -> HiddenStateCapture:
        for name, m in _blocks(self.model):
            self._handles.append(m.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, name: str):
        def hook(module, args, output):
            h = output[0] if isinstance(output, (tuple, list)) else output  # blocks that also return weights
            h = h.detach()
            self.states.append({"name": name, "hidden": h if self.device is None else h.to(self.device)})
            return None
        return hook


def capture_hidden_states(model: nn.Module, *, device: torch.device | str | None = None) -> HiddenStateCapture:
    """Context manager that records each block's output hidden states (B, N, dim) (Ye et al. 2024, §3.8, Table 5's
    "hidden state"); the model's computation is untouched (forward hooks that return nothing).

        with capture_hidden_states(model) as hs:
            model(ids)
        hidden_stats(hs)
    """
    _blocks(model)
    return HiddenStateCapture(model, device=device)


def hidden_stats(capture_or_states: HiddenStateCapture | list) -> dict:
    """Top-1, top-10 (the 10th largest) and median of |h| over every recorded hidden state (all blocks, tokens and
    channels) (Ye et al. 2024, §3.8, Table 5): ``{"top1", "top10", "median", "count"}``. Takes a
    :class:`HiddenStateCapture`, its ``states`` or a list of tensors."""
    states = capture_or_states.states if isinstance(capture_or_states, HiddenStateCapture) else capture_or_states
    if not isinstance(states, (list, tuple)):
        raise ValueError(f"capture_or_states must be a HiddenStateCapture, its states or a list of tensors, got "
                         f"{type(capture_or_states).__name__}")
    tensors = []
    for s in states:
        t = s["hidden"] if isinstance(s, dict) else s
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"capture_or_states must hold tensors (or dicts with 'hidden'), got {type(t).__name__}")
        tensors.append(t.detach())
    return _abs_stats(tensors)


# ------------------------------------------------------------------------------------------- quantisation


def _check_bits(bits) -> int:
    if not isinstance(bits, numbers.Integral) or isinstance(bits, bool) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer in [2, 16], got {bits!r}")
    return int(bits)


def quantize_absmax(s: torch.Tensor, seen: torch.Tensor | None, bits: int) -> torch.Tensor:
    """S_q = round(S / Δ) · Δ, Δ = max|S| / (2^(bits−1) − 1), the max per batch element and head over the entries
    the softmax sees (``seen``, broadcastable to s (B, H, Nq, Nk); None: all): absmax quantisation (Ye et al. 2024,
    §3.8, Fig. 8). A head whose seen logits are all 0 keeps them (Δ = 0)."""
    a = s.abs() if seen is None else s.abs().masked_fill(~seen, 0)
    delta = a.amax(dim=(-2, -1), keepdim=True) / (2 ** (bits - 1) - 1)  # (B, H, 1, 1)
    delta = torch.where(delta > 0, delta, torch.ones_like(delta))  # Δ = 0: every seen S is 0, round(0) = 0
    return torch.round(s / delta) * delta


def quantized_logits(model: nn.Module, bits: int) -> contextlib.AbstractContextManager:
    """Context manager under which every diffattn attention layer of ``model`` computes its maps from logits
    quantised per head with absmax scaling (Ye et al. 2024, §3.8, Fig. 8):

        S_q = round(S / Δ) · Δ,   Δ = max|S| / (2^(bits−1) − 1),   A = softmax(S_q + M)

    the max over the entries the softmax sees, per batch element and head; λ, the gate, the sub-norm, V and the
    output projection are unchanged. ``bits``: an integer in [2, 16]; a logit moves by at most Δ/2 (max|S| / 65534
    at 16 bits). Meant for evaluation: round has no gradient.
    """
    bits = _check_bits(bits)
    mods = logit_layers(model)

    def make_hook(name, m, kind):
        return lambda s, mask: quantize_absmax(s, _seen(s, mask), bits)

    return _routed(mods, make_hook)
