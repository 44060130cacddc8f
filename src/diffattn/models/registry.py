"""Model registry: ``build(name, **overrides)`` and ``list_models()``, in the manner of timm.

Each family declares ONE literal table of configurations keyed by the full registered name (like timm's
``default_cfgs`` or open_clip's model configs) and registers it with :func:`register_family`; every model of every
family is built by the same :func:`build_model`, which applies overrides one way:

- ``key=value`` where ``key`` is an argument of the family's class replaces that argument;
- for families with towers (CLIP: ``vision`` and ``text`` are dicts of tower arguments), ``<tower>_<arg>=value``
  sets one argument of one tower (``vision_depth=2``) and ``<arg>=value`` that every tower takes but the class
  does not (``attention``) sets it in all towers;
- ``attention=`` (``<tower>_attention=`` for one tower) with a dict of settings UPDATES the registered spec: the
  settings given change, every other one is kept, the kind included (:meth:`AttentionSpec.updated
  <diffattn.layers.AttentionSpec.updated>`; ``create_model("diff_vit_nano", attention={"lambda_init": 0.5})`` is a
  DiffViT with λ_init 0.5). A ``"kind"`` in the dict changes the kind, the settings only some kinds take starting
  afresh at their defaults; an :class:`~diffattn.layers.AttentionSpec` instance is a full replacement. The loose
  keywords of before (``lambda_init="ye"``, ``text_lambda_form=...``, a kind's name ``attention="diff"``) update the
  spec the same way, with one FutureWarning that names the dict to pass (:func:`~diffattn.layers.blocks.warn_loose`);
- anything else is a ValueError that lists what is accepted.

The registry only builds: it imports no family (each family module registers itself, and importing
:mod:`diffattn.models` imports every family) and no loader. Pretrained weights, ``"<name>.<tag>"`` names and
``features_only=True`` are :func:`diffattn.factory.create_model`'s, above this package and :mod:`diffattn.convert`;
what a family adds to that (a feature extractor) is a hook on its :class:`ModelFamily`.
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch.nn as nn

from ..errors import did_you_mean
from ..layers.blocks import LOOSE_KEYWORDS, AttentionSpec, warn_loose
from .pretrained import list_pretrained

__all__ = ["ModelFamily", "register_family", "register_model", "build_model", "build", "list_models", "is_model",
           "model_builder", "model_family", "model_config", "model_info", "describe_model", "inspect_args"]

_BUILDERS: dict[str, Callable[..., nn.Module]] = {}
_FAMILY_OF: dict[str, ModelFamily] = {}
#: keywords timm.create_model passes to every entry point, ignored by the builders
TIMM_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def inspect_args(cls: type) -> tuple[str, ...]:
    """The constructor's argument names of ``cls`` (without ``self`` and the ``**loose`` attention keywords of
    before, :func:`loose_args`)."""
    return tuple(n for n, p in inspect.signature(cls.__init__).parameters.items()
                 if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD)


def loose_args(cls: type) -> tuple[str, ...]:
    """The deprecated loose attention keywords ``cls`` still converts (``cls.LOOSE``,
    :class:`~diffattn.layers.LooseAttention`); none for a class without."""
    loose = getattr(cls, "LOOSE", None)
    return tuple(loose.keywords) if loose is not None else ()


@dataclass(frozen=True)
class ModelFamily:
    """A model class, its literal config table (name → constructor arguments) and, for multi-tower models, the
    classes that take each tower's dict of arguments (``towers={"vision": VisionTransformer, ...}``).

    ``features``: the family's hook for ``create_model(name, features_only=True)``, ``features(model, **kwargs)``
    with the keyword names ``feature_kwargs`` (vision transformers: timm's feature extractor); None: the family
    has no feature extractor."""

    cls: type
    configs: Mapping[str, dict]
    module: str
    description: str
    towers: Mapping[str, type] = field(default_factory=dict)
    features: Callable[..., nn.Module] | None = None
    feature_kwargs: tuple[str, ...] = ()

    def apply_overrides(self, name: str, overrides: dict) -> dict:
        """The configuration of ``name`` with ``overrides`` applied (module docstring)."""
        cfg = copy.deepcopy(dict(self.configs[name]))
        classes = {None: self.cls, **self.towers}
        args = {t: inspect_args(c) for t, c in classes.items()}
        loose = {t: loose_args(c) for t, c in classes.items()}

        def takes(t, key):
            return key in args[t] or key in loose[t]

        shared = [k for k in overrides if not takes(None, k) and self.towers and all(takes(t, k) for t in self.towers)]
        ordered = shared + [k for k in overrides if k not in shared]  # "all towers" first, one tower's after
        deprecated: dict[str, dict] = {}  # loose keywords given: the dict to pass instead, by argument
        given: list[str] = []
        for key in ordered:
            value = overrides[key]
            tower = next((t for t in self.towers if key.startswith(t + "_") and takes(t, key[len(t) + 1:])), None)
            if takes(None, key):
                targets = [(None, key)]
            elif tower is not None:
                targets = [(tower, key[len(tower) + 1:])]
            elif self.towers and all(takes(t, key) for t in self.towers):
                targets = [(t, key) for t in self.towers]
            else:
                towers = "".join(f", {t}_<arg> (arg in {list(args[t])})" for t in self.towers)
                raise ValueError(f"override {key!r} is not an argument of {self.cls.__name__} ({name!r}); it "
                                 f"takes {list(args[None])}{towers}")
            (t0, k0), change = targets[0], None
            if k0 not in args[t0]:  # a loose keyword: the spelling of before
                change = {LOOSE_KEYWORDS[k0]: value}
            elif k0 == "attention" and isinstance(value, str):  # a kind's name: the spelling of before too
                change = {"kind": value}
            if change is not None:
                given.append(f"{key}={value!r}")
                arg = f"{t0}_attention" if t0 is not None and len(targets) == 1 else "attention"
                deprecated.setdefault(arg, {}).update(change)
            for t, k in targets:
                where = cfg if t is None else cfg.setdefault(t, {})
                if change is not None:
                    where["attention"] = _spec(_with_defaults(classes[t], where)).updated(change)
                elif k == "attention" and isinstance(value, Mapping):
                    where["attention"] = _spec(_with_defaults(classes[t], where)).updated(value)
                else:
                    where[k] = value
        if given:  # the deprecated spelling, converted, with one warning per call
            instead = " and ".join(f"{arg}={d!r}" for arg, d in deprecated.items())
            keys = " ".join(f"--set model.overrides.{arg}.{k}={v if isinstance(v, str) else json.dumps(v)}"
                            for arg, d in deprecated.items() for k, v in d.items())
            warn_loose(f"create_model({name!r})", given, f"{instead} (a partial dict updates the registered "
                                                          f"attention; in a recipe: {keys})")
        return cfg


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register ``fn`` (``fn(**overrides) -> nn.Module``) under its own name; raises if the name is taken."""
    name = fn.__name__
    if name in _BUILDERS and _BUILDERS[name] is not fn:
        raise ValueError(f"a model named {name!r} is already registered")
    _BUILDERS[name] = fn
    return fn


def build_model(family: ModelFamily, name: str, overrides: dict) -> nn.Module:
    """The one builder of every registered family: ``family.cls(**config of name with overrides)``. timm's
    ``pretrained_cfg*`` keywords are ignored; weights (``pretrained=``) are loaded by
    :func:`diffattn.factory.create_model`, not here."""
    overrides = dict(overrides)
    pretrained = overrides.pop("pretrained", False)
    for k in TIMM_KWARGS:  # passed by timm.create_model; diffattn models have no timm pretrained configs
        overrides.pop(k, None)
    if pretrained not in (False, None):
        raise ValueError(f"pretrained={pretrained!r}: the registry builds {name!r} without weights; "
                         f"diffattn.create_model({name!r}, pretrained=...) loads them")
    return family.cls(**family.apply_overrides(name, overrides))


def build(name: str, **overrides) -> nn.Module:
    """A new, randomly initialised model ``name`` with ``overrides`` applied (:func:`build_model`), its
    ``model_name`` set: what the converters fill with converted weights."""
    model = model_builder(name)(**overrides)
    model.model_name = name
    return model


def register_family(family: ModelFamily) -> list[Callable[..., nn.Module]]:
    """Register every name of ``family.configs``; returns the builders (one per name, in table order)."""
    builders = []
    for name, cfg in family.configs.items():
        def builder(_name: str = name, **overrides) -> nn.Module:
            return build_model(family, _name, overrides)

        builder.__name__ = builder.__qualname__ = name
        builder.__module__ = family.module
        builder.__doc__ = f"{name}: {family.description} {family.cls.__name__}({_fmt(cfg)})."
        builders.append(register_model(builder))
        _FAMILY_OF[name] = family
    return builders


def _fmt(cfg: Mapping) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in cfg.items())


