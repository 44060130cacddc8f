"""The run's model: built once from the ``model:`` section through the factory (or the task's own), cast, λ frozen
and peft LoRA on top; and the checks made before it is built for real (memory, attention backends).

    check_fits(task, cfg.model, env, task.size_keys)       # on the meta device: no weight allocated
    model = build_run_model(task, cfg.model)
    check_backends(model, env.device, backend_key(cfg.model))
"""

from __future__ import annotations

import importlib.util
import warnings

import torch
import torch.nn as nn

from ..deprecations import warn_deprecated
from ..errors import UsageError
from ..factory import create_model, load_released
from .config import ModelConfig
from .distributed import DistEnv
from .memory import check_memory
from .tasks import Task

__all__ = ["LAMBDA_VECTORS", "adapt_model", "build_run_model", "check_fits", "check_backends", "backend_key"]


#: the re-parameterised λ vectors of a differential attention layer (Ye et al. 2024, eq. 2)
LAMBDA_VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def adapt_model(model: nn.Module, m: ModelConfig) -> nn.Module:
    """``model`` cast to ``m.dtype`` (a :class:`~diffattn.train.config.ModelConfig`), its λ vectors frozen with
    ``m.freeze_lambda``, and with ``m.lora`` wrapped in peft LoRA (``lora_r``, ``lora_alpha``, ``lora_targets``, no
    dropout), which freezes every other weight: the λ vectors then train beside LoRA unless frozen."""
    model = model.to(getattr(torch, m.dtype))
    if m.lora:
        from peft import LoraConfig, get_peft_model

        names = sorted({n.rsplit(".", 1)[-1] for n, mod in model.named_modules() if isinstance(mod, nn.Linear)})
        if not set(m.lora_targets) & set(names):
            raise UsageError(f"model.lora_targets {list(m.lora_targets)} name no linear layer of the model; its "
                             f"linear layers are {', '.join(names)}")
        model = get_peft_model(model, LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha,
                                                 target_modules=list(m.lora_targets), lora_dropout=0.0))
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] in LAMBDA_VECTORS:
            p.requires_grad_(not m.freeze_lambda)
    return model


def _released_overrides(m: ModelConfig) -> dict:
    """The keyword arguments of :func:`~diffattn.factory.load_released` that ``model.overrides`` sets for a released
    checkpoint: ``backend`` from ``model.overrides.attention.backend`` (or the deprecated ``model.overrides.backend``
    of before, with its FutureWarning); validation (:func:`~diffattn.train.config.validate`) allows nothing else."""
    o = m.overrides
    if "backend" in o:
        warn_deprecated("model.overrides.backend", detail=f"model.overrides.attention.backend (--set "
                                                          f"model.overrides.attention.backend={o['backend']})")
        return {"backend": o["backend"]}
    attention = o.get("attention") or {}
    return {"backend": attention["backend"]} if "backend" in attention else {}


def build_run_model(task: Task, m: ModelConfig) -> nn.Module:
    """The run's model: the task's own (:meth:`~diffattn.train.tasks.Task.own_model`), or else the ``model:``
    section ``m`` through the factory: ``model.name`` with ``model.overrides`` (:func:`diffattn.factory.create_model`)
    or the released checkpoint ``model.pretrained`` (:func:`diffattn.factory.load_released`), then cast to
    ``model.dtype``, λ frozen (``model.freeze_lambda``) and peft LoRA (``model.lora``) on top
    (:func:`adapt_model`)."""
    model = task.own_model()
    if model is not None:
        return model
    if m.pretrained:
        model, _ = load_released(task.pretrained_dir(), **_released_overrides(m))
    else:
        model = create_model(m.name, **m.overrides)
    return adapt_model(model, m)


def check_fits(task: Task, m: ModelConfig, env: DistEnv, what: str) -> None:
    """Refuse, before any weight is allocated, a model whose weights, gradients and AdamW states cannot fit in the
    memory available (:func:`~diffattn.train.memory.check_memory`, with the task's ``extra_host_bytes``: a
    retrofit's copy of its base). The model is built on the ``meta`` device (shapes only); a model that cannot be
    built there is not checked here. ``what`` names the config keys that set the model's size."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = build_run_model(task, m)
    except ValueError:  # what the user gave is wrong: say so now, before the real build allocates the weights
        raise
    except Exception:  # noqa: BLE001 - a model that cannot be built on the meta device is not checked
        return
    extra = getattr(task, "extra_host_bytes", lambda model: 0)(meta)
    check_memory(meta, env.device, what, extra)


def check_backends(model: torch.nn.Module, device: torch.device, what: str) -> None:
    """Refuse attention layers whose ``backend`` cannot run on ``device``: ``triton`` needs CUDA and the triton
    package. ``what`` names the config key that sets the backend."""
    if not any(getattr(m, "backend", None) == "triton" for m in model.modules()):
        return
    if device.type != "cuda":
        raise UsageError(f"{what} 'triton' (the fused GPU kernel) needs a CUDA device, but the run is on {device}; "
                         f"use 'auto', 'sdpa' or 'math', or --device cuda")
    if importlib.util.find_spec("triton") is None:
        raise UsageError(f"{what} 'triton' needs the triton package (pip install triton); use 'auto', 'sdpa' or "
                         f"'math'")


def backend_key(m: ModelConfig) -> str:
    """The config key that sets the attention backend of the ``model:`` section ``m``, for messages:
    ``model.overrides.attention.backend`` whichever spelling set it (the loose ``model.overrides.backend`` of
    before warns where it is converted)."""
    o = m.overrides
    if "backend" in o or (isinstance(o.get("attention"), dict) and "backend" in o["attention"]):
        return "model.overrides.attention.backend"
    return f"the attention backend of model {m.name!r} (model.overrides.attention.backend)"
