"""``retrofit()`` and the tools around it: the schedule step, parameter counts, λ monitoring, adapter save/load.

A binding (``hf``, ``timm``, ``open_clip`` modules) finds a model family's attention modules and swaps each for a
subclass of the family's own class (or, for ``nn.MultiheadAttention``, a module that keeps its weights) that runs
:func:`diffattn.adapters.methods.run_method`. The new weights live in a :class:`RetrofitAdapter` stored as the
attribute ``diff_adapter`` of each swapped module (pass ``modules_to_save=["diff_adapter"]`` to peft).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from .methods import METHODS, SEED001_METHODS, RetrofitAdapter

__all__ = [
    "ADAPTER_ATTR",
    "TRAIN_MODES",
    "Candidate",
    "register_binding",
    "supported_families",
    "retrofit",
    "step",
    "attach_to_optimizer",
    "count_parameters",
    "lambda_summary",
    "save_adapter",
    "load_adapter",
    "adapters",
]

ADAPTER_ATTR = "diff_adapter"
TRAIN_MODES = ("attention", "adapters", "all")
CONFIG_ATTR = "diffattn_retrofit"
CONFIG_FILE = "diffattn_adapter.json"
WEIGHTS_FILE = "diffattn_adapter.safetensors"
FORMAT_VERSION = 1


@dataclass
class Candidate:
    """An attention module a binding can convert: ``parent.<attr>`` is ``module``."""

    name: str
    module: nn.Module
    parent: nn.Module | None
    attr: str
    binding: Any  # the binding object with ``dims(module)`` and ``convert(candidate, adapter) -> nn.Module``


_BINDINGS: list[Any] = []


def register_binding(binding: Any) -> None:
    """Add a binding: an object with ``family`` (str), ``find(model) -> list[Candidate]``, ``dims(module) -> (D, h,
    d)`` and ``convert(candidate, adapter) -> nn.Module`` (the module now in place)."""
    _BINDINGS.append(binding)


def _load_bindings() -> list[Any]:
    if not _BINDINGS:
        from . import hf, open_clip, timm  # noqa: F401  (each registers itself)
    return _BINDINGS


def supported_families() -> list[str]:
    """Human-readable list of the model families ``retrofit`` supports."""
    return [f for b in _load_bindings() for f in b.families]


def adapters(model: nn.Module) -> list[tuple[str, RetrofitAdapter]]:
    """(name, adapter) for every :class:`RetrofitAdapter` in ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, RetrofitAdapter)]


def _select(n: int, layers, names: list[str]) -> list[int]:
    if layers is None:
        return list(range(n))
    if callable(layers):
        return [i for i in range(n) if layers(i, names[i])]
    if isinstance(layers, int) or not isinstance(layers, Sequence):
        raise ValueError(f"layers must be None, a sequence of 0-based layer indices or a predicate "
                         f"(index, name) -> bool, got {layers!r}")
    out = []
    for i in layers:
        if not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"layers must hold attention-layer indices in [0, {n}) (the model has {n} attention "
                             f"layers), got {i!r}")
        out.append(i % n)
    return sorted(set(out))