def model_config(name: str) -> dict:
    """A copy of the registered configuration (constructor arguments) of model ``name``."""
    return copy.deepcopy(dict(model_family(name).configs[name]))


def model_family(name: str) -> ModelFamily:
    """The :class:`ModelFamily` that registered model ``name``."""
    if name not in _FAMILY_OF:
        model_builder(name)  # an unknown name: the one error, with the similar names
        raise ValueError(f"model {name!r} was registered as a function, not by a ModelFamily (register_family)")
    return _FAMILY_OF[name]


def model_info(name: str) -> dict:
    """One row describing model ``name``: its family (class and description), what sets it apart from the family's
    other rows (``description``, :func:`describe_model`), the attention of each tower, its
    parameter count, counted on the meta device (nothing is allocated), and its pretrained tags (``pretrained``,
    a list, empty for most models; :func:`diffattn.models.list_pretrained`)."""
    import torch

    cfg = model_config(name)
    family = _FAMILY_OF[name]
    with torch.device("meta"):
        params = sum(p.numel() for p in build(name).parameters())
    if family.towers:
        attention = {t: _attention_kind(cfg.get(t, {})) for t in family.towers}
    else:
        attention = _attention_kind(cfg)
    return {"name": name, "family": family.cls.__name__, "description": describe_model(name),
            "family_description": family.description, "attention": attention, "params": params, "module": family.module,
            "pretrained": [t for _, t in list_pretrained(name)]}


