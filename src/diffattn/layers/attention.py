"""Attention layers with one constructor and forward interface: standard, differential, gated differential and
Diff Transformer V2, each a registered kind (:mod:`diffattn.layers.spec`) with its own ``Config``.

Every layer is built ``cls(dim, num_heads, config, depth=…)`` (keyword settings are the Config's fields); a model
switches attention by its spec's kind and gets a fair comparison: same projections, same rotary embedding and KV
cache, same masks.

    x ─ q_proj/k_proj/v_proj ─ (RoPE) ─ (KV cache) ─ attend ─ concat heads ─ out_proj ─ dropout

:class:`DiffAttention` follows DiffCLIP's module (Hammoud et al. 2025) for names and layout: ``num_heads`` is the
standard head count h (even), H = h/2 differential heads, head width d = dim/h, Q and K viewed as 2H heads of width d,
V as H heads of width 2d, differential head i pairing Q/K heads 2i and 2i+1 ("adjacent" layout). Every
differential layer holds its λ form (:mod:`diffattn.lambdas`) as the submodule ``lambda_fn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.nn as nn

from ..lambdas import DEFAULT_LAMBDA_INIT, available_lambdas, build_lambda, check_lambda_init, resolve_lambda_init
from ..ops import (
    AttentionWeights,
    attention,
    compute_dtype,
    diff_attention_pairs,
    restrict_mask,
    sliding_window_mask,
    takes_triton,
)
from .kv_cache import KVCache
from .norm import RMSNorm, head_rms_norm, scaled_rms_norm
from .rope import RotaryEmbedding, apply_rotary
from .spec import (
    ATTENTION_TYPES,
    AttentionSpec,
    attention_class,
    attention_kind,
    check_flag,
    check_positive_float,
    check_positive_int,
    register_attention,
)

__all__ = ["Attention", "DiffAttention", "GatedDiffAttention", "DiffAttentionV2", "DiffConfig", "ATTENTION_TYPES",
           "attention_class", "attention_kind"]


def _check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _positions(position_ids: torch.Tensor | None, kv_cache: KVCache | None, n: int,
               device: torch.device) -> torch.Tensor:
    """``position_ids``, or the ``n`` positions that continue ``kv_cache`` (from 0 without one)."""
    if position_ids is not None:
        return position_ids
    start = kv_cache.length if kv_cache is not None else 0
    return torch.arange(start, start + n, device=device)


class _AttentionBase(nn.Module):
    """Projections, rotary embedding, KV cache and output path shared by the layers.

    q_proj: dim → q_heads·d, k_proj: dim → num_kv_heads·d, v_proj: dim → num_kv_heads·d (viewed as heads of width
    ``v_head_dim``), out_proj: num_heads·d → dim, with d = dim / num_heads unless ``head_dim`` is given.
    """

    #: the attention kind (a key of :data:`~diffattn.layers.ATTENTION_TYPES`), set by each registered class
    kind: ClassVar[str]
    #: the words ``diffattn models`` uses for the kind
    title: ClassVar[str]
    #: whether the layer subtracts a second attention map
    differential: ClassVar[bool] = False
    #: how q/k/v hold the maps: "single", "paired" or "branched" (:mod:`diffattn.layers.spec`)
    head_layout: ClassVar[str] = "single"
    #: whether the output is scaled by (1 − λ_init) after the sub-norm
    scales_by_lambda_init: ClassVar[bool] = False
    #: the name of a CLIP with this attention in both towers, where a paper named one (Hammoud & Ghanem 2025)
    clip_variant: ClassVar[str | None] = None
    #: the projection of the input whose weight's dtype and device the input must match (:meth:`_check_x`)
    input_proj: ClassVar[str] = "q_proj"
    Config: ClassVar[type[AttentionSpec]]

    @classmethod
    def resolve_config(cls, config: AttentionSpec | Mapping | None, settings: Mapping[str, Any]) -> AttentionSpec:
        """The layer's config from the constructor's ``config`` (this kind's ``Config``, or its dict) and keyword
        ``settings`` (the Config's fields: ``DiffAttention(64, 4, lambda_init=0.5)`` is
        ``DiffAttention(64, 4, DiffAttention.Config(lambda_init=0.5))``; with a config as well they update it)."""
        own = {f.name for f in fields(cls.Config)} - {"kind"}
        unknown = sorted(set(settings) - own)
        if unknown:
            raise TypeError(f"{cls.__name__}() got unexpected keyword argument(s) {unknown}; the settings of "
                            f"attention kind {cls.kind!r} are {sorted(own)}")
        if config is None:
            return cls.Config(**settings)
        if isinstance(config, Mapping):
            config = cls.Config.from_dict({"kind": cls.kind, **config})
        if type(config) is not cls.Config:
            raise ValueError(f"{cls.__name__} takes a config of attention kind {cls.kind!r} ({cls.__name__}.Config), "
                             f"got {type(config).__qualname__} of kind {getattr(config, 'kind', None)!r}")
        return config.updated(dict(settings)) if settings else config

    def _setup(self, dim: int, num_heads: int, config: AttentionSpec, *, paired: bool, q_heads_per_head: int = 1,
               v_head_mult: int = 1, head_dim: int | None = None) -> None:
        """Sizes (checked here: the config checked its own settings) and the projections."""
        _check_int("dim", dim)
        _check_int("num_heads", num_heads)
        if head_dim is not None:
            _check_int("head_dim", head_dim)
        elif dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if paired and num_heads % 2:
            raise ValueError(f"num_heads is the standard head count and must be even for differential attention "
                             f"(H = num_heads/2 differential heads), got {num_heads}")
        num_kv_heads = num_heads if config.num_kv_heads is None else config.num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        if paired and num_kv_heads % 2:
            raise ValueError(f"num_kv_heads must be even for differential attention, got {num_kv_heads}")
        self.config = config
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.inner_dim = num_heads * self.head_dim  # width of the concatenated heads, out_proj's input
        self.causal, self.backend, self.attn_drop = config.causal, config.backend, config.attn_drop
        self.softcap, self.sliding_window = config.softcap, config.sliding_window
        self.scale = self.head_dim**-0.5
        self.q_heads = q_heads_per_head * num_heads  # heads of width head_dim in q_proj's output
        self.v_head_dim = v_head_mult * self.head_dim  # width of one value head
        self.v_heads = num_kv_heads // v_head_mult
        self.q_proj = nn.Linear(dim, self.q_heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.out_proj = nn.Linear(self.inner_dim, dim, bias=config.out_bias)
        self.proj_drop = nn.Dropout(config.proj_drop)
        self.rotary = (RotaryEmbedding(self.head_dim, base=config.rope_theta, style=config.rope)
                       if config.rope is not None else None)

    def _project(self, x, position_ids, kv_cache):
        B, N, _ = x.shape
        d = self.head_dim
        q_lin = self.q_proj(x)  # (B, N, q_heads·d)
        q = q_lin.view(B, N, self.q_heads, d).transpose(1, 2)  # (B, q_heads, N, d)
        k = self.k_proj(x).view(B, N, self.num_kv_heads, d).transpose(1, 2)  # (B, kv_heads, N, d)
        v = self.v_proj(x).view(B, N, self.v_heads, self.v_head_dim).transpose(1, 2)  # (B, v_heads, N, dv)
        if self.rotary is not None:
            cos, sin = self.rotary(_positions(position_ids, kv_cache, N, x.device), dtype=compute_dtype(q.dtype))
            q = apply_rotary(q, cos, sin, self.rotary.style)
            k = apply_rotary(k, cos, sin, self.rotary.style)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        return q, k, v, q_lin

    def _check_x(self, x):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a tensor of shape (B, N, dim={self.dim}), got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, dim={self.dim}), got {tuple(x.shape)}")
        w = getattr(self, self.input_proj).weight
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"x has dtype {x.dtype} but the layer's weights are {w.dtype}; cast x or the layer "
                             f"(layer.to({x.dtype})) so they match, or run under torch.autocast")
        if x.device != w.device:
            raise ValueError(f"x is on {x.device} but the layer's weights are on {w.device}")

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        *,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        is_causal: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
        """x: (B, N, dim) → (B, N, dim).

        attn_mask: bool (True = attend) or additive float, broadcastable to (B, heads, N, Nk), where heads is the
            layer's attention-head count (num_heads for :class:`Attention` and :class:`DiffAttentionV2`,
            num_heads/2 for :class:`DiffAttention`).
        need_weights: also return :class:`~diffattn.functional.AttentionWeights` (A1, A2, combined; for standard
            attention A1 = combined = A and A2 is None), the maps before attention dropout. They are computed on
            the side, by the ``math`` backend from the same q, k and λ: the output is the one the layer gives
            without ``need_weights``, bit for bit (the fused and SDPA kernels sum in another order than math).
        position_ids: (N,) or (B, N) positions for the rotary embedding; default continues ``kv_cache``.
        kv_cache: a :class:`KVCache` to append to and attend over (incremental decoding).
        is_causal: overrides the layer's ``causal`` flag; the causal mask is aligned to the end of the cache.
        """
        self._check_x(x)
        return self._forward(x, attn_mask, need_weights, position_ids, kv_cache, is_causal)

    def _forward(self, x, attn_mask, need_weights, position_ids, kv_cache, is_causal, **inputs):
        """:meth:`forward` after its checks; ``inputs``: a kind's own inputs, passed on to its :meth:`_project`
        (:class:`~diffattn.layers.StableAudioAttention`'s ``context``)."""
        B, N, _ = x.shape
        q, k, v, q_lin = self._project(x, position_ids, kv_cache, **inputs)
        causal = self.causal if is_causal is None else is_causal
        if self.sliding_window is not None:
            attn_mask = restrict_mask(attn_mask, sliding_window_mask(N, k.shape[2], self.sliding_window, x.device))
        drop = self.attn_drop if self.training else 0.0
        out, _ = self._attend(x, q, k, v, attn_mask, causal, drop, False)  # (B, heads, N, dv)
        # the maps on the side (no dropout, so no random numbers drawn): the output keeps its own path
        weights = self._attend(x, q, k, v, attn_mask, causal, 0.0, True)[1] if need_weights else None
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)
        out = self._output(out, q_lin)
        return (out, weights) if need_weights else out

    def _output(self, out, q_lin):
        return self.proj_drop(self.out_proj(out))

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):  # pragma: no cover - abstract
        raise NotImplementedError

    def _operator_args(self, attn_mask, causal, drop, need_weights) -> dict[str, Any]:
        """The keyword arguments of one call of the attention operator (:func:`~diffattn.functional.attention`,
        ``diff_attention``, ``diff_attention_pairs``) for this layer."""
        return dict(attn_mask=attn_mask, is_causal=causal, scale=self.scale, dropout_p=drop, softcap=self.softcap,
                    backend=self.backend, return_weights=need_weights)


