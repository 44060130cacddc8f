"""One value that says which attention a model uses: :class:`AttentionSpec`.

A model family takes ``attention=AttentionSpec(...)`` and hands it to every block, which builds its layer with
:meth:`AttentionSpec.build`; the settings are validated once, here, when the spec is made. The older flat keyword
arguments of the families (``attention="diff", lambda_init=…, lambda_form=…, sub_norm=…``) and the ``config.json``
files that hold them are converted to a spec by :func:`attention_spec`, so both spell the same model.

    spec = AttentionSpec("diff", lambda_init="ye", backend="sdpa")
    layer = spec.build(dim=512, num_heads=8, depth=3)      # a DiffAttention with λ_init = 0.8 − 0.6·exp(−0.9)
    model = diffattn.models.VisionTransformer(attention=spec, ...)
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch.nn as nn

from ..functional import BACKENDS
from ..lambdas import DEFAULT_LAMBDA_INIT, available_lambdas, check_lambda_init
from .attention import ATTENTION_TYPES
from .rope import ROPE_STYLES

__all__ = ["AttentionSpec", "attention_spec"]


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"attention {name} must be a bool, got {value!r}")


def _positive_int(name: str, value, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"attention {name} must be {'None or ' if optional else ''}an integer >= 1, got {value!r}")


def _positive_float(name: str, value, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0 < value < math.inf):
        raise ValueError(f"attention {name} must be {'None or ' if optional else ''}a finite float > 0, "
                         f"got {value!r}")


@dataclass(frozen=True)
class AttentionSpec:
    """Which attention layer a model builds, with every setting of it.

    Args:
        kind: ``"standard"`` (:class:`~diffattn.layers.Attention`), ``"diff"`` (:class:`~diffattn.layers.DiffAttention`,
            Ye et al. 2024), ``"diff_v2"`` (:class:`~diffattn.layers.DiffAttentionV2`, Ye et al. 2026) or
            ``"gated"`` (:class:`~diffattn.layers.GatedDiffAttention`, M-DGSA 2025).
        lambda_init: λ_init, a finite float (default :data:`~diffattn.lambdas.DEFAULT_LAMBDA_INIT`) or ``"ye"``:
            0.8 − 0.6·exp(−0.3·l) with l the 0-based block index (Ye et al. 2024, §2.1).
        lambda_form: a registered λ form (:func:`~diffattn.lambdas.available_lambdas`); None: the layer's own
            (``reparam`` for diff, ``gate`` for gated, ``token_sigmoid`` for diff_v2).
        lambda_options: keyword arguments of the λ form (e.g. ``{"bias": True}``).
        num_kv_heads: key/value heads (grouped-query attention); None: as many as query heads.
        qkv_bias: bias of the q/k/v projections.
        out_bias: bias of the output projection.
        sub_norm: the per-head RMSNorm × (1 − λ_init) of a differential layer; None: the λ form's default.
        sub_norm_eps: the sub-norm's epsilon.
        sub_norm_affine: whether the sub-norm has a learnt scale.
        causal: a causal mask by default (text towers and language models set it).
        attn_drop: dropout on the attention maps.
        proj_drop: dropout after the output projection.
        backend: ``"auto"``, ``"math"``, ``"sdpa"`` or ``"triton"`` (differential kinds only).
        rope: None, or the rotary embedding style, ``"half"`` or ``"interleaved"``.
        rope_theta: the rotary embedding's base.
        softcap: tanh(S/c)·c on the logits (Gemma 2); None: off.
        sliding_window: each query sees only the last ``sliding_window`` keys; None: all.
        q_residual: the [Q⁺; Q⁻] residual of M-DGSA (2025, §4.3); gated only.
        gate_bias: the bias b_g of the gate σ(X W_g + b_g); gated only.
        head_dim: the head width d when it is not dim / num_heads; diff_v2 only.

    Raises ValueError naming the setting, the value and what it needs.
    """

    kind: str = "standard"
    lambda_init: float | str = DEFAULT_LAMBDA_INIT
    lambda_form: str | None = None
    lambda_options: dict | None = None
    num_kv_heads: int | None = None
    qkv_bias: bool = True
    out_bias: bool = True
    sub_norm: bool | None = None
    sub_norm_eps: float = 1e-5
    sub_norm_affine: bool = True
    causal: bool = False
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    backend: str = "auto"
    rope: str | None = None
    rope_theta: float = 10000.0
    softcap: float | None = None
    sliding_window: int | None = None
    q_residual: bool = False
    gate_bias: bool = True
    head_dim: int | None = field(default=None)

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_TYPES:
            raise ValueError(f"attention must be one of {tuple(ATTENTION_TYPES)}, got {self.kind!r}")
        object.__setattr__(self, "lambda_init", check_lambda_init(self.lambda_init))  # a finite float or "ye"
        if self.lambda_form is not None and self.lambda_form not in available_lambdas():
            raise ValueError(f"lambda_form must be None or one of {available_lambdas()}, got {self.lambda_form!r}")
        if self.lambda_options is not None:
            if not isinstance(self.lambda_options, Mapping):
                raise ValueError(f"lambda_options must be a dict or None, got {type(self.lambda_options).__name__}")
            object.__setattr__(self, "lambda_options", dict(self.lambda_options))
        _positive_int("num_kv_heads", self.num_kv_heads)
        for name in ("qkv_bias", "out_bias", "sub_norm_affine", "causal", "q_residual", "gate_bias"):
            _flag(name, getattr(self, name))
        if self.sub_norm is not None:
            _flag("sub_norm", self.sub_norm)
        _positive_float("sub_norm_eps", self.sub_norm_eps)
        for name in ("attn_drop", "proj_drop"):
            p = getattr(self, name)
            if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p < 1.0:
                raise ValueError(f"attention {name} must be a float in [0, 1), got {p!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "triton" and self.kind == "standard":
            raise ValueError("backend='triton' is for differential attention; attention 'standard' takes 'auto', "
                             "'math' or 'sdpa'")
        if self.rope is not None and self.rope not in ROPE_STYLES:
            raise ValueError(f"rope must be None or one of {ROPE_STYLES}, got {self.rope!r}")
        _positive_float("rope_theta", self.rope_theta)
        _positive_float("softcap", self.softcap, optional=True)
        _positive_int("sliding_window", self.sliding_window)
        if self.q_residual and self.kind != "gated":
            raise ValueError(f"q_residual is the [Q⁺; Q⁻] residual of M-DGSA and needs attention='gated', "
                             f"got attention={self.kind!r}")
        if not self.gate_bias and self.kind != "gated":
            raise ValueError(f"gate_bias is the bias of M-DGSA's gate and needs attention='gated', "
                             f"got attention={self.kind!r}")
        _positive_int("head_dim", self.head_dim)
        if self.head_dim is not None and self.kind != "diff_v2":
            raise ValueError(f"head_dim is the head width of attention 'diff_v2' (Ye et al. 2026); attention "
                             f"{self.kind!r} uses dim / num_heads, got head_dim={self.head_dim!r}")

    # ------------------------------------------------------------------------------------------- build

    def layer_kwargs(self, depth: int = 0) -> dict[str, Any]:
        """The keyword arguments of the layer class for block ``depth`` (0-based): only the settings this kind
        takes, and the λ form and sub-norm only where they are set (None leaves the layer's own default)."""
        kw: dict[str, Any] = dict(depth=depth, lambda_init=self.lambda_init, num_kv_heads=self.num_kv_heads,
                                  qkv_bias=self.qkv_bias, out_bias=self.out_bias, causal=self.causal,
                                  attn_drop=self.attn_drop, proj_drop=self.proj_drop, backend=self.backend,
                                  rope=self.rope, rope_theta=self.rope_theta, sub_norm_eps=self.sub_norm_eps,
                                  sub_norm_affine=self.sub_norm_affine, softcap=self.softcap,
                                  sliding_window=self.sliding_window)
        if self.lambda_form is not None:
            kw["lambda_form"] = self.lambda_form
        if self.lambda_options is not None:
            kw["lambda_options"] = dict(self.lambda_options)
        if self.sub_norm is not None:
            kw["sub_norm"] = self.sub_norm
        if self.kind == "gated":
            kw.update(q_residual=self.q_residual, gate_bias=self.gate_bias)
        if self.kind == "diff_v2":
            kw["head_dim"] = self.head_dim
        return kw

    def build(self, dim: int, num_heads: int, depth: int = 0) -> nn.Module:
        """The attention layer of block ``depth`` (0-based, for ``lambda_init="ye"``): x (B, N, dim) → (B, N, dim)
        with ``num_heads`` standard heads (even for the differential kinds)."""
        return ATTENTION_TYPES[self.kind](dim, num_heads, **self.layer_kwargs(depth))

    # -------------------------------------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (what a saved ``config.json`` holds for a model built from a spec)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionSpec:
        """Build from :meth:`to_dict` output; unknown keys are an error naming them."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an AttentionSpec needs a JSON object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown AttentionSpec settings {unknown}; the settings are {sorted(names)}")
        return cls(**dict(data))


def attention_spec(attention: str | AttentionSpec | Mapping, *, owner: str, signature: Callable | None = None,
                   fill: Mapping[str, Any] | None = None, force: Mapping[str, Any] | None = None,
                   **legacy: Any) -> AttentionSpec:
    """The :class:`AttentionSpec` a model family or block was given.

    ``attention`` is a spec, its :meth:`~AttentionSpec.to_dict` (as a saved ``config.json`` holds it) or the name of
    a kind. With a name, the family's flat keyword arguments fill the spec, as diffattn 0.1.0's models and config
    files spell it: ``legacy`` maps each parameter name to its value, or to ``(spec field, value)`` where the names
    differ; ``fill`` gives spec fields from arguments that also serve something else (a block's ``drop`` is the
    MLP's dropout too). With a spec, each ``legacy`` argument must be left at its default in ``signature`` (the
    family's ``__init__``) or agree with the spec, and a ValueError names any that does not (a registered model's
    config table may set them: ``create_model("dg_vit_tiny_patch16_224", attention=AttentionSpec("gated",
    q_residual=True))`` agrees with its ``q_residual=True``). ``force`` sets what the family fixes whatever
    it is given (a text tower's ``causal=True``).
    """
    pairs = {k: v if isinstance(v, tuple) else (k, v) for k, v in legacy.items()}
    if isinstance(attention, str):
        spec = AttentionSpec(kind=attention, **{f: v for f, v in pairs.values()}, **dict(fill or {}))
    else:
        if isinstance(attention, Mapping):
            attention = AttentionSpec.from_dict(attention)
        if not isinstance(attention, AttentionSpec):
            raise ValueError(f"{owner}: attention must be an AttentionSpec, its dict or one of "
                             f"{tuple(ATTENTION_TYPES)}, got {type(attention).__name__} {attention!r}")
        if signature is not None:
            params = inspect.signature(signature).parameters
            clash = sorted(k for k, (f, v) in pairs.items()
                           if k in params and v != params[k].default and v != getattr(attention, f))
            if clash:
                raise ValueError(f"{owner}: attention is an AttentionSpec, which holds every attention setting; "
                                 f"got {clash} as well: set them in the spec instead")
        spec = attention
    return replace(spec, **force) if force else spec
