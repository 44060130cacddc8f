"""``retrofit()`` and the reports around it: parameter counts and λ monitoring.

A binding (:data:`diffattn.adapters.bindings.BINDINGS`) finds a model family's attention modules and swaps each for
a subclass of the family's own class (or, for ``nn.MultiheadAttention``, a module that keeps its weights) that runs
:func:`diffattn.adapters.methods.run_method`. The new weights live in a :class:`RetrofitAdapter` stored as the
attribute ``diff_adapter`` of each swapped module (pass ``modules_to_save=["diff_adapter"]`` to peft).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch.nn as nn

from .._version import __version__
from ..formats import FORMAT, FORMAT_KEY
from ..lambdas import DEFAULT_LAMBDA_INIT
from .binding import ADAPTER_ATTR, Candidate
from .bindings import BINDINGS
from .config import RetrofitConfig
from .load_warning import install_load_warning
from .methods import RetrofitAdapter
from .naming import active_modules, canonical_name, is_wrapped, key_map, module_map
from .schedule import adapters

__all__ = [
    "ADAPTER_ATTR",
    "RetrofitPlan",
    "supported_families",
    "plan_retrofit",
    "retrofit",
    "retrofit_config",
    "count_parameters",
    "lambda_summary",
    "HF_CONFIG_KEY",
    "retrofit_record",
]

#: attribute of a retrofitted model holding its :class:`RetrofitPlan`
PLAN_ATTR = "diffattn_retrofit"


def supported_families() -> list[str]:
    """Human-readable list of the model families ``retrofit`` supports."""
    return [f for b in BINDINGS for f in b.families]


@dataclass(frozen=True)
class RetrofitPlan:
    """What :func:`retrofit` will do (or did) to one model, computed without touching it.

    ``config`` has ``layers`` resolved to sorted non-negative indices; ``candidates`` are every attention module
    found (module order), ``chosen`` the converted ones, ``adapters`` their new modules (on the model's device and
    in its dtype, or on the meta device for a dry run).
    """

    config: RetrofitConfig
    candidates: tuple[Candidate, ...]
    chosen: tuple[Candidate, ...]
    adapters: tuple[RetrofitAdapter, ...]
    #: the modules ``config.trainable`` names, in its order
    heads: tuple[nn.Module, ...] = ()

    @property
    def layer_names(self) -> list[str]:
        return [c.name for c in self.chosen]

    def trainable_modules(self) -> list[nn.Module]:
        """The modules the train mode makes trainable besides the adapters: with ``train="attention"`` the converted
        ones and what belongs to them, and for every mode the modules ``config.trainable`` names."""
        mods: list[nn.Module] = []
        if self.config.train == "attention":
            for c in self.chosen:
                mods.append(c.module)
                mods += c.binding.extra_trainable(c)
        return mods + list(self.heads)


def _select(n: int, layers: Sequence[int] | Callable[[int, str], bool] | None, names: list[str]) -> list[int]:
    if layers is None:
        return list(range(n))
    if callable(layers):
        out = [i for i in range(n) if layers(i, names[i])]
        if not out:
            raise ValueError(f"the layers predicate selected none of the {n} attention layers {names}")
        return out
    out = []
    for i in layers:  # ints, non-empty, no repeats: checked by RetrofitConfig
        if not -n <= i < n:
            raise ValueError(f"layers must hold attention-layer indices in [{-n}, {n}) (the model has {n} attention "
                             f"layers), got {i!r}")
        out.append(i % n)
    if len(set(out)) != len(out):
        raise ValueError(f"layers {list(layers)} name the same attention layer twice (the model has {n})")
    return sorted(out)


def plan_retrofit(model: nn.Module, config: RetrofitConfig, *, device=None, dtype=None) -> RetrofitPlan:
    """Find the attention modules ``config`` selects and build their adapters, without changing ``model``.

    ``device`` / ``dtype`` default to each module's own (``"meta"`` builds shapes only, for validation).
    Raises ValueError when the model has no supported attention, the selection is out of range, or a method
    cannot apply to a layer (e.g. ``split_heads`` with a head width not divisible by 4).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if adapters(model) or hasattr(model, PLAN_ATTR):
        raise ValueError("model is already retrofitted (it holds diff_adapter modules); retrofit a fresh model")
    cands: list[Candidate] = []
    for b in BINDINGS:
        cands += b.find(model)
    if not cands:
        raise ValueError(f"retrofit found no supported attention module in {type(model).__name__}; supported "
                         f"families: {', '.join(supported_families())}")
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    cands.sort(key=lambda c: order.get(id(c.module), 0))
    chosen = _select(len(cands), config.layers, [c.name for c in cands])
    ads = []
    for i in chosen:  # every adapter is built (and validated) before any module is converted
        c = cands[i]
        D, h, d, *value_dim = c.binding.dims(c.module)  # a binding may add the value head width (D, h, d, dv)
        ref = next(c.module.parameters())
        ads.append(RetrofitAdapter(config.method, dim=D, num_heads=h, head_dim=d, lambda_init=config.lambda_init,
                                   anneal_steps=config.anneal_steps, layer_index=i,
                                   value_dim=value_dim[0] if value_dim else None,
                                   device=ref.device if device is None else device,
                                   dtype=ref.dtype if dtype is None else dtype))
    return RetrofitPlan(replace(config, layers=chosen), tuple(cands), tuple(cands[i] for i in chosen), tuple(ads),
                        _heads(model, config.trainable))