@register_attention
class Attention(_AttentionBase):
    """Standard multi-head attention (Vaswani et al. 2017): the baseline, through PyTorch's SDPA kernels.

    O_i = softmax(Q_i K_iᵀ / √d) V_i per head, concat, ``out_proj``. Built ``Attention(dim, num_heads, config,
    depth=…)`` like every kind (``depth`` is unused here); its settings are those every kind has
    (:class:`~diffattn.layers.AttentionSpec`).
    """

    kind = "standard"
    title = "standard"

    @dataclass(frozen=True)
    class Config(AttentionSpec):
        """Standard attention's settings: those of every kind (:class:`~diffattn.layers.AttentionSpec`)."""

        kind: str = "standard"

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        self._setup(dim, num_heads, config, paired=False)
        self.depth = depth

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        res = attention(q, k, v, **self._operator_args(attn_mask, causal, drop, need_weights))
        if need_weights:
            out, a = res
            return out, AttentionWeights(a, None, a)
        return res, None


def _lambda_form_attribute(name: str) -> property:
    """The read-only layer attribute ``name`` that is ``layer.lambda_fn.<name>`` (an nn.Parameter or nn.Linear of
    the λ form): the layer's attribute names from before the λ forms."""
    return property(lambda self: getattr(self.lambda_fn, name), doc=f"``lambda_fn.{name}`` (the λ form's).")