def retrofit(model: nn.Module, method: str, *, lambda_init: float | str = 0.8, anneal_steps: int = 1000,
             layers: Sequence[int] | Callable[[int, str], bool] | None = None,
             train: str = "attention") -> nn.Module:
    """Turn the attention of ``model`` into differential attention in place and return ``model``.

    Args:
        model: a transformers model (GPT-2, Llama, Qwen2, Mistral, Gemma, Gemma2, BERT, CLIP, SigLIP, ViT,
            PaliGemma), a timm ``VisionTransformer`` or an open_clip model.
        method: ``"daa"``, ``"dex"``, ``"diffq"``, ``"diffk"``, ``"diffv"`` (seed 001) or ``"shared_qk"``,
            ``"split_heads"`` (seed 002); see :mod:`diffattn.adapters.methods`.
        lambda_init: λ_init of seed 001 eq. 3 (seed 002 eq. 3); ``"ye"`` gives 0.8 − 0.6·exp(−0.3·l) with l the
            0-based index of the attention layer in module order.
        anneal_steps: T, the annealing duration in optimizer steps (seed 001 eq. 3).
        layers: which attention layers (0-based, module order) to convert: indices, or a predicate
            ``(index, name) -> bool``; None converts all.
        train: what stays trainable: ``"attention"`` (the converted attention modules with their adapters, the rest
            frozen: seed 001 E.1), ``"adapters"`` (only the new weights and λ) or ``"all"``.

    At step 0 the converted model computes the pretrained function (seed 001 methods exactly; seed 002 methods via
    the blend described in :mod:`~diffattn.adapters.methods`). Advance the schedule once per optimizer step with
    :func:`step`, :func:`attach_to_optimizer` or :class:`diffattn.adapters.hf.DiffAttnCallback`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if train not in TRAIN_MODES:
        raise ValueError(f"train must be one of {TRAIN_MODES}, got {train!r}")
    if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps <= 0:
        raise ValueError(f"anneal_steps must be a positive int (optimizer steps), got {anneal_steps!r}")
    if not isinstance(lambda_init, (int, float, str)) or isinstance(lambda_init, bool):
        raise ValueError(f"lambda_init must be a float or 'ye', got {lambda_init!r}")
    if isinstance(lambda_init, str) and lambda_init != "ye":
        raise ValueError(f"lambda_init must be a float or 'ye', got {lambda_init!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if adapters(model):
        raise ValueError("model is already retrofitted (it holds diff_adapter modules); retrofit a fresh model")
    cands: list[Candidate] = []
    for b in _load_bindings():
        cands += b.find(model)
    if not cands:
        raise ValueError(f"retrofit found no supported attention module in {type(model).__name__}; supported "
                         f"families: {', '.join(supported_families())}")
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    cands.sort(key=lambda c: order.get(id(c.module), 0))
    chosen = _select(len(cands), layers, [c.name for c in cands])
    converted = []
    for i in chosen:
        c = cands[i]
        D, h, d = c.binding.dims(c.module)
        ref = next(c.module.parameters())
        adapter = RetrofitAdapter(method, dim=D, num_heads=h, head_dim=d, lambda_init=lambda_init,
                                  anneal_steps=anneal_steps, layer_index=i, device=ref.device, dtype=ref.dtype)
        converted.append(c.binding.convert(c, adapter))
    setattr(model, CONFIG_ATTR, {"method": method, "lambda_init": lambda_init, "anneal_steps": anneal_steps,
                                 "layers": chosen, "layer_names": [cands[i].name for i in chosen],
                                 "train": train, "num_attention_layers": len(cands)})
    _set_trainable(model, converted, train)
    return model


def _set_trainable(model: nn.Module, converted: list[nn.Module], train: str) -> None:
    if train == "all":
        model.requires_grad_(True)
        return
    model.requires_grad_(False)
    for m in converted:
        if train == "attention":
            m.requires_grad_(True)
            extra = getattr(m, "_diffattn_out_proj", None)  # output projection that lives outside (BERT)
            if extra is not None:
                extra.requires_grad_(True)
        else:
            getattr(m, ADAPTER_ATTR).requires_grad_(True)


# ---------------------------------------------------------------------------------------------- schedule


def step(model: nn.Module, n: int = 1) -> int:
    """Advance every retrofitted layer's schedule by ``n`` optimizer steps (t ← t + n); returns the new t."""
    ads = adapters(model)
    if not ads:
        raise ValueError("model has no retrofitted layers; call diffattn.retrofit(model, method) first")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    for _, a in ads:
        a.advance(n)
    return int(ads[0][1].step_buffer)