def _heads(model: nn.Module, names: Sequence[str]) -> tuple[nn.Module, ...]:
    """The modules ``trainable`` names (bare-model names also resolve inside a peft-wrapped model)."""
    mods = dict(model.named_modules())
    canon = module_map(model)
    out = []
    for n in names:
        m = mods.get(n)
        if m is None and n in canon:
            m = mods[canon[n]]
        if m is None or m is model:
            heads = [h for h, _ in model.named_children() if h in TASK_HEAD_NAMES]
            raise ValueError(f"trainable names {n!r}, which is not a submodule of {type(model).__name__} (its task "
                             f"heads: {heads}; any name from model.named_modules() works)")
        out.append(m)
    return tuple(out)


def retrofit(model: nn.Module, method: str | RetrofitConfig, *, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
             anneal_steps: int = 1000, layers: Sequence[int] | Callable[[int, str], bool] | None = None,
             train: str = "attention", trainable: Sequence[str] = ()) -> nn.Module:
    """Turn the attention of ``model`` into differential attention in place and return ``model``.

    ``retrofit(model, RetrofitConfig(...))`` and ``retrofit(model, method, **kw)`` are the same call (with a
    config, the keyword arguments must be left at their defaults); see :class:`RetrofitConfig` for the arguments.

    Args:
        model: a transformers model (GPT-2, Llama, Qwen2, Mistral, Gemma, Gemma2, BERT, CLIP, SigLIP, ViT,
            PaliGemma), a timm ``VisionTransformer``, an open_clip model or an Ultralytics YOLO ``model.model``.
        method: ``"daa"``, ``"dex"``, ``"diffq"``, ``"diffk"``, ``"diffv"`` (DAA (2025); DEX: Kong et al. 2025)
            or ``"shared_qk"``, ``"split_heads"`` (Li et al. 2025); see :mod:`diffattn.adapters.methods`.
        lambda_init: λ_init of DAA (2025) eq. 3; ``"ye"`` gives 0.8 − 0.6·exp(−0.3·l) (Ye et al. 2024) with l the
            0-based index of the attention layer in module order.
        anneal_steps: T, the annealing duration in optimizer steps (DAA (2025) eq. 3).
        layers: which attention layers (0-based, module order) to convert: indices, or a predicate
            ``(index, name) -> bool``; None converts all.
        train: ``"attention"`` (the converted attention modules with their adapters, the rest frozen: DAA (2025)
            App. E.1), ``"adapters"`` (only the new weights and λ) or ``"all"``.
        trainable: modules that stay trainable whatever ``train`` freezes, by name, e.g. ``("classifier",)`` for a
            new task head (without it, ``train="attention"`` / ``"adapters"`` freeze the head and warn).

    A transformers model also records the config in ``model.config`` (key ``diffattn_retrofit``), so
    ``model.save_pretrained(dir)`` writes a checkpoint that :func:`diffattn.from_pretrained_retrofit` restores.

    At step 0 the converted model computes the pretrained function (DAA (2025) methods exactly; Li et al. 2025
    methods via the blend described in :mod:`~diffattn.adapters.methods`). Advance the schedule once per optimizer
    step with :func:`step`, :func:`attach_to_optimizer` or :class:`DiffAttnCallback`. Nothing is changed when an
    error is raised.
    """
    if isinstance(method, RetrofitConfig):
        given = {"lambda_init": (lambda_init, DEFAULT_LAMBDA_INIT), "anneal_steps": (anneal_steps, 1000),
                 "layers": (layers, None), "train": (train, "attention"), "trainable": (trainable, ())}
        clash = [k for k, (v, default) in given.items() if v is not default and v != default]
        if clash:
            raise ValueError(f"retrofit(model, config) takes its settings from the config; got {clash} as well")
        config = method
    else:
        config = RetrofitConfig(method, lambda_init=lambda_init, anneal_steps=anneal_steps, layers=layers,
                                train=train, trainable=trainable)
    apply_plan(model, plan_retrofit(model, config))
    return model