# Names the λ parameters had directly on the attention module before λ forms became submodules (DiffCLIP's
# ``lambda_q1`` …, M-DGSA's ``gate_proj``): checkpoints keep them.
_FLAT_LAMBDA_NAMES = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "gate_proj.weight", "gate_proj.bias")

#: the values of :attr:`DiffConfig.output_scale`: the kind's default, × (1 − λ_init), × 1
OUTPUT_SCALES = (None, "tied", "fixed")


@dataclass(frozen=True)
class DiffConfig(AttentionSpec):
    """The settings of every differential kind, besides those of every kind (:class:`AttentionSpec`).

    Args:
        lambda_init: λ_init, a finite float (default :data:`~diffattn.lambdas.DEFAULT_LAMBDA_INIT`) or ``"ye"``:
            0.8 − 0.6·exp(−0.3·l) with l the 0-based block index (Ye et al. 2024, §2.1).
        lambda_form: a registered λ form (:func:`~diffattn.lambdas.available_lambdas`); None: the layer's own
            (``reparam`` for diff and grouped, ``gate`` for gated, ``token_sigmoid`` for diff_v2).
        lambda_options: keyword arguments of the λ form (e.g. ``{"bias": True}``).
        sub_norm: the per-head RMSNorm × (1 − λ_init) of a differential layer; None: the layer's default (the λ
            form's; off for diff_v2).
        sub_norm_eps: the sub-norm's epsilon.
        sub_norm_affine: whether the sub-norm has a learnt scale.
        output_scale: ``"tied"``: the heads' output is multiplied by (1 − λ_init) (Ye et al. 2024, §2.1, where it
            follows the sub-norm); ``"fixed"``: by 1; None: the kind's default (tied with the sub-norm for the
            kinds that scale, ``diff`` and ``grouped``; fixed otherwise). Setting it decouples the scale from the
            sub-norm, e.g. a sub-norm with a fixed scale, or (1 − λ_init) without a sub-norm.
    """

    kind: str = "diff"
    lambda_init: float | str = DEFAULT_LAMBDA_INIT
    lambda_form: str | None = None
    lambda_options: dict | None = None
    sub_norm: bool | None = None
    sub_norm_eps: float = 1e-5
    sub_norm_affine: bool = True
    output_scale: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lambda_init", check_lambda_init(self.lambda_init))  # a finite float or "ye"
        if self.lambda_form is not None and self.lambda_form not in available_lambdas():
            raise ValueError(f"lambda_form must be None or one of {available_lambdas()}, got {self.lambda_form!r}")
        if self.lambda_options is not None:
            if not isinstance(self.lambda_options, Mapping):
                raise ValueError(f"lambda_options must be a dict or None, got {type(self.lambda_options).__name__}")
            object.__setattr__(self, "lambda_options", dict(self.lambda_options))
        if self.sub_norm is not None:
            check_flag("attention sub_norm", self.sub_norm)
        check_positive_float("attention sub_norm_eps", self.sub_norm_eps)
        check_flag("attention sub_norm_affine", self.sub_norm_affine)
        if self.output_scale not in OUTPUT_SCALES:
            raise ValueError(f"attention output_scale must be one of {OUTPUT_SCALES}, got {self.output_scale!r}")


