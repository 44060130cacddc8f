"""diffusers' Stable Audio 3 DiT on diffattn's operator: an attention processor for its differential self- and
cross-attention modules (Stability AI 2026, "Stable Audio 3", arXiv 2605.17991; diffusers ≥ 0.40,
``StableAudio3DiTModel(use_differential_attention=True)``).

    model.set_attn_processor(StableAudio3DiffattnProcessor())          # every self- and cross-attention module
    with capture_stable_audio_maps(model) as maps:                     # A1, A2 and A1 − A2 per module and head
        model(latents, t, context, global_cond)

diffusers' own processors (``StableAudio3SelfAttnProcessor``, ``StableAudio3CrossAttnProcessor``) compute
Attn(Q1, K1, V) − Attn(Q2, K2, V) as two attention calls; this one makes a single call of
:func:`~diffattn.functional.diff_attention` with λ = 1 for both maps (and its backends: the fused kernel, the O(N)
SDPA path, the CPU training path), everything around it as diffusers computes it: the fused projections
(``to_qkv`` = [q1 | q2 | k1 | k2 | v] for self-attention; ``to_q`` = [q1 | q2] and ``to_kv`` = [k1 | k2 | v] for
cross-attention), the modules' own QK-norms, the partial rotary embedding in float32 on the first channels of each
head (self-attention only) and ``to_out``. It holds no weights: the module keeps its state dict, and the DiT computes
what diffusers' processors compute (``tests/test_adapters_diffusers.py``: ≤ 1e-10 in float64).

The processor is duck-typed on the modules' attributes (``heads``, ``dim_heads``, ``use_differential``, ``to_qkv`` or
``to_q`` / ``to_kv``, ``q_norm``, ``k_norm``, ``to_out``); importing this module does not import diffusers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from ..ops import BACKENDS, AttentionWeights, diff_attention

__all__ = ["StableAudio3DiffattnProcessor", "stable_audio_attention_modules", "capture_stable_audio_maps"]


def _rotate_partial(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Stable Audio 3's partial RoPE as diffusers applies it: t (B, h, N, d), freqs (≥ N, r) = [θ | θ] per position
    (the last N rows are t's); the first r channels rotated in float32 (rotate-half pairing, channel i with
    i + r/2), the rest passed through, the result in t's dtype."""
    r = freqs.shape[-1]
    t_rot, t_pass = t[..., :r].float(), t[..., r:]
    freqs = freqs[-t.shape[-2]:].float()  # (N, r), broadcast over (B, h)
    x1, x2 = t_rot.unflatten(-1, (2, -1)).unbind(-2)
    t_rot = t_rot * freqs.cos() + torch.cat((-x2, x1), dim=-1) * freqs.sin()
    return torch.cat((t_rot.to(t.dtype), t_pass), dim=-1)


#: parts of the names of diffusers' attention backends that compute attention in 8 bits: SageAttention's (``sage``,
#: ``sage_varlen``, ``_sage_qk_int8_pv_fp8_cuda``, …: Q and K quantised to int8, P V in fp8 or fp16; Zhang et al.
#: 2025, "SageAttention"), and any other named for int8 or fp8
_LOSSY_MARKERS = ("sage", "int8", "fp8")


def _lossy_backend(processor: object) -> tuple[str, str] | None:
    """(name, where it was set) of the 8-bit diffusers attention backend a differential module would be routed
    through, else None: the backend ``model.set_attention_backend`` gave ``processor`` (its
    ``_attention_backend``), then diffusers' active one (``attention_backend(...)``, ``set_attention_backend``,
    the ``DIFFUSERS_ATTN_BACKEND`` variable). Reads diffusers only when it is already imported."""
    dispatch = sys.modules.get("diffusers.models.attention_dispatch")
    registry = getattr(dispatch, "_AttentionBackendRegistry", None)
    for backend, where in ((getattr(processor, "_attention_backend", None), "set on the module by "
                            "model.set_attention_backend"),
                           (getattr(registry, "_active_backend", None), "diffusers' active attention backend: "
                            "attention_backend(...), set_attention_backend or DIFFUSERS_ATTN_BACKEND")):
        name = str(getattr(backend, "value", backend)).lower() if backend is not None else ""
        if any(marker in name for marker in _LOSSY_MARKERS):
            return name, where
    return None


