"""The memory check of a run: what training a model needs at least, against what the machine and the GPU have.

    n, weights, need = training_bytes(model)      # parameters, weight bytes, bytes to train with AdamW
    check_memory(meta_model, torch.device("cuda"), "model.overrides")

Only shapes and dtypes are read, so the model may live on the ``meta`` device: the trainer checks before any weight is
allocated (:func:`diffattn.train.build.check_fits` builds the run's model there and calls :func:`check_memory`).
"""

from __future__ import annotations

import os

import torch

from ..errors import UsageError
from ..utils import available_memory, format_bytes

__all__ = ["training_bytes", "check_memory"]


def training_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(parameters, weight bytes, bytes to train)`` of ``model``: the bytes to train are every weight, plus a
    gradient and AdamW's two moment estimates (Loshchilov & Hutter 2019) per trainable weight, each in the weight's
    dtype. Activations are not counted: this is the least a training run needs. Reads only shapes and dtypes, so
    it works on a model built on the ``meta`` device."""
    params = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    weights = sum(p.numel() * p.element_size() for p in params)
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return sum(p.numel() for p in params), weights, weights + 3 * trained


def check_memory(model: torch.nn.Module, device: torch.device, what: str, extra_host_bytes: int = 0) -> None:
    """Refuse ``model`` when its weights, gradients and AdamW states (:func:`training_bytes`) cannot fit in the
    memory available: the machine's (/proc/meminfo, the cgroup's limit; shared by the ``LOCAL_WORLD_SIZE``
    processes torchrun starts on it) and, on CUDA, the GPU's. A CUDA model is built on the CPU, then moved: the
    machine then needs its weights only. ``extra_host_bytes``: what the run keeps besides on the machine (a
    retrofit's copy of its base). ``what`` names the config keys that set the model's size."""
    n, weights, need = training_bytes(model)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    on_gpu = device.type == "cuda"
    host = local * ((weights if on_gpu else need) + extra_host_bytes)
    checks = [("the machine", host, available_memory("cpu"))]
    if on_gpu:
        checks.append((f"GPU {device}", need, available_memory(device)))
    for where, bytes_, free in checks:
        if free is not None and bytes_ > free:
            procs = f" × {local} processes" if local > 1 and where == "the machine" else ""
            count = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
            base = ", and a copy of the base" if extra_host_bytes and where == "the machine" else ""
            raise UsageError(f"the model has {count} parameters and needs at least {format_bytes(bytes_)}{procs} to "
                             f"train (weights, gradients and AdamW's two states{base}), but {where} has "
                             f"{format_bytes(free)} available; make it smaller ({what}) or use a larger machine")