@dataclass(frozen=True)
class HeadDimConfig(DiffConfig):
    """The settings of a differential kind whose head width may differ from dim / num_heads: those of
    :class:`DiffConfig` and

    Args:
        head_dim: the head width d when it is not dim / num_heads.
    """

    head_dim: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("attention head_dim", self.head_dim)


class _DiffBase(_AttentionBase):
    """λ form as ``lambda_fn``, the optional per-head sub-norm, and the state-dict names of the λ parameters."""

    differential = True
    #: the λ form of a config whose ``lambda_form`` is None
    default_lambda_form: ClassVar[str] = "reparam"

    def _lambda_options(self, config: DiffConfig, form: str) -> dict:
        return dict(config.lambda_options or {})

    def _default_sub_norm(self) -> bool:
        """The sub-norm of a config whose ``sub_norm`` is None: the λ form's (off for ``token_sigmoid``)."""
        return bool(type(self.lambda_fn).sub_norm)

    def _setup_lambda(self, config: DiffConfig, *, dim: int, depth: int, heads: int, norm_width: int) -> None:
        form = config.lambda_form or self.default_lambda_form
        self.depth = depth
        self.lambda_init = resolve_lambda_init(config.lambda_init, depth)
        self.lambda_form = form
        self.lambda_fn = build_lambda(form, dim=dim, num_heads=heads, head_dim=self.head_dim,
                                      lambda_init=self.lambda_init, **self._lambda_options(config, form))
        sub_norm = self._default_sub_norm() if config.sub_norm is None else config.sub_norm
        if sub_norm:
            self.diff_norm = head_rms_norm(norm_width, eps=float(config.sub_norm_eps),
                                           affine=bool(config.sub_norm_affine))
        else:
            self.diff_norm = nn.Identity()
        tied = (sub_norm and self.scales_by_lambda_init) if config.output_scale is None else \
            config.output_scale == "tied"
        self.out_scale = (1.0 - self.lambda_init) if tied else 1.0
        self.register_state_dict_post_hook(_flatten_lambda_names)
        self.register_load_state_dict_pre_hook(_nest_lambda_names)
        self.register_load_state_dict_post_hook(_report_flat_names)

    # the old attribute names, read from the λ form
    lambda_q1 = _lambda_form_attribute("lambda_q1")
    lambda_k1 = _lambda_form_attribute("lambda_k1")
    lambda_q2 = _lambda_form_attribute("lambda_q2")
    lambda_k2 = _lambda_form_attribute("lambda_k2")
    gate_proj = _lambda_form_attribute("gate_proj")

    def lambda_weights(self, x: torch.Tensor) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        """(weight1, λ) for input x (B, N, dim), each a float or a tensor broadcastable to (B, H, N, 1)."""
        return self.lambda_fn(x)

    def _fused(self, x, q, k, v, attn_mask, causal, drop, need_weights, k_paired: bool) -> torch.Tensor | None:
        """The whole differential part of the layer in the fused kernels, where the operator would run them:
        λ from its parameters or logits, (w1 A1 − λ A2) V and the sub-norm × (1 − λ_init) in one autograd node,
        written in the layer's output layout (:func:`diffattn.ops.kernels.triton_diff.fused_layer_attention`).
        None where that path does not apply; the layer then takes the general one (same numbers)."""
        if need_weights or drop > 0.0 or self.softcap is not None or self.backend not in ("auto", "triton"):
            return None
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return None  # compiled graphs fuse the λ and norm ops themselves around the kernel's operator
        q1, q2 = q[:, 0::2], q[:, 1::2]
        k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
        if not takes_triton(q1, k1, q2, k2, v, attn_mask, causal, drop, self.backend, self.scale):
            return None
        form = self.lambda_fn.kernel_inputs(x)
        if form is None:
            return None
        mode, lam_inputs, lam_init = form
        norm = self.diff_norm
        if isinstance(norm, RMSNorm):
            width, weight = norm.normalized_shape[-1], norm.weight
            eps = norm.eps if norm.eps is not None else torch.finfo(v.dtype).eps
        elif isinstance(norm, nn.Identity) and self.out_scale == 1.0:
            width, weight, eps = None, None, 1e-5
        else:
            return None
        from ..ops.kernels.triton_diff import fused_layer_attention, fused_layer_reason

        if fused_layer_reason(q, k, v, k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs,
                              norm_weight=weight, norm_width=width, attn_mask=attn_mask, is_causal=causal,
                              operator_checked=True):  # takes_triton ran the kernel's own checks
            return None
        return fused_layer_attention(q, k, v, k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs,
                                     lambda_init=lam_init, norm_width=width, norm_weight=weight,
                                     norm_scale=self.out_scale, norm_eps=eps, attn_mask=attn_mask,
                                     is_causal=causal, scale=self.scale)