class StableAudio3DiffattnProcessor:
    """Attention processor for diffusers' ``StableAudio3SelfAttention`` and ``StableAudio3CrossAttention``
    (module docstring): one instance serves both, so ``model.set_attn_processor(StableAudio3DiffattnProcessor())``
    converts a whole ``StableAudio3DiTModel``.

    Args:
        backend: the operator's backend, ``"auto"``, ``"math"``, ``"sdpa"`` or ``"triton"``
            (:func:`~diffattn.functional.diff_attention`).
        on_maps: called as ``on_maps(module, weights)`` after every call with A1, A2 and A1 − A2
            (:class:`~diffattn.functional.AttentionWeights`, detached), computed on the side by the ``math``
            backend: the output keeps its own path. :func:`capture_stable_audio_maps` sets it.

    A context mask (B, M), True = attend, masks the context keys of cross-attention; a query whose every key is
    masked gives 0 (diffusers' SDPA call gives NaN there). A call while an 8-bit diffusers attention backend is set
    (SageAttention's ``sage*``, or any named for int8 or fp8; on the model by ``set_attention_backend`` or active
    through ``attention_backend(...)`` / ``DIFFUSERS_ATTN_BACKEND``) raises a ``ValueError`` naming it: the
    subtraction of two maps that agree to many digits does not survive 8-bit attention.
    """

    # read and set by diffusers (``set_attention_backend``, context parallelism); diffattn's operator chooses its
    # own kernels through ``backend``
    _attention_backend = None
    _parallel_config = None

    def __init__(self, backend: str = "auto", *,
                 on_maps: Callable[[nn.Module, AttentionWeights], None] | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if on_maps is not None and not callable(on_maps):
            raise ValueError(f"on_maps must be None or a callable (module, weights), got {type(on_maps).__name__}")
        self.backend = backend
        self.on_maps = on_maps

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, rope: torch.Tensor | None = None,
                 context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not getattr(attn, "use_differential", False):
            raise ValueError(f"StableAudio3DiffattnProcessor runs differential attention; {type(attn).__name__} "
                             f"has use_differential={getattr(attn, 'use_differential', None)!r} (build the DiT with "
                             f"use_differential_attention=True, or keep diffusers' processor)")
        lossy = _lossy_backend(self)
        if lossy is not None:
            raise ValueError(f"{type(attn).__name__} is differential attention, and the diffusers attention backend "
                             f"{lossy[0]!r} ({lossy[1]}) computes attention in 8 bits: A1 V − A2 V cancels to a "
                             f"difference that 8-bit Q Kᵀ and P V lose (docs/reliability.md, 'Precision'). Use a "
                             f"full-precision diffusers backend ('native', 'flash', 'flex', 'xformers', "
                             f"'_native_*': model.set_attention_backend('native')) — this processor computes both maps "
                             f"with diffattn's operator (backend={self.backend!r}: 'auto', 'math', 'sdpa' or "
                             f"'triton', all safe) and calls none of diffusers' backends")

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, N, h·d) → (B, h, N, d)
            return t.unflatten(-1, (attn.heads, attn.dim_heads)).transpose(1, 2)

        attn_mask = None
        if hasattr(attn, "to_qkv"):  # self-attention
            if context is not None:
                raise ValueError(f"{type(attn).__name__} is self-attention (to_qkv); got a context")
            q1, q2, k1, k2, v = map(heads, attn.to_qkv(hidden_states).chunk(5, dim=-1))
        else:  # cross-attention
            if context is None:
                raise ValueError(f"{type(attn).__name__} is cross-attention (to_q, to_kv); context is required")
            q1, q2 = map(heads, attn.to_q(hidden_states).chunk(2, dim=-1))
            k1, k2, v = map(heads, attn.to_kv(context).chunk(3, dim=-1))
            if context_mask is not None:
                attn_mask = context_mask[:, None, None, :].bool()  # (B, 1, 1, M), True = attend
        q1, q2 = attn.q_norm(q1), attn.q_norm(q2)
        k1, k2 = attn.k_norm(k1), attn.k_norm(k2)
        if rope is not None:
            q1, q2, k1, k2 = (_rotate_partial(t, rope) for t in (q1, q2, k1, k2))
        # λ = 1 (w1 = 1): A1 − A2, one operator call for both maps
        out = diff_attention(q1, k1, q2, k2, v, 1.0, attn_mask=attn_mask, backend=self.backend)  # (B, h, N, d)
        if self.on_maps is not None:
            with torch.no_grad():
                _, weights = diff_attention(q1, k1, q2, k2, v, 1.0, attn_mask=attn_mask, backend="math",
                                            return_weights=True)
            self.on_maps(attn, AttentionWeights(*(w.detach() for w in weights)))
        return attn.to_out(out.transpose(1, 2).flatten(2))


def stable_audio_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every differential Stable Audio 3 attention module of ``model`` (self-attention: a
    ``to_qkv``; cross-attention: ``to_q`` and ``to_kv``; both with ``use_differential``), in module order."""
    return [(name, m) for name, m in model.named_modules()
            if getattr(m, "use_differential", False) is True and callable(getattr(m, "set_processor", None))
            and (hasattr(m, "to_qkv") or hasattr(m, "to_kv"))]


@contextlib.contextmanager
def capture_stable_audio_maps(model: nn.Module, *, backend: str = "auto"
                              ) -> Iterator[dict[str, list[AttentionWeights]]]:
    """While active, every differential attention module of a Stable Audio 3 DiT runs
    :class:`StableAudio3DiffattnProcessor` recording its maps (``on_maps``); the yielded dict maps each module's name
    (``transformer_blocks.0.self_attn``, ``transformer_blocks.0.cross_attn``, …) to the maps of its calls, in
    order: :class:`~diffattn.functional.AttentionWeights` (first = A1, second = A2, combined = A1 − A2, each
    (B, heads, Nq, Nk), detached). The modules' processors are restored on exit, also when the body raises.
    ValueError when the model has no such module."""
    modules = stable_audio_attention_modules(model)
    if not modules:
        raise ValueError(f"model ({type(model).__name__}) has no differential Stable Audio 3 attention module "
                         f"(diffusers' StableAudio3DiTModel with use_differential_attention=True)")
    names = {id(m): name for name, m in modules}
    out: dict[str, list[AttentionWeights]] = {name: [] for name, _ in modules}
    processor = StableAudio3DiffattnProcessor(backend, on_maps=lambda m, w: out[names[id(m)]].append(w))
    before = [(m, m.processor) for _, m in modules]
    try:
        for m, _ in before:
            m.set_processor(processor)
        yield out
    finally:
        for m, old in before:
            m.set_processor(old)