def apply_plan(model: nn.Module, plan: RetrofitPlan, *, warn: bool = True) -> None:
    """Convert the modules of ``plan`` (from :func:`plan_retrofit` on this model) and set what trains.

    ``warn=False`` (reloading a saved retrofit) skips the warning about frozen task heads."""
    for c, a in zip(plan.chosen, plan.adapters, strict=True):
        c.binding.convert(c, a)
    setattr(model, PLAN_ATTR, plan)
    _record_in_hf_config(model, plan)
    peft_own = _peft_parameters(model)  # a peft-wrapped model: peft decides what of its own weights trains
    try:
        _set_trainable(model, plan, warn)
    finally:
        for p, flag in peft_own:
            p.requires_grad_(flag)


def _peft_parameters(model: nn.Module) -> list[tuple[nn.Parameter, bool]]:
    if not is_wrapped(model):
        return []
    bare = set(key_map(model).values())
    return [(p, p.requires_grad) for n, p in model.named_parameters() if n not in bare]


def _set_trainable(model: nn.Module, plan: RetrofitPlan, warn: bool) -> None:
    train = plan.config.train
    if train == "all":
        model.requires_grad_(True)
        return
    kept = {id(m) for m in plan.heads}
    heads = [n for n in _task_heads(model) if id(model.get_submodule(n)) not in kept]
    model.requires_grad_(False)
    for m in plan.trainable_modules():
        m.requires_grad_(True)
    for a in plan.adapters:
        a.requires_grad_(True)
    if heads and warn:
        warnings.warn(f"retrofit(train={train!r}) froze the task head(s) {heads}; if a head is new (e.g. from "
                      f"AutoModelForSequenceClassification), keep it trainable with retrofit(..., "
                      f"trainable=({heads[0]!r},)) or model.{heads[0]}.requires_grad_(True) (either way it is saved "
                      "with the adapter), or retrofit with train='all'",
                      UserWarning, stacklevel=4)


#: key of ``model.config`` (and of a saved ``config.json``) that holds the retrofit of a transformers model
HF_CONFIG_KEY = "diffattn_retrofit"
#: version of the ``diffattn_retrofit`` record
HF_FORMAT_VERSION = 1


def retrofit_record(model: nn.Module, plan: RetrofitPlan) -> dict[str, Any]:
    """The JSON record of a retrofit: the config plus the converted layers' names (as in the bare model, without
    peft's prefix), the attention-layer count, the record's layout version (``format_version``) and the diffattn
    format and version (:mod:`diffattn.formats`)."""
    names = [canonical_name(model, n) or n for n in plan.layer_names]
    return dict(plan.config.to_dict(), layer_names=names, num_attention_layers=len(plan.candidates),
                format_version=HF_FORMAT_VERSION, **{FORMAT_KEY: FORMAT}, diffattn_version=__version__)