def _flat_names(module: _DiffBase) -> set[str]:
    own = {n for n, _ in module.lambda_fn.named_parameters()} | {n for n, _ in module.lambda_fn.named_buffers()}
    return own & set(_FLAT_LAMBDA_NAMES)


def _flatten_lambda_names(module, state_dict, prefix, local_metadata) -> None:
    """state_dict hook: ``lambda_fn.lambda_q1`` → ``lambda_q1`` (and ``gate_proj.*``), the names checkpoints use."""
    for name in _flat_names(module):
        key = f"{prefix}lambda_fn.{name}"
        if key in state_dict:
            state_dict[prefix + name] = state_dict.pop(key)


def _nest_lambda_names(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                       error_msgs) -> None:
    """load_state_dict pre-hook: the flat checkpoint names back into ``lambda_fn``; a strict load of a state dict
    with the λ bias of diffattn 0.1.0's ``token_sigmoid`` into a layer without it also says how to load it."""
    for name in _flat_names(module):
        if prefix + name in state_dict:
            state_dict[f"{prefix}lambda_fn.{name}"] = state_dict.pop(prefix + name)
    proj = getattr(module.lambda_fn, "lambda_proj", None)
    if strict and isinstance(proj, nn.Linear) and proj.bias is None and f"{prefix}lambda_fn.lambda_proj.bias" in \
            state_dict:
        error_msgs.append(f"{prefix}lambda_fn.lambda_proj.bias is the bias of diffattn 0.1.0's token_sigmoid λ, "
                          f"σ(X W + b); build the layer with lambda_options={{'bias': True}}, or load the state dict "
                          f"with diffattn.layers.load_layer(..., diffattn_format=0), which does so")


