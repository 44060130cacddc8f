"""The building blocks the model families share: the attention spec, the pre-norm block, patch embedding, stochastic
depth.

**One value says which attention a block uses**: :class:`~diffattn.layers.AttentionSpec`, the registered config
of a kind (:mod:`diffattn.layers.spec`). A model family takes ``attention=AttentionSpec(...)`` (or its dict, as a
config file gives it) and hands it to every block, which builds its layer with :meth:`AttentionSpec.build`
(``depth``: the block's index, for λ_init by depth); the settings are validated once, by the kind's ``Config``, when
the spec is made. A partial setting (``create_model(name, attention={"lambda_init": 0.5})``,
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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn

from ..deprecations import DEPRECATIONS, warn_deprecated
from .attention import Attention
from .mlp import build_mlp
from .spec import AttentionSpec

__all__ = ["AttentionSpec", "STANDARD", "LooseAttention", "LOOSE_KEYWORDS", "LOOSE_REMOVED_IN", "warn_loose",
           "Block", "PatchEmbed", "DropPath"]


#: the default spec: standard attention with every default
STANDARD: AttentionSpec = Attention.Config()

#: the loose attention keyword arguments that model families and blocks took before :class:`AttentionSpec` (diffattn
#: 0.1.0), each mapped to the spec field it sets; they are removed in diffattn :data:`LOOSE_REMOVED_IN`
LOOSE_KEYWORDS: dict[str, str] = {
    "lambda_init": "lambda_init", "lambda_form": "lambda_form", "sub_norm": "sub_norm", "qkv_bias": "qkv_bias",
    "out_bias": "out_bias", "q_residual": "q_residual", "causal": "causal", "attn_drop": "attn_drop",
    "attn_drop_rate": "attn_drop", "backend": "backend", "num_kv_heads": "num_kv_heads",
    "diff_norm_eps": "sub_norm_eps", "diff_norm_affine": "sub_norm_affine", "rope_theta": "rope_theta",
    "attn_norm_eps": "sub_norm_eps", "num_noise_heads": "num_noise_heads", "head_dim": "head_dim"}
LOOSE_REMOVED_IN = DEPRECATIONS["loose attention keywords"].removed_in


def warn_loose(owner: str, given: list[str], instead: str) -> None:
    """The one FutureWarning of the loose attention spelling: ``owner`` (a class or a registered model) was given
    ``given`` (the loose keywords, as the user wrote them); ``instead`` is the current spelling to pass."""
    warn_deprecated("loose attention keywords", detail=instead,
                    used=f"{owner}: {', '.join(given)} (the loose spelling of the attention settings)")


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