def _record_in_hf_config(model: nn.Module, plan: RetrofitPlan) -> None:
    """Store the retrofit in a transformers ``model.config`` so that ``save_pretrained`` writes it to config.json."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string") and hasattr(config, "architectures"):
        setattr(config, HF_CONFIG_KEY, retrofit_record(model, plan))

        install_load_warning()  # its checkpoints may be reloaded into a plain model in this process: say so


#: attribute names transformers and timm give a task head on top of the backbone
TASK_HEAD_NAMES = ("classifier", "score", "qa_outputs", "pre_classifier", "head")


def _task_heads(model: nn.Module) -> list[str]:
    """Names of the task heads of ``model`` (``TASK_HEAD_NAMES`` children) that have trainable parameters."""
    return [n for n, m in model.named_children()
            if n in TASK_HEAD_NAMES and any(p.requires_grad for p in m.parameters())]


def retrofit_config(model: nn.Module) -> RetrofitConfig:
    """The :class:`RetrofitConfig` a retrofitted ``model`` was converted with (``layers`` as resolved indices)."""
    plan = getattr(model, PLAN_ATTR, None)
    if plan is None:
        raise ValueError("model is not retrofitted; call diffattn.retrofit(model, method) first")
    return plan.config


def _plan(model: nn.Module) -> RetrofitPlan:
    plan = getattr(model, PLAN_ATTR, None)
    if plan is None or not adapters(model):
        raise ValueError("model is not retrofitted (no diff_adapter modules); call diffattn.retrofit first")
    return plan


# ---------------------------------------------------------------------------------------------- reports


def count_parameters(model: nn.Module) -> dict[str, Any]:
    """Parameter counts: ``total``, ``trainable``, ``new`` (adapter parameters), ``new_trainable`` and ``layers``:
    one dict per retrofitted layer with ``name``, ``index``, ``method``, ``new`` and ``trainable`` (the converted
    module's trainable parameters, adapter included). DAA (2025) App. B: DAA and DEX add D²/h per layer, DiffQ/K/V
    D² (plus λ_learn, one scalar per layer); works on models built on the meta device."""
    def uniq(params):
        seen, out = set(), []
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    allp = uniq(model.parameters())
    per_layer = []
    new_params = []
    for canon, name, a in active_modules(model, RetrofitAdapter):
        ap = uniq(a.parameters())
        new_params += ap
        owner = model.get_submodule(_owner(model, name))
        per_layer.append({"name": canon.rsplit(".", 1)[0] if "." in canon else "", "index": a.layer_index,
                          "method": a.method,
                          "new": sum(p.numel() for p in ap),
                          "trainable": sum(p.numel() for p in uniq(owner.parameters()) if p.requires_grad)})
    new_params = uniq(new_params)
    return {"total": sum(p.numel() for p in allp),
            "trainable": sum(p.numel() for p in allp if p.requires_grad),
            "new": sum(p.numel() for p in new_params),
            "new_trainable": sum(p.numel() for p in new_params if p.requires_grad),
            "layers": per_layer}


def _owner(model: nn.Module, adapter_name: str) -> str:
    """The attention module holding the adapter called ``adapter_name`` (above peft's modules_to_save wrapper)."""
    parts = adapter_name.split(".")
    while parts and parts[-1] != ADAPTER_ATTR:
        parts.pop()
    return ".".join(parts[:-1])


def lambda_summary(model: nn.Module) -> list[dict[str, Any]]:
    """Per retrofitted layer: ``name``, ``index``, ``method``, ``step`` t, ``lambda`` (λ(t), or the reparam λ),
    ``lambda_learn`` (DAA (2025) methods; None otherwise), ``lambda_init`` and ``blend`` β(t) (Li et al. 2025
    methods; None otherwise)."""
    import torch

    out = []
    with torch.no_grad():
        for name, a in adapters(model):
            out.append({"name": name.rsplit(".", 1)[0], "index": a.layer_index, "method": a.method,
                        "step": int(a.step_buffer), "lambda": float(a.lambda_value()),
                        "lambda_learn": a.method_impl.lambda_learn(a), "lambda_init": a.lambda_init,
                        "blend": float(a.blend()) if a.method_impl.blended else None})
    return out