def _report_flat_names(module, incompatible_keys) -> None:
    """load_state_dict post-hook: missing λ parameters are named as a checkpoint names them (``…lambda_q1``)."""
    for i, key in enumerate(incompatible_keys.missing_keys):
        head, sep, name = key.rpartition("lambda_fn.")
        if sep and name in _FLAT_LAMBDA_NAMES:
            incompatible_keys.missing_keys[i] = head + name


class _PairedDiffBase(_DiffBase):
    """The paired differential kinds (diff, gated, grouped): each differential head's two maps read Q/K heads
    (2i, 2i+1), and the output is scaled by (1 − λ_init) after the sub-norm."""

    head_layout = "paired"
    scales_by_lambda_init = True


@register_attention
class DiffAttention(_PairedDiffBase):
    """Differential attention (Ye et al. 2024 §2.1; DiffCLIP, Hammoud et al. 2025 §3.1).

        [Q1_i; Q2_i] = Q heads (2i, 2i+1),  V_i of width 2d,  A_b = softmax(Q_b_i K_b_iᵀ / √d)
        O_i = (1 − λ_init) · RMSNorm((w1 ⊙ A1 − λ ⊙ A2) V_i),   out = out_proj(concat_i O_i)
        λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init   (``lambda_form="reparam"``; λ vectors ~ N(0, 0.1²), fp32)

    ``lambda_init`` is a float (DiffCLIP: 0.8) or ``"ye"``: 0.8 − 0.6·exp(−0.3·depth) with ``depth`` the
    **0-based** layer index (DiffCLIP*). ``lambda_form`` names any registered λ form (:mod:`diffattn.lambdas`),
    built with ``lambda_options`` into ``lambda_fn``; the reparam vectors and the gate's ``gate_proj`` keep their
    checkpoint names on this module (``lambda_q1`` …). ``sub_norm=False`` drops the RMSNorm and the (1 − λ_init)
    scale; the default, None, takes the λ form's (:attr:`~diffattn.lambdas.LambdaForm.sub_norm`): on for every form
    but ``token_sigmoid``, which follows the Differential Transformer V2 (Ye et al. 2026) without it. ``softcap``
    soft-caps the logits (Gemma-2); ``sliding_window`` limits each query to the last keys.
    Parameters: standard attention plus 4d λ values and the 2d norm weight.

    At small width and depth, use a constant ``lambda_init`` (0.8) or ``sub_norm=False``. With ``"ye"``, a 2-layer
    model gets λ_init 0.2 and 0.36 and, with the sub-norm, failed to learn associative recall on every seed.
    Constant 0.8 instead gains +21.9 points [19.6, 24.1] at width 64, and dropping the sub-norm gains +22.5
    [19.6, 25.4] at width 128 (``diffattn study recall_ablation``, docs/studies.md). Registered before its run and
    on 10 fresh seeds, V1 with λ_init 0.8 and its sub-norm then learnt recall faster than the Transformer, each at
    its own tuned lr: +16.8 points of area under the learning curve [10.6, 23.1], Holm p 0.001 (docs/studies.md,
    "Confirmatory reruns"), and +7.8 [6.6, 9.1] against a Transformer with as many heads of the same width as its
    two differential heads. The library's default λ_init is this constant 0.8; ``"ye"`` is the paper's opt-in
    schedule. ``output_scale`` decouples the (1 − λ_init) scale from the sub-norm; in a registered factorial,
    fixing it at 1 lost 18.4 [10.7, 26.2] of those points at width 64 and 6.6 [5.5, 7.7] at width 128, where
    λ_init 0.8 at scale 1 still learns: the gain is shared between λ and the scale. An exploratory probe says why
    the scale matters: the sub-norm gives each head's output an RMS near 1, about 9 times the residual stream of a
    small model (embeddings initialised at 0.02) at scale 1, and (1 − λ_init) = 0.2 brings it near a Transformer's
    ratio; so keep the tied scale with the sub-norm, or scale the output to the stream another way.
    """

    kind = "diff"
    title = "differential"
    clip_variant = "DiffCLIP"

    @dataclass(frozen=True)
    class Config(DiffConfig):
        """Differential attention's settings (:class:`DiffConfig`)."""

        kind: str = "diff"

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        self._setup(dim, num_heads, config, paired=True, v_head_mult=2)
        self.diff_heads = num_heads // 2
        self._setup_lambda(config, dim=dim, depth=depth, heads=self.diff_heads, norm_width=2 * self.head_dim)

    @property
    def num_noise_heads(self) -> int:
        """H, the noise heads (one per differential head)."""
        return self.diff_heads

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        out = self._fused(x, q, k, v, attn_mask, causal, drop, need_weights, k_paired=True)
        if out is not None:
            return out, None  # (B, H, N, 2d)
        weight1, lam = self.lambda_weights(x)
        # Q heads 2i and 2i+1 (and K heads) are the two branches of differential head i
        res = diff_attention_pairs(q, k, v, lam, weight1=weight1,
                                   **self._operator_args(attn_mask, causal, drop, need_weights))
        out, weights = res if need_weights else (res, None)
        return scaled_rms_norm(out, self.diff_norm, self.out_scale), weights  # (B, H, N, 2d)


