"""Attention kinds as registered units: every attention layer class declares its ``kind`` and a frozen ``Config``
holding only its own settings; :data:`ATTENTION_TYPES` maps each kind to its class, as timm's ``ATTN_LAYERS`` and
peft's method registry do, and :class:`AttentionSpec` is the base of every kind's ``Config``.

    spec = AttentionSpec("diff", lambda_init="ye")          # DiffAttention.Config(kind='diff', lambda_init='ye', …)
    layer = spec.build(dim=512, num_heads=8, depth=3)       # DiffAttention(512, 8, spec, depth=3)
    spec.updated({"lambda_init": 0.5})                      # one setting changed, the kind and the rest kept

**Adding a kind** is one module: a layer class with ``kind = "name"``, a nested ``Config(AttentionSpec)`` dataclass
(frozen) with the kind's own settings and their checks in ``__post_init__``, a constructor
``__init__(self, dim, num_heads, config=None, *, depth=0, **settings)`` that begins with
``config = self.resolve_config(config, settings)``, and :func:`register_attention` on the class. Models,
``create_model`` overrides, saved configs, the diagnostics and ``diffattn inspect`` then take it by its name.

What the rest of the library asks of a kind, it asks its class (never its name):

- ``title``: the words ``diffattn models`` prints (``"differential"``);
- ``differential``: whether the layer subtracts a second attention map (λ, its form and the sub-norm are then its
  settings);
- ``head_layout``: how q/k/v hold the maps: ``"single"`` (one map per head), ``"paired"`` (signal and noise query
  and key heads side by side, values of width 2d, as Ye et al. 2024's layer), ``"branched"`` (two query heads per
  output head over shared keys and values of width d, as Ye et al. 2026's V2);
- ``scales_by_lambda_init``: whether the output is scaled by (1 − λ_init) after the sub-norm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch.nn as nn

from ..checks import check_flag, check_positive_float, check_positive_int, check_probability
from ..ops import BACKENDS
from .rope import ROPE_STYLES

__all__ = ["AttentionSpec", "ATTENTION_TYPES", "HEAD_LAYOUTS", "register_attention", "attention_class",
           "attention_kind", "check_flag", "check_positive_int", "check_positive_float", "check_probability"]

#: attention kind → layer class, filled by :func:`register_attention`
ATTENTION_TYPES: dict[str, type[nn.Module]] = {}
#: the ways a layer's q/k/v hold its attention maps (module docstring)
HEAD_LAYOUTS = ("single", "paired", "branched")


# --------------------------------------------------------------------------------------------- the registry

def register_attention(cls: type[nn.Module]) -> type[nn.Module]:
    """Class decorator: register layer class ``cls`` under its ``kind``. The class must declare a ``Config`` of its
    own (a subclass of :class:`AttentionSpec` whose ``kind`` default is the class's kind) and its ``head_layout``."""
    kind = cls.__dict__.get("kind")
    config = cls.__dict__.get("Config")
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls.__name__} must declare its attention kind: kind = '<name>'")
    if not (isinstance(config, type) and issubclass(config, AttentionSpec)):
        raise TypeError(f"{cls.__name__} must declare its own Config, a frozen dataclass subclassing AttentionSpec")
    if {f.name: f.default for f in fields(config)}["kind"] != kind:
        raise TypeError(f"{cls.__name__}.Config must default kind to {kind!r}")
    if cls.head_layout not in HEAD_LAYOUTS:
        raise TypeError(f"{cls.__name__}.head_layout must be one of {HEAD_LAYOUTS}, got {cls.head_layout!r}")
    if kind in ATTENTION_TYPES and ATTENTION_TYPES[kind] is not cls:
        raise ValueError(f"attention kind {kind!r} is already registered by {ATTENTION_TYPES[kind].__name__}")
    ATTENTION_TYPES[kind] = cls
    return cls


def attention_class(name: str) -> type[nn.Module]:
    """The layer class of attention kind ``name`` (a key of :data:`ATTENTION_TYPES`)."""
    if name not in ATTENTION_TYPES:
        raise ValueError(f"attention kind must be one of {tuple(ATTENTION_TYPES)}, got {name!r}")
    return ATTENTION_TYPES[name]