def _clip_variant(vision: type[nn.Module], text: type[nn.Module]) -> str | None:
    """The name of a CLIP with these towers' attention classes (Hammoud & Ghanem 2025 name DiffCLIP, and DiffCLIP†
    for differential vision with a standard text tower): CLIP for standard attention in both, the class's
    ``clip_variant`` for the same differential attention in both, that name with † for a standard text tower."""
    if not vision.differential and not text.differential:
        return "CLIP"
    name = getattr(vision, "clip_variant", None)
    if vision is text:
        return name
    return f"{name}†" if name and not text.differential else None


def _with_defaults(cls: type, cfg: Mapping) -> dict:
    """``cfg`` over the constructor defaults of ``cls``: what the model is built with."""
    params = inspect.signature(cls.__init__).parameters
    return {**{k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}, **cfg}


def _spec(args: Mapping) -> AttentionSpec:
    """The attention of constructor arguments ``args``: a spec, its dict, or a kind's name (registered configs
    use the first two)."""
    att = args.get("attention")
    if isinstance(att, AttentionSpec):
        return att
    return AttentionSpec.from_dict(att) if isinstance(att, Mapping) else AttentionSpec(att or "standard")


def _attention_kind(args: Mapping) -> str:
    return _spec(args).kind


def _lambda_text(args: Mapping) -> str | None:
    """``λ_init 0.8`` or ``λ_init by depth …`` for the differential kinds that scale by (1 − λ_init), else None."""
    if not _spec(args).layer_class.scales_by_lambda_init:
        return None
    lam = _spec(args).lambda_init
    if lam == "ye":
        return "λ_init by depth (0.8 − 0.6·exp(−0.3·l))"
    return f"λ_init {lam:g}" if isinstance(lam, (int, float)) else f"λ_init {lam}"