@register_attention
class GatedDiffAttention(DiffAttention):
    """Multi-head differential gated self-attention, M-DGSA (Lygizou & Kalamaras 2025, §4, eq. 3, Algorithm 1).

        g = σ(X W_g + b_g) ∈ (0, 1)^{N×H}                      (``gate_proj``: dim → H, one layer)
        O_i = (1 − λ_init) · RMSNorm((g_i ⊙ A⁺_i − (1 − g_i) ⊙ A⁻_i) V_i)
        out = out_proj(concat_i O_i) [+ [Q⁺; Q⁻]]               (``q_residual``: DGViT uses it, DGT does not)

    g scales the row of its query token, so it commutes with the product by V and the O(N) backends serve it.
    λ_init fixed at 0.8 was best in the paper (App. B.5); ``"ye"`` gives Algorithm 1's depth schedule.
    ``gate_bias`` is the gate's ``bias`` option (``lambda_options`` may also set it); ``sub_norm`` as in
    :class:`DiffAttention`.
    """

    kind = "gated"
    title = "gated differential"
    clip_variant = "gated DiffCLIP"
    default_lambda_form = "gate"

    @dataclass(frozen=True)
    class Config(DiffConfig):
        """M-DGSA's settings: those of :class:`DiffConfig` and

        Args:
            q_residual: the [Q⁺; Q⁻] residual of M-DGSA (Lygizou & Kalamaras 2025, §4.3).
            gate_bias: the bias b_g of the gate σ(X W_g + b_g).
        """

        kind: str = "gated"
        q_residual: bool = False
        gate_bias: bool = True

        def __post_init__(self) -> None:
            super().__post_init__()
            check_flag("attention q_residual", self.q_residual)
            check_flag("attention gate_bias", self.gate_bias)

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        config = self.resolve_config(config, settings)
        super().__init__(dim, num_heads, config, depth=depth)
        self.q_residual = config.q_residual

    def _lambda_options(self, config: DiffConfig, form: str) -> dict:
        if form == "gate":  # the gate's bias is this kind's setting; lambda_options may also set it
            return {"bias": config.gate_bias, **(config.lambda_options or {})}
        return dict(config.lambda_options or {})

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """g = σ(X W_g + b_g) as (B, H, N, 1) in float32 (float64 for a float64 layer)."""
        return self.lambda_fn.gate(x)

    def _output(self, out, q_lin):
        out = self.out_proj(out)
        if self.q_residual:  # + [Q⁺; Q⁻] = X W_Q (before the rotary embedding), (B, N, dim)
            out = out + q_lin
        return self.proj_drop(out)