def attach_to_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Advance the schedule after every ``optimizer.step()``; returns the hook handle (``.remove()`` detaches)."""
    return optimizer.register_step_post_hook(lambda opt, args, kwargs: step(model))


# ---------------------------------------------------------------------------------------------- reports


def count_parameters(model: nn.Module) -> dict[str, Any]:
    """Parameter counts: ``total``, ``trainable``, ``new`` (adapter parameters), ``new_trainable`` and ``layers``:
    one dict per retrofitted layer with ``name``, ``index``, ``method``, ``new`` and ``trainable`` (the converted
    module's trainable parameters, adapter included). Seed 001 App. B: DAA and DEX add D²/h per layer, DiffQ/K/V D²
    (plus λ_learn, one scalar per layer); works on models built on the meta device."""
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
    for name, a in adapters(model):
        ap = uniq(a.parameters())
        new_params += ap
        owner_name = name.rsplit(".", 1)[0] if "." in name else ""
        owner = model.get_submodule(owner_name) if owner_name else model
        per_layer.append({"name": owner_name, "index": a.layer_index, "method": a.method,
                          "new": sum(p.numel() for p in ap),
                          "trainable": sum(p.numel() for p in uniq(owner.parameters()) if p.requires_grad)})
    new_params = uniq(new_params)
    return {"total": sum(p.numel() for p in allp),
            "trainable": sum(p.numel() for p in allp if p.requires_grad),
            "new": sum(p.numel() for p in new_params),
            "new_trainable": sum(p.numel() for p in new_params if p.requires_grad),
            "layers": per_layer}


@torch.no_grad()
def lambda_summary(model: nn.Module) -> list[dict[str, Any]]:
    """Per retrofitted layer: ``name``, ``index``, ``method``, ``step`` t, ``lambda`` (λ(t), or the reparam λ),
    ``lambda_learn`` (seed 001; None for seed 002), ``lambda_init`` and ``blend`` β(t) (seed 002; None otherwise)."""
    out = []
    for name, a in adapters(model):
        seed1 = a.method in SEED001_METHODS
        out.append({"name": name.rsplit(".", 1)[0], "index": a.layer_index, "method": a.method,
                    "step": int(a.step_buffer), "lambda": float(a.lambda_value()),
                    "lambda_learn": float(a.lam.lambda_learn) if seed1 else None,
                    "lambda_init": a.lambda_init, "blend": None if seed1 else float(a.blend())})
    return out


# --------------------------------------------------------------------------------------------- save / load


def _adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    keys = {n for n, p in model.named_parameters() if p.requires_grad}
    for name, a in adapters(model):
        keys |= {f"{name}.{k}" for k in a.state_dict()}
    sd = model.state_dict()
    return {k: v.detach().contiguous().clone() for k, v in sd.items() if k in keys}


def save_adapter(model: nn.Module, directory: str | os.PathLike) -> None:
    """Write the new and trainable weights of a retrofitted ``model`` to ``directory``: ``diffattn_adapter.
    safetensors`` (adapters with their ``step`` buffers, plus every parameter that requires grad) and
    ``diffattn_adapter.json`` (method, layers, λ settings, train mode)."""
    from safetensors.torch import save_file

    cfg = getattr(model, CONFIG_ATTR, None)
    if cfg is None or not adapters(model):
        raise ValueError("model is not retrofitted (no diff_adapter modules); call diffattn.retrofit first")
    os.makedirs(directory, exist_ok=True)
    save_file(_adapter_state(model), os.path.join(directory, WEIGHTS_FILE))
    import diffattn

    meta = dict(cfg, format_version=FORMAT_VERSION, diffattn_version=diffattn.__version__,
                base_model=type(model).__name__)
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(meta, f, indent=2)


def load_adapter(base_model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Retrofit ``base_model`` (same architecture and base weights as the saved one) as recorded in ``directory``
    and load the saved weights; returns the model, which then computes what the saved model computed."""
    from safetensors.torch import load_file

    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"directory must hold {CONFIG_FILE} written by save_adapter, got {str(directory)!r}")
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {cfg.get('format_version')!r}; this diffattn reads "
                         f"{FORMAT_VERSION}")
    retrofit(base_model, cfg["method"], lambda_init=cfg["lambda_init"], anneal_steps=cfg["anneal_steps"],
             layers=cfg["layers"], train=cfg["train"])
    got = [c for c in getattr(base_model, CONFIG_ATTR)["layer_names"]]
    if got != cfg["layer_names"]:
        raise ValueError(f"base_model does not match the saved adapter: layers {cfg['layer_names']} were saved, "
                         f"this model's are {got}")
    tensors = load_file(os.path.join(directory, WEIGHTS_FILE), device=str(next(base_model.parameters()).device))
    missing = set(tensors) - set(base_model.state_dict())
    if missing:
        raise ValueError(f"base_model has no parameters named {sorted(missing)[:5]} (…); it is not the "
                         f"architecture the adapter was saved from")
    base_model.load_state_dict(tensors, strict=False)
    return base_model
