"""The building blocks the model families share: the attention spec, the pre-norm block, patch embedding, stochastic
depth.

**One value says which attention a block uses**: :class:`AttentionSpec`. A model family takes
``attention=AttentionSpec(...)`` (or its dict, as a config file gives it) and hands it to every block, which builds
its layer with :meth:`AttentionSpec.build` (``depth``: the block's index, for λ_init by depth); the settings are
validated once, here, when the spec is made. A partial setting (``create_model(name, attention={"lambda_init": 0.5})``,
``--set model.overrides.attention.lambda_init=0.5``) updates a model's spec with :meth:`AttentionSpec.updated`, which
keeps every other setting, the kind included. The spelling of before, a kind's name with loose keyword arguments
(``attention="diff", lambda_init=…, lambda_form=…, sub_norm=…``), is converted by :meth:`LooseAttention.convert`
alone, with a FutureWarning, until diffattn 0.3.0; ``config.json`` files that hold it load as they did
(:meth:`LooseAttention.upgrade`).

    spec = AttentionSpec("diff", lambda_init="ye", backend="sdpa")
    layer = spec.build(dim=512, num_heads=8, depth=3)      # a DiffAttention with λ_init = 0.8 − 0.6·exp(−0.9)
    model = diffattn.models.VisionTransformer(attention=spec, ...)

**The block** (pre-norm):

    x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))

Parameter names follow timm (``patch_embed.proj``, ``blocks.i.norm1``/``mlp.fc1``/``norm2``), so vision checkpoints
map onto them key by key.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn as nn

from ..formats import _caller_level, check_fields
from ..functional import BACKENDS
from ..lambdas import DEFAULT_LAMBDA_INIT, available_lambdas, check_lambda_init
from .attention import ATTENTION_TYPES
from .mlp import build_mlp
from .rope import ROPE_STYLES

__all__ = ["AttentionSpec", "STANDARD", "KIND_SETTINGS", "LooseAttention", "LOOSE_KEYWORDS", "LOOSE_REMOVED_IN",
           "warn_loose", "Block", "PatchEmbed", "DropPath"]


#: the kinds whose head width may differ from dim / num_heads (``head_dim``)
_HEAD_DIM_KINDS = ("diff_v2", "grouped")
#: the kinds that subtract a second attention map (λ, its form and the sub-norm are theirs)
_DIFF_KINDS = ("diff", "gated", "diff_v2", "grouped")
#: the settings only some kinds take, each with those kinds; every other setting applies to every kind. A change of
#: kind (:meth:`AttentionSpec.updated`) starts these afresh, at their defaults.
KIND_SETTINGS: dict[str, tuple[str, ...]] = {
    "lambda_form": _DIFF_KINDS, "lambda_options": _DIFF_KINDS, "sub_norm": _DIFF_KINDS, "q_residual": ("gated",),
    "gate_bias": ("gated",), "head_dim": _HEAD_DIM_KINDS, "num_noise_heads": ("grouped",)}


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
            ``"gated"`` (:class:`~diffattn.layers.GatedDiffAttention`, M-DGSA 2025) or ``"grouped"``
            (:class:`~diffattn.layers.GroupedDiffAttention`, grouped differential attention, Motif Technologies
            2025, arXiv 2510.06949).
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
        head_dim: the head width d when it is not dim / num_heads; diff_v2 and grouped only.
        num_noise_heads: H_n, the noise heads of grouped differential attention, each shared by a group of
            r = (num_heads − H_n) / H_n signal heads (any ratio r ≥ 1); None: num_heads / 2 (r = 1, differential
            attention); grouped only.

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
    num_noise_heads: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_TYPES:
            raise ValueError(f"attention kind must be one of {tuple(ATTENTION_TYPES)}, got {self.kind!r}")
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
            raise ValueError("backend='triton' is for differential attention; kind 'standard' takes 'auto', "
                             "'math' or 'sdpa'")
        if self.rope is not None and self.rope not in ROPE_STYLES:
            raise ValueError(f"rope must be None or one of {ROPE_STYLES}, got {self.rope!r}")
        _positive_float("rope_theta", self.rope_theta)
        _positive_float("softcap", self.softcap, optional=True)
        _positive_int("sliding_window", self.sliding_window)
        if self.q_residual and self.kind != "gated":
            raise ValueError(f"q_residual is the [Q⁺; Q⁻] residual of M-DGSA and needs kind 'gated', "
                             f"got kind {self.kind!r}")
        if not self.gate_bias and self.kind != "gated":
            raise ValueError(f"gate_bias is the bias of M-DGSA's gate and needs kind 'gated', "
                             f"got kind {self.kind!r}")
        _positive_int("head_dim", self.head_dim)
        if self.head_dim is not None and self.kind not in _HEAD_DIM_KINDS:
            raise ValueError(f"head_dim is the head width of kinds 'diff_v2' (Ye et al. 2026) and 'grouped' "
                             f"(arXiv 2510.06949); kind {self.kind!r} uses dim / num_heads, got "
                             f"head_dim={self.head_dim!r}")
        _positive_int("num_noise_heads", self.num_noise_heads)
        if self.num_noise_heads is not None and self.kind != "grouped":
            raise ValueError(f"num_noise_heads is the number of noise heads of kind 'grouped' (grouped "
                             f"differential attention, arXiv 2510.06949); kind {self.kind!r} has none, got "
                             f"num_noise_heads={self.num_noise_heads!r}")
        if self.num_noise_heads is not None and self.num_kv_heads is not None and (
                self.num_kv_heads % 2 or self.num_noise_heads % (self.num_kv_heads // 2)):
            raise ValueError(f"attention 'grouped' reads H_kv/2 signal keys, H_kv/2 noise keys and H_kv/2 values: "
                             f"num_kv_heads={self.num_kv_heads} must be even and num_noise_heads="
                             f"{self.num_noise_heads} a multiple of num_kv_heads/2")

    def check_heads(self, dim: int, num_heads: int) -> None:
        """ValueError unless this spec builds a layer of width ``dim`` with ``num_heads`` query heads; for
        ``"grouped"``: the head width (``head_dim`` or dim / num_heads) and the split of the query heads into
        num_heads − H_n signal heads in groups of r = (num_heads − H_n) / H_n per noise head. The other kinds' layers
        check their own sizes."""
        if self.kind != "grouped" or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                             for v in (dim, num_heads)):
            return  # the layer's own check names a size that is not a positive integer
        if self.head_dim is None and dim % num_heads:
            raise ValueError(f"attention 'grouped': dim={dim} must be divisible by num_heads={num_heads}, or give "
                             f"head_dim")
        noise = num_heads // 2 if self.num_noise_heads is None else self.num_noise_heads
        if self.num_noise_heads is None and num_heads % 2:
            raise ValueError(f"attention 'grouped' with num_heads={num_heads} (odd) needs num_noise_heads (the "
                             f"default, num_heads / 2, is differential attention)")
        signal = num_heads - noise
        if signal < noise or signal % noise:
            raise ValueError(f"attention 'grouped': the signal heads (num_heads − num_noise_heads = {num_heads} − "
                             f"{noise} = {signal}) must be a positive multiple of num_noise_heads={noise}, each noise "
                             f"head serving a group of signal heads")
        kv = 2 * noise if self.num_kv_heads is None else self.num_kv_heads
        if kv % 2 or signal % (kv // 2) or noise % (kv // 2):
            raise ValueError(f"attention 'grouped': num_kv_heads={kv} must be even, with the signal heads ({signal}) "
                             f"and the noise heads ({noise}) multiples of num_kv_heads/2")

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
        if self.kind in _HEAD_DIM_KINDS:
            kw["head_dim"] = self.head_dim
        if self.kind == "grouped":
            kw["num_noise_heads"] = self.num_noise_heads
        return kw

    def build(self, dim: int, num_heads: int, depth: int = 0) -> nn.Module:
        """The attention layer of block ``depth`` (0-based, for ``lambda_init="ye"``): x (B, N, dim) → (B, N, dim)
        with ``num_heads`` standard heads (even for the differential kinds; for ``"grouped"`` the signal and
        noise query heads together). The head counts are checked here first (:meth:`check_heads`)."""
        self.check_heads(dim, num_heads)
        return ATTENTION_TYPES[self.kind](dim, num_heads, **self.layer_kwargs(depth))

    # -------------------------------------------------------------------------------------------- JSON

    def to_dict(self, changed: bool = False) -> dict[str, Any]:
        """The settings as JSON values (what a saved ``config.json`` holds for a model built from a spec);
        ``changed``: the kind and only the settings that differ from their defaults (what a config table writes)."""
        data = asdict(self)
        if changed:
            data = {"kind": self.kind, **{f.name: data[f.name] for f in fields(self)
                                          if f.name != "kind" and data[f.name] != f.default}}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionSpec:
        """Build from :meth:`to_dict` output; unknown keys are an error naming them."""
        check_fields(cls, data, "settings")
        return cls(**dict(data))

    @classmethod
    def settings_of(cls, kind: str) -> tuple[str, ...]:
        """The settings (field names, ``kind`` aside) that attention ``kind`` takes: every one but the
        :data:`KIND_SETTINGS` of other kinds."""
        return tuple(f.name for f in fields(cls) if f.name != "kind" and kind in KIND_SETTINGS.get(f.name, (kind,)))

    # ------------------------------------------------------------------------------------------ update

    def updated(self, changes: Mapping[str, Any] | AttentionSpec) -> AttentionSpec:
        """This spec with ``changes`` set and every other setting kept: how a partial attention setting updates a
        model's spec (``create_model(name, attention={"lambda_init": 0.5})``, ``--set
        model.overrides.attention.lambda_init=0.5``, a recipe's ``attention:`` block, a CLIP tower's
        ``text_attention={...}``).

        - ``changes`` a dict of settings (:meth:`to_dict`'s keys, any subset): those settings, the rest kept;
        - with a ``"kind"`` other than this spec's: the kind changes, and the settings only some kinds take
          (:data:`KIND_SETTINGS`: ``lambda_form``, ``lambda_options``, ``sub_norm``, ``q_residual``,
          ``gate_bias``, ``head_dim``, ``num_noise_heads``) start afresh at their defaults unless ``changes`` sets
          them too, so a gated spec with ``q_residual`` updated with ``{"kind": "diff"}`` is a valid diff spec that
          keeps λ_init, biases, dropout, backend and the rest;
        - ``changes`` an :class:`AttentionSpec`: a full replacement, returned as it is.

        Unknown settings are a ValueError naming them; the result is validated as any spec."""
        if isinstance(changes, AttentionSpec):
            return changes
        if not isinstance(changes, Mapping):
            raise ValueError(f"attention must be an AttentionSpec or a dict of its settings, got "
                             f"{type(changes).__name__} {changes!r}")
        check_fields(type(self), changes, "settings")
        data = self.to_dict()
        if changes.get("kind", self.kind) != self.kind:
            data.update({f.name: f.default for f in fields(self) if f.name in KIND_SETTINGS})
        data.update(changes)
        return type(self).from_dict(data)


#: the default spec: standard attention with every default
STANDARD = AttentionSpec()

#: the loose attention keyword arguments that model families and blocks took before :class:`AttentionSpec` (diffattn
#: 0.1.0), each mapped to the spec field it sets; they are removed in diffattn :data:`LOOSE_REMOVED_IN`
LOOSE_KEYWORDS: dict[str, str] = {
    "lambda_init": "lambda_init", "lambda_form": "lambda_form", "sub_norm": "sub_norm", "qkv_bias": "qkv_bias",
    "out_bias": "out_bias", "q_residual": "q_residual", "causal": "causal", "attn_drop": "attn_drop",
    "attn_drop_rate": "attn_drop", "backend": "backend", "num_kv_heads": "num_kv_heads",
    "diff_norm_eps": "sub_norm_eps", "diff_norm_affine": "sub_norm_affine", "rope_theta": "rope_theta",
    "attn_norm_eps": "sub_norm_eps", "num_noise_heads": "num_noise_heads", "head_dim": "head_dim"}
LOOSE_REMOVED_IN = "0.3.0"


def warn_loose(owner: str, given: list[str], instead: str) -> None:
    """The one FutureWarning of the loose attention spelling: ``owner`` (a class or a registered model) was given
    ``given`` (the loose keywords, as the user wrote them); ``instead`` is the current spelling to pass."""
    warnings.warn(FutureWarning(
        f"{owner}: {', '.join(given)} is the loose spelling of the attention settings, deprecated and removed in "
        f"diffattn {LOOSE_REMOVED_IN}; pass {instead} instead"), stacklevel=_caller_level())


@dataclass(frozen=True)
class LooseAttention:
    """How a model family or block spelt its attention before :class:`AttentionSpec`, to convert that spelling.

    ``attention`` is the one spelling: an :class:`AttentionSpec` or its dict (:meth:`AttentionSpec.to_dict`, what a
    config file gives). The older one, the name of a kind plus loose keyword arguments (``attention="diff",
    lambda_init="ye", sub_norm=False``) still builds the same model until diffattn 0.3.0, through
    :meth:`convert` alone, which warns.

    Args:
        owner: the class name, for messages.
        keywords: the loose keywords this class took (keys of :data:`LOOSE_KEYWORDS`).
        kind: the kind its ``attention`` defaulted to.
        defaults: spec fields whose default in this class was not the spec's (a Llama block: no biases).
        fill: spec field → the constructor argument that also set it with a kind's name (a block's ``drop`` was
            its attention's ``proj_drop`` too).
        force: spec fields the class fixes whatever it is given (a text tower is causal).
    """

    owner: str
    keywords: tuple[str, ...]
    kind: str = "standard"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    fill: Mapping[str, str] = field(default_factory=dict)
    force: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, attention: AttentionSpec | Mapping | str | None, loose: Mapping[str, Any],
                args: Mapping[str, Any]) -> AttentionSpec:
        """The spec a constructor was given: ``attention`` as it is (a spec is not validated again; its dict is
        made into one), or, for a kind's name or loose keywords ``loose``, :meth:`convert`'s. ``args`` holds the
        constructor's arguments that :attr:`fill` names. A spec with loose keywords as well is an error, unless it is
        the class's own default (the keywords alone, as they were passed before: ``CausalLM(lambda_init=0.5)``)."""
        self._check(loose)
        if loose and isinstance(attention, AttentionSpec) and attention == self.forced(
                self.convert(None, {}, args, warn=False)):
            attention = None  # the constructor's default spec: the loose keywords are the whole spelling
        if loose or isinstance(attention, str) or attention is None:
            if isinstance(attention, (AttentionSpec, Mapping)):
                raise ValueError(f"{self.owner}: attention is an AttentionSpec, which holds every attention setting; "
                                 f"got {sorted(loose)} as well: set them in the spec instead")
            spec = self.convert(attention, loose, args)
        elif isinstance(attention, AttentionSpec):
            spec = attention
        elif isinstance(attention, Mapping):
            spec = AttentionSpec.from_dict(attention)
        else:
            raise ValueError(f"{self.owner}: attention must be an AttentionSpec or its dict, got "
                             f"{type(attention).__name__} {attention!r}")
        return self.forced(spec)

    def _check(self, loose: Mapping[str, Any]) -> None:
        unknown = sorted(set(loose) - set(self.keywords))
        if unknown:
            raise TypeError(f"{self.owner}() got unexpected keyword argument(s) {unknown}")

    def forced(self, spec: AttentionSpec) -> AttentionSpec:
        """``spec`` with what the class fixes (a new spec only where it differs)."""
        if any(getattr(spec, k) != v for k, v in self.force.items()):
            spec = replace(spec, **self.force)
        return spec

    def convert(self, attention: str | Mapping | AttentionSpec | None, loose: Mapping[str, Any],
                args: Mapping[str, Any], *, warn: bool = True) -> AttentionSpec:
        """The one conversion of the loose spelling: the kind's name ``attention`` (None: :attr:`kind`) with the
        loose keywords ``loose`` and this class's 0.1.0 defaults, or a spec (or dict) ``attention`` with ``loose``
        set in it (a registered model's overrides). Warns (a :class:`FutureWarning` naming the replacement) unless
        ``warn`` is False (a saved ``config.json`` of before, which loads as it always did). Unknown keywords are a
        TypeError, as Python's for an unexpected keyword argument."""
        self._check(loose)
        settings = {LOOSE_KEYWORDS[k]: v for k, v in loose.items()}
        if isinstance(attention, (AttentionSpec, Mapping)):
            base = attention.to_dict() if isinstance(attention, AttentionSpec) else dict(attention)
        else:
            base = {**self.defaults, **{f: args[a] for f, a in self.fill.items() if a in args},
                    "kind": self.kind if attention is None else attention}
        spec = AttentionSpec.from_dict({**base, **settings})
        if warn:
            given = ([f"attention={attention!r}"] if isinstance(attention, str) else []) + sorted(loose)
            warn_loose(self.owner, given, f"attention={spec.to_dict(changed=True)!r} (an AttentionSpec or its dict)")
        return spec

    def upgrade(self, config: dict[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
        """A saved constructor configuration with its loose keys (a ``config.json`` written before
        :class:`AttentionSpec`) converted to one ``attention`` dict, silently; ``args`` are the constructor's
        defaults (for :attr:`fill`). A configuration without loose keys is returned as it is."""
        loose = {k: config[k] for k in self.keywords if k in config}
        attention = config.get("attention")
        if not loose and not isinstance(attention, str):
            return config
        rest = {k: v for k, v in config.items() if k not in loose}
        spec = self.convert(attention, loose, {**args, **rest}, warn=False)
        return {**rest, "attention": self.forced(spec).to_dict()}



class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop the residual branch per sample with probability p."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)  # (B, 1, ..., 1)
        return x * keep / (1.0 - self.p)


class PatchEmbed(nn.Module):
    """Non-overlapping patches, Conv2d(kernel = stride = p): (B, C, H, W) → (B, N, D), N = (H/p)·(W/p)."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, *, bias: bool = True):
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = img_size // patch_size
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.proj.in_channels or tuple(x.shape[-2:]) != (self.img_size,) * 2:
            raise ValueError(f"images must have shape (B, {self.proj.in_channels}, {self.img_size}, "
                             f"{self.img_size}), got {tuple(x.shape)}")
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


class Block(nn.Module):
    """Pre-norm transformer block with a switchable attention layer (:class:`~diffattn.layers.AttentionSpec`).

        x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))

    ``attention`` is an :class:`~diffattn.layers.AttentionSpec` or its dict; the layer is ``attention.build(dim,
    num_heads, depth)``. ``depth`` is the 0-based index of the block (for ``lambda_init="ye"``); ``drop`` is the
    MLP's dropout. The loose keywords of before (:data:`LOOSE`) are deprecated
    (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="gated", lambda_init=…, q_residual=…``; ``drop`` was ``proj_drop`` too
    LOOSE = LooseAttention("Block", ("lambda_init", "lambda_form", "sub_norm", "qkv_bias", "q_residual", "causal",
                                     "attn_drop", "backend"), fill={"proj_drop": "drop"})

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0,
                 attention: AttentionSpec | Mapping = STANDARD, mlp: str = "gelu",
                 mlp_ratio: float = 4.0, mlp_dropouts: int = 2, norm_eps: float = 1e-6, drop: float = 0.0,
                 drop_path: float = 0.0, **loose):
        super().__init__()
        spec = self.LOOSE.resolve(attention, loose, {"drop": drop})
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = spec.build(dim, num_heads, depth)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = build_mlp(dim, mlp, mlp_ratio, drop=drop, mlp_dropouts=mlp_dropouts)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, need_weights: bool = False):
        """x: (B, N, D) → (B, N, D); with ``need_weights`` also the layer's AttentionWeights."""
        res = self.attn(self.norm1(x), attn_mask, need_weights)
        a, weights = res if need_weights else (res, None)
        x = x + self.drop_path1(a)  # (B, N, D)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return (x, weights) if need_weights else x