@register_attention
class DiffAttentionV2(_DiffBase):
    """Differential Transformer V2 (Ye et al., microsoft/unilm ``multihead_flashdiffv2.py``).

        Q = x W_Q: 2h heads of width d,  K = x W_K, V = x W_V: h_kv heads of width d, shared by both
        branches;  A_j = softmax(Q_j K_{g(j)}ᵀ / √d) for query head j, g(j) = j // (2h / h_kv)
        O_i = A_{2i} V_{g(2i)} − λ_i(x_t) ⊙ A_{2i+1} V_{g(2i)},   λ_i(x_t) = σ(x_t W_λ)_i   (no bias)
        out = out_proj(concat_i O_i)   (h·d → dim; no sub-norm, no (1 − λ_init) scale)

    Shapes: x (B, N, dim) → (B, N, dim); q_proj dim → 2h·d, k_proj and v_proj dim → h_kv·d, out_proj h·d → dim,
    ``lambda_fn.lambda_proj`` dim → h. The head width d is ``head_dim`` (the official module's argument of the same
    name, which may differ from dim / h), by default dim / h. The pair (2i, 2i+1) always sits inside one GQA group
    (h must be divisible by h_kv), so both branches read the same K and V head. Other λ forms may be named with
    ``lambda_form``; ``sub_norm=True`` adds a per-head RMSNorm of width d. :mod:`diffattn.convert.unilm` converts
    the official module's state dicts (``o_proj``, ``lambda_proj``, interleaved RoPE) both ways.
    """

    kind = "diff_v2"
    title = "Diff Transformer V2"
    head_layout = "branched"
    default_lambda_form = "token_sigmoid"

    @dataclass(frozen=True)
    class Config(HeadDimConfig):
        """Diff Transformer V2's settings (:class:`HeadDimConfig`: those of :class:`DiffConfig` and ``head_dim``)."""

        kind: str = "diff_v2"

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        self._setup(dim, num_heads, config, paired=False, q_heads_per_head=2, head_dim=config.head_dim)
        self.diff_heads = num_heads
        self._setup_lambda(config, dim=dim, depth=depth, heads=num_heads, norm_width=self.head_dim)

    def _default_sub_norm(self) -> bool:
        return False  # V2 has no sub-norm (Ye et al. 2026); sub_norm=True adds one of width d

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        out = self._fused(x, q, k, v, attn_mask, causal, drop, need_weights, k_paired=False)
        if out is not None:
            return out, None  # (B, h, N, d)
        weight1, lam = self.lambda_weights(x)  # λ: (B, h, N, 1)
        res = diff_attention_pairs(q, k, v, lam, k_paired=False, weight1=weight1,
                                   **self._operator_args(attn_mask, causal, drop, need_weights))
        out, weights = res if need_weights else (res, None)
        return scaled_rms_norm(out, self.diff_norm, self.out_scale), weights  # (B, h, N, d)