def attention_kind(module: nn.Module) -> str | None:
    """The kind of an attention layer of the library, or None for any other module: the registered class nearest
    in ``module``'s class hierarchy, so a subclass of a registered layer has its parent's kind unless registered
    itself (``GatedDiffAttention`` is ``"gated"``, not ``"diff"``)."""
    kinds = {cls: name for name, cls in ATTENTION_TYPES.items()}
    return next((kinds[cls] for cls in type(module).__mro__ if cls in kinds), None)


def _all_settings() -> dict[str, Any]:
    """Every setting of every registered kind, with a default (the first kind's that has it: a kind may give a shared
    setting its own default, as Stable Audio's has no biases)."""
    out: dict[str, Any] = {}
    for cls in ATTENTION_TYPES.values():
        for f in fields(cls.Config):
            out.setdefault(f.name, f.default)
    return out


def _check_known(data: Mapping[str, Any], kind: str, own: set[str]) -> None:
    """ValueError naming the keys of ``data`` that are no registered kind's setting."""
    unknown = sorted(set(data) - set(_all_settings()))
    if unknown:
        raise ValueError(f"unknown AttentionSpec settings {unknown}; the settings of kind {kind!r} are "
                         f"{sorted(own)}")


def _check_own(data: Mapping[str, Any], kind: str, own: set[str]) -> None:
    """ValueError naming the keys of ``data`` that attention ``kind`` (whose settings are ``own``) does not take,
    and the kinds that do."""
    foreign = sorted(set(data) - own)
    if not foreign:
        return
    _check_known(data, kind, own)
    takers = {k: [n for n, c in ATTENTION_TYPES.items() if k in {f.name for f in fields(c.Config)}] for k in foreign}
    raise ValueError(f"attention kind {kind!r} has no setting " + "; ".join(
        f"{k} (a setting of kind {', '.join(map(repr, ks))})" for k, ks in takers.items()) +
        f"; its settings are {sorted(own - {'kind'})}")


# ------------------------------------------------------------------------------------------------ the spec