def _size_text(args: Mapping, classes: bool = True) -> str:
    """Width, depth, heads and what else sets the size: MLP ratio, image and patch, context, vocabulary, classes
    (``classes=False`` for a tower, whose head its model replaces)."""
    width = args.get("embed_dim", args.get("dim"))
    parts = [f"width {width}", f"depth {args.get('depth')}"]
    heads = args.get("num_heads")
    kv = _spec(args).num_kv_heads
    parts.append(f"{heads} heads" + (f" ({kv} K/V)" if kv not in (None, heads) else ""))
    if args.get("mlp_ratio", 4.0) != 4.0:
        parts.append(f"MLP ×{args['mlp_ratio']:.3g}")
    if "img_size" in args and "patch_size" in args:
        parts.append(f"{args['img_size']} px / patch {args['patch_size']}")
    for key, label in (("max_seq_len", "context"), ("max_len", "context"), ("context_length", "context"),
                       ("vocab_size", "vocabulary"), ("num_classes", "classes")):
        if key in args and not (key == "num_classes" and not (classes and args[key])):
            parts.append(f"{label} {args[key]}")
    return ", ".join(parts)


def describe_model(name: str) -> str:
    """One line saying what sets model ``name`` apart from its family's other rows: the variant (CLIP family), the
    attention kind of each tower, λ_init where it applies, and the size, e.g. ``DiffCLIP*: differential attention
    in both towers, λ_init by depth (…); vision width 64, depth 2, 4 heads, 32 px / patch 4``."""
    family = model_family(name)
    cfg = model_config(name)
    if not family.towers:
        args = _with_defaults(family.cls, cfg)
        head = ", ".join(x for x in (f"{_spec(args).layer_class.title} attention",
                                     _lambda_text(args)) if x)
        return f"{head}; {_size_text(args)}"
    towers = {t: _with_defaults(cls, cfg.get(t, {})) for t, cls in family.towers.items()}
    layers = {t: _spec(a).layer_class for t, a in towers.items()}
    if len(set(layers.values())) == 1:
        head = f"{next(iter(layers.values())).title} attention in both towers"
    else:
        head = ", ".join(f"{c.title} {t}" for t, c in layers.items())
    lams = dict.fromkeys(x for x in (_lambda_text(a) for a in towers.values()) if x)
    variant = None
    if set(layers) == {"vision", "text"}:
        variant = _clip_variant(layers["vision"], layers["text"])
        if variant == "DiffCLIP" and any(_spec(a).lambda_init == "ye" for a in towers.values()):
            variant = "DiffCLIP*"
    first, args = next(iter(towers.items()))
    return (f"{variant + ': ' if variant else ''}{head}{''.join(', ' + x for x in lams)}; "
            f"{first} {_size_text(args, classes=False)}")


def is_model(name: str) -> bool:
    return name in _BUILDERS


def model_builder(name: str) -> Callable[..., nn.Module]:
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}{did_you_mean(name, _BUILDERS)} (diffattn.models.list_models() "
                         f"lists them all)")
    return _BUILDERS[name]


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Sorted registered names matching the shell-style ``pattern``.

    ``pretrained=True`` lists the public checkpoints instead, as timm's ``list_models(pretrained=True)``: one
    ``"<name>.<tag>"`` per pair of :func:`diffattn.models.list_pretrained` whose name (or full ``name.tag``) matches
    ``pattern``; each one is a valid name for :func:`diffattn.create_model`."""
    if not isinstance(pretrained, bool):
        raise TypeError(f"pretrained must be a bool, got {type(pretrained).__name__}")
    if pretrained:
        return sorted(f"{m}.{t}" for m, t in list_pretrained()
                      if fnmatch.fnmatchcase(m, pattern) or fnmatch.fnmatchcase(f"{m}.{t}", pattern))
    return sorted(fnmatch.filter(_BUILDERS, pattern))