@dataclass(frozen=True)
class AttentionSpec:
    """The registered config of an attention kind: which layer a model builds, with its settings.

    ``AttentionSpec(kind, **settings)`` is the ``Config`` of the kind's layer class (``AttentionSpec("diff")`` is a
    :class:`~diffattn.layers.DiffAttention.Config`), holding only that kind's settings; a setting of another kind
    is a ValueError naming the kinds that take it. The settings here are those every kind has:

    Args:
        kind: a key of :data:`ATTENTION_TYPES`: ``"standard"``, ``"diff"``, ``"gated"``, ``"diff_v2"``,
            ``"grouped"`` or a kind registered since.
        num_kv_heads: key/value heads (grouped-query attention); None: as many as query heads.
        qkv_bias: bias of the q/k/v projections.
        out_bias: bias of the output projection.
        causal: a causal mask by default (text towers and language models set it).
        attn_drop: dropout on the attention maps.
        proj_drop: dropout after the output projection.
        backend: ``"auto"``, ``"math"``, ``"sdpa"`` or ``"triton"`` (differential kinds only).
        rope: None, or the rotary embedding style, ``"half"`` or ``"interleaved"``.
        rope_theta: the rotary embedding's base.
        softcap: tanh(S/c)·c on the logits (Gemma 2); None: off.
        sliding_window: each query sees only the last ``sliding_window`` keys; None: all.

    Raises ValueError naming the setting, the value and what it needs.
    """

    kind: str = "standard"
    num_kv_heads: int | None = None
    qkv_bias: bool = True
    out_bias: bool = True
    causal: bool = False
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    backend: str = "auto"
    rope: str | None = None
    rope_theta: float = 10000.0
    softcap: float | None = None
    sliding_window: int | None = None

    def __new__(cls, *args, **kwargs):
        if cls is AttentionSpec:  # AttentionSpec(kind, ...) is the Config of that kind
            kind = args[0] if args else kwargs.get("kind", "standard")
            if not isinstance(kind, str) or kind not in ATTENTION_TYPES:
                raise ValueError(f"attention kind must be one of {tuple(ATTENTION_TYPES)}, got {kind!r}")
            cls = ATTENTION_TYPES[kind].Config
            _check_own(kwargs, kind, {f.name for f in fields(cls)})
        return object.__new__(cls)

    def __post_init__(self) -> None:
        own = {f.name: f.default for f in fields(self)}["kind"]
        if self.kind != own:
            raise ValueError(f"{type(self).__qualname__} is the config of attention kind {own!r}, got kind="
                             f"{self.kind!r}; AttentionSpec({self.kind!r}, ...) builds that kind's")
        check_positive_int("attention num_kv_heads", self.num_kv_heads)
        for name in ("qkv_bias", "out_bias", "causal"):
            check_flag(f"attention {name}", getattr(self, name))
        for name in ("attn_drop", "proj_drop"):
            check_probability(f"attention {name}", getattr(self, name))
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "triton" and not self.layer_class.differential:
            raise ValueError(f"backend='triton' is for differential attention; kind {self.kind!r} takes 'auto', "
                             f"'math' or 'sdpa'")
        if self.rope is not None and self.rope not in ROPE_STYLES:
            raise ValueError(f"rope must be None or one of {ROPE_STYLES}, got {self.rope!r}")
        check_positive_float("attention rope_theta", self.rope_theta)
        check_positive_float("attention softcap", self.softcap, optional=True)
        check_positive_int("attention sliding_window", self.sliding_window)

    @property
    def layer_class(self) -> type[nn.Module]:
        """The layer class of this spec's kind."""
        return attention_class(self.kind)

    def check_heads(self, dim: int, num_heads: int) -> None:
        """ValueError unless this spec builds a layer of width ``dim`` with ``num_heads`` query heads, where a kind
        has a rule the layer cannot state alone (grouped differential attention's head split); the layers check
        their own sizes."""

    def build(self, dim: int, num_heads: int, depth: int = 0) -> nn.Module:
        """The attention layer of block ``depth`` (0-based, for ``lambda_init="ye"``): x (B, N, dim) → (B, N, dim)
        with ``num_heads`` standard heads (even for the differential kinds; for ``"grouped"`` the signal and
        noise query heads together). The head counts are checked here first (:meth:`check_heads`)."""
        self.check_heads(dim, num_heads)
        return self.layer_class(dim, num_heads, self, depth=depth)

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
        """Build from :meth:`to_dict` output (the kind's ``Config``). A saved dict may hold settings of other kinds
        that this kind's layer never read (configs written before each kind had its own, which held every
        setting): those are dropped, as they change nothing. Unknown keys are an error naming them."""
        if not isinstance(data, Mapping):
            raise ValueError(f"attention must be an AttentionSpec or a dict of its settings, got "
                             f"{type(data).__name__} {data!r}")
        kind = data.get("kind", "standard")
        target = attention_class(kind).Config if cls is AttentionSpec else cls
        own = {f.name for f in fields(target)}
        _check_known(data, kind, own)
        return target(**{k: v for k, v in data.items() if k in own})

    @classmethod
    def settings_of(cls, kind: str) -> tuple[str, ...]:
        """The settings (field names, ``kind`` aside) that attention ``kind`` takes: its Config's fields."""
        return tuple(f.name for f in fields(attention_class(kind).Config) if f.name != "kind")

    # ------------------------------------------------------------------------------------------ update

    def updated(self, changes: Mapping[str, Any] | AttentionSpec) -> AttentionSpec:
        """This spec with ``changes`` set and every other setting kept: how a partial attention setting updates a
        model's spec (``create_model(name, attention={"lambda_init": 0.5})``, ``--set
        model.overrides.attention.lambda_init=0.5``, a recipe's ``attention:`` block, a CLIP tower's
        ``text_attention={...}``).

        - ``changes`` a dict of settings (any subset of the kind's settings): those settings, the rest kept;
        - with a ``"kind"`` other than this spec's: the kind changes, keeping every setting the new kind also has
          (a gated spec updated with ``{"kind": "diff"}`` keeps λ_init, biases, dropout, backend and the rest; its
          ``q_residual`` and ``gate_bias`` go with the kind that has them), the new kind's own at their defaults
          unless ``changes`` sets them;
        - ``changes`` an :class:`AttentionSpec`: a full replacement, returned as it is.

        A setting the (new) kind does not take is a ValueError naming the kinds that do; the result is validated as
        any spec."""
        if isinstance(changes, AttentionSpec):
            return changes
        if not isinstance(changes, Mapping):
            raise ValueError(f"attention must be an AttentionSpec or a dict of its settings, got "
                             f"{type(changes).__name__} {changes!r}")
        kind = changes.get("kind", self.kind)
        target = attention_class(kind).Config
        own = {f.name for f in fields(target)}
        _check_own(changes, kind, own)
        kept = {k: v for k, v in asdict(self).items() if k in own}
        return target(**{**kept, **changes, "kind": kind})
