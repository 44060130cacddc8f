"""The training loop: one loop body, every task, one process or torchrun.

    cfg = load_config("tiny/clip", ["optim.lr=3e-4"])
    train(cfg, out="runs/clip", resume="auto")

Every optimizer step of the package is taken by :func:`run_steps`: for :func:`train` (a recipe, a run directory,
checkpoints), whose :class:`Trainer` is in parts with one job each (setup and checks, restore, the run directory,
the loop, :class:`RunLog`, validation, checkpoints, the final save), and for :func:`fit` (a model, an optimizer, a
scheduler and batches a caller already holds: the retrofit study's loops, LLaVA's two stages). The task (the loss,
the post-step hook, the validation, the data) is the registered :class:`~diffattn.train.tasks.Task` of
``task.name``; nothing here depends on which.

Per optimizer step: ``accum_steps`` micro-batches (forward under bf16 autocast on CUDA, fp32 on CPU; DDP syncs
gradients on the last one only), gradient clipping, AdamW, the warm-up + cosine lr, the task's post-step hook
(CLIP logit-scale clamp, retrofit λ schedule), the EMA; then the loss averaged over ranks is logged, and every
``ckpt_every`` steps a checkpoint is written. The batch order depends only on (seed, step), so a run resumed from
a checkpoint continues exactly where it stopped.

With ``eval.every`` the task's quick evaluation runs on the held-out split every that many steps (and at the last);
its metrics go to ``metrics.jsonl`` (rows ``{"step", "eval": {...}}``), TensorBoard (``val/*``) and the progress
bar, and the model with the best ``eval.metric`` so far is kept in ``best/``. The evaluation draws no random
numbers and the best value is part of the checkpoint, so a resumed run keeps the same ``best/``.

A run directory is never replaced by accident: training into one that already holds files needs ``resume``
(continue it) or ``overwrite`` (replace a previous run). Everything a user can get wrong (the config, the device,
a model too large for the machine's memory, an attention backend the device cannot run, the data, the resume
point, data that do not fit the model) is checked before the directory is created or touched, and reported as a
:class:`~diffattn.errors.UsageError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader

from ..errors import RunExistsError, UsageError, user_input
from ..extras import require
from ..factory import create_model, load_released
from ..io import atomic_write_file, remove_dir
from ..layers.blocks import warn_loose
from ..progress import progress
from ..utils import available_memory, format_bytes
from .checkpoint import find_resume, rng_state, save_checkpoint, set_rng_state
from .config import BUDGET_KEYS, ModelConfig, TrainConfig, config_digest, digest_hash, run_config_dict, val_metric
from .data import StepBatchSampler, steps_for
from .data import to_device as _to
from .distributed import DistEnv, all_reduce_mean, barrier, init_distributed, reduce_ignored_grads, wrap_model
from .optim import EMA, build_optimizer, build_scheduler, warmup_cosine
from .tasks import Task, build_task, mean_lambdas

__all__ = ["train", "fit", "run_steps", "Trainer", "RunLog", "optimizer_step", "seed_everything", "training_bytes",
           "check_fits", "check_backends", "build_run_model"]


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, params, grad_clip: float | None,
                   *, scaler: torch.amp.GradScaler | None = None,
                   after_step: Sequence[Callable[[torch.nn.Module], object]] = ()) -> torch.Tensor:
    """One optimizer step on the gradients already in ``params``: unscale (``scaler``), clip the global norm to
    ``grad_clip`` (None: no clipping), step, advance ``scheduler`` (None: none), then each ``after_step(model)``
    (the λ(t) schedule of a retrofit, CLIP's logit-scale clamp). Returns the gradient norm before clipping (0 when
    not clipped). The gradients are left in place; the caller zeroes them."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if grad_clip else torch.zeros(())
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    for hook in after_step:
        hook(model)
    return grad_norm


def run_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batches: Iterable[Any],
              loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], steps: Iterable[int], *, params,
              grad_clip: float | None, accum_steps: int = 1, scaler: torch.amp.GradScaler | None = None,
              autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
              no_sync: Callable[[], contextlib.AbstractContextManager] | None = None, check_finite: bool = False,
              before_step: Sequence[Callable[[torch.nn.Module], object]] = (),
              after_step: Sequence[Callable[[torch.nn.Module], object]] = (),
              on_step: Callable[[int, torch.Tensor, torch.Tensor, float], object] | None = None) -> None:
    """The one loop body of :func:`train` and :func:`fit`. Per step of ``steps`` (it stops early when
    ``batches`` runs out): zero the gradients; ``accum_steps`` micro-batches, each ``loss_fn(model, batch)`` under
    ``autocast()`` and backpropagated as ``loss / accum_steps`` (scaled by ``scaler``; every micro-batch but the
    last under ``no_sync()``: DDP's gradient sync); ``before_step`` hooks; :func:`optimizer_step` (clip the norm of
    ``params`` to ``grad_clip``, step, ``scheduler.step()``, ``after_step``); then ``on_step(step, mean loss of the
    micro-batches (a detached tensor), gradient norm, lr the step used)``. ``check_finite``: a loss that is not
    finite is a ``FloatingPointError`` naming the step."""
    batches = iter(batches)
    for step in steps:
        lr = optimizer.param_groups[0]["lr"]
        optimizer.zero_grad(set_to_none=True)
        loss_sum = None
        for a in range(accum_steps):
            try:
                batch = next(batches)
            except StopIteration:
                if a == 0:
                    return
                raise
            sync = no_sync is None or a == accum_steps - 1
            with contextlib.nullcontext() if sync else no_sync():
                with autocast():
                    loss = loss_fn(model, batch)
                if check_finite and not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step + 1}; lower optim.lr or "
                                             f"raise optim.warmup_steps")
                scaled = loss / accum_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        for hook in before_step:
            hook(model)
        grad_norm = optimizer_step(model, optimizer, scheduler, params, grad_clip, scaler=scaler,
                                   after_step=after_step)
        if on_step is not None:
            on_step(step, loss_sum / accum_steps, grad_norm, lr)


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batches: Iterable[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *, grad_clip: float | None = 1.0,
        params: Sequence[torch.nn.Parameter] | None = None,
        after_step: Sequence[Callable[[torch.nn.Module], object]] = (),
        log: Callable[[str], object] | None = None, log_every: int = 50, desc: str = "step",
        total: int | None = None) -> list[float]:
    """One optimizer step per batch of ``batches``, in one process, without a run directory: per batch,
    ``loss = loss_fn(model, batch)``, zero the gradients, backpropagate, then :func:`optimizer_step` (clip the norm
    of ``params`` — default: the parameters that require grad — to ``grad_clip``, step, ``scheduler.step()``,
    ``after_step``). The model is put in train mode first. Returns the loss of every step; ``log`` gets
    ``"{desc} {k}/{total} loss {x}"`` every ``log_every`` steps (``total``: default ``len(batches)`` if it has one).

    The loop body is :func:`train`'s (:func:`run_steps`), without what a run adds (accumulation, autocast, DDP,
    checkpoints), for callers that draw their own batches: the retrofit study, LLaVA's stages
    (:func:`diffattn.train.llava.train_llava`)."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a callable (model, batch) -> loss, got {type(loss_fn).__name__}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip must be None or > 0, got {grad_clip!r}")
    params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    if total is None and hasattr(batches, "__len__"):
        total = len(batches)
    losses: list[float] = []

    def on_step(step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        losses.append(loss.item())
        if log is not None and len(losses) % log_every == 0:
            log(f"{desc} {len(losses)}{f'/{total}' if total is not None else ''} loss {losses[-1]:.4f}")

    model.train()
    run_steps(model, optimizer, scheduler, batches, loss_fn, itertools.count(), params=params, grad_clip=grad_clip,
              after_step=after_step, on_step=on_step)
    return losses


def _precision(cfg: TrainConfig, env: DistEnv) -> torch.dtype | None:
    """The autocast dtype: ``auto`` is bf16 on CUDA and fp32 (no autocast) on CPU."""
    p = cfg.run.precision
    if p == "auto":
        p = "bf16" if env.device.type == "cuda" else "fp32"
    if p == "fp16" and env.device.type != "cuda":
        raise ValueError("run.precision 'fp16' needs CUDA; use 'fp32' or 'bf16' on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[p]


def training_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(parameters, weight bytes, bytes to train)`` of ``model``: the bytes to train are every weight, plus a
    gradient and AdamW's two moment estimates (Loshchilov & Hutter 2019) per trainable weight, each in the weight's
    dtype. Activations are not counted: this is the least a training run needs. Reads only shapes and dtypes, so
    it works on a model built on the ``meta`` device."""
    params = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    weights = sum(p.numel() * p.element_size() for p in params)
    trained = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return sum(p.numel() for p in params), weights, weights + 3 * trained


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
    checkpoint: ``backend`` from ``model.overrides.attention.backend`` (or the loose ``model.overrides.backend`` of
    before, with its FutureWarning); validation (:func:`~diffattn.train.config.validate`) allows nothing else."""
    o = m.overrides
    if "backend" in o:
        warn_loose("model.pretrained", [f"model.overrides.backend={o['backend']!r}"],
                   f"model.overrides.attention.backend={o['backend']!r}")
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
    """Refuse, before any weight is allocated, a model whose weights, gradients and AdamW states
    (:func:`training_bytes`) cannot fit in the memory available: the machine's (/proc/meminfo, the cgroup's limit;
    shared by the processes torchrun starts on it) and, on CUDA, the GPU's. The model is built on the ``meta``
    device (shapes only); a model that cannot be built there is not checked here. ``what`` names the config keys
    that set the model's size."""
    import warnings

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = build_run_model(task, m)
    except ValueError:  # what the user gave is wrong: say so now, before the real build allocates the weights
        raise
    except Exception:  # noqa: BLE001 - a model that cannot be built on the meta device is not checked
        return
    n, weights, need = training_bytes(meta)
    extra = getattr(task, "extra_host_bytes", lambda m: 0)(meta)  # e.g. the retrofit's copy of its base
    del meta
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    on_gpu = env.device.type == "cuda"
    host = local * ((weights if on_gpu else need) + extra)  # a CUDA model is built on the CPU, then moved
    checks = [("the machine", host, available_memory("cpu"))]
    if on_gpu:
        checks.append((f"GPU {env.device}", need, available_memory(env.device)))
    for where, bytes_, free in checks:
        if free is not None and bytes_ > free:
            procs = f" × {local} processes" if local > 1 and where == "the machine" else ""
            count = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
            raise UsageError(f"the model has {count} parameters and needs at least {format_bytes(bytes_)}"
                             f"{procs} to train (weights, gradients and AdamW's two states"
                             f"{', and a copy of the base' if extra and where == 'the machine' else ''}), but "
                             f"{where} has {format_bytes(free)} available; make it smaller ({what}) or use a larger "
                             f"machine")


def check_backends(model: torch.nn.Module, device: torch.device, what: str) -> None:
    """Refuse attention layers whose ``backend`` cannot run on ``device``: ``triton`` needs CUDA and the triton
    package. ``what`` names the config key that sets the backend."""
    import importlib.util

    if not any(getattr(m, "backend", None) == "triton" for m in model.modules()):
        return
    if device.type != "cuda":
        raise UsageError(f"{what} 'triton' (the fused GPU kernel) needs a CUDA device, but the run is on {device}; "
                         f"use 'auto', 'sdpa' or 'math', or --device cuda")
    if importlib.util.find_spec("triton") is None:
        raise UsageError(f"{what} 'triton' needs the triton package (pip install triton); use 'auto', 'sdpa' or "
                         f"'math'")


def _full_state(model, optimizer) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts on CPU, keyed by parameter names (DDP and FSDP2 alike)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _load_full_state(model, optimizer, model_sd: dict, optim_sd: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True, strict=True))


def _gather_rng(env: DistEnv) -> list[dict]:
    state = rng_state()
    if not env.distributed:
        return [state]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, state)
    return out


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (empty dicts stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_resume(ckpt: dict, cfg: TrainConfig, env: DistEnv, path: Path, n_samples: int) -> int:
    """Refuse a checkpoint of another world size or another config, naming every differing key (old → new); the
    step budget (:data:`BUDGET_KEYS`) may differ. Returns the total steps the checkpoint's run was planned for."""
    if ckpt["world_size"] != env.world_size:
        raise UsageError(f"checkpoint {path} was written by {ckpt['world_size']} processes, this run has "
                         f"{env.world_size}; resume with the same world size (the RNG states are per rank)")
    mine, theirs = config_digest(cfg), config_digest(ckpt["config"])
    old_run = dict(theirs.get("run", {}))
    for d in (mine, theirs):
        for section, key in BUDGET_KEYS:
            d.get(section, {}).pop(key, None)
    if digest_hash(mine) != digest_hash(theirs):
        new, old = _flat(mine), _flat(theirs)
        missing = "(unset)"
        diffs = [f"{k} {old.get(k, missing)!r} → {new.get(k, missing)!r}" for k in sorted(set(new) | set(old))
                 if old.get(k, missing) != new.get(k, missing)]
        raise UsageError(f"checkpoint {path} was trained with another config: {'; '.join(diffs)}; only the step "
                         f"budget (run.steps, run.epochs) may change when resuming: set these keys back, or train "
                         f"the new config with --overwrite (replaces the run) or into another --out")
    planned = dataclasses.replace(cfg.run, steps=old_run.get("steps"), epochs=old_run.get("epochs"))
    return steps_for(planned, n_samples)


def _extend_schedule(optimizer: torch.optim.Optimizer, scheduler, start: int, total: int, cfg: TrainConfig) -> None:
    """After loading a checkpoint planned for another total: the lr of every step from ``start`` (0-based) on is
    ``base_lr · warmup_cosine(step, total, …)``, what a run planned for ``total`` steps has at that step. The
    scheduler's closure already holds the new total; only the lr the optimizer kept from the old schedule is set."""
    factor = warmup_cosine(start, total, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio)
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * factor
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric rows logged after ``step`` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    with atomic_write_file(path, "w") as f:
        f.write("".join(r + "\n" for r in rows))


def _validate(task, model, val_set, env: DistEnv, amp_dtype) -> dict[str, float]:
    """The task's validation of ``model`` on every rank (the same set, so FSDP2's collectives match), averaged
    over ranks so that every rank takes the same ``best/`` decision; the RNG states are left as they were."""
    state = rng_state()
    was_training = model.training
    model.eval()
    try:
        scores = task.validate(model, val_set, env.device, amp_dtype)
    finally:
        model.train(was_training)
        set_rng_state(state)
    keys = sorted(scores)
    mean = all_reduce_mean(torch.tensor([scores[k] for k in keys], dtype=torch.float64, device=env.device))
    return {k: float(v) for k, v in zip(keys, mean.tolist())}


def _save_best(task, model, optimizer, cfg: TrainConfig, env: DistEnv, run_dir: Path, record: dict) -> None:
    """``best/`` from rank 0 (FSDP2 gathers the full weights into a fresh model first, on every rank)."""
    if cfg.run.distributed == "fsdp2" and env.distributed:
        model_sd, _ = _full_state(model, optimizer)
        if env.is_main:
            full = build_run_model(task, cfg.model)
            full.load_state_dict(model_sd)
            task.save_best(full, run_dir, record)
    elif env.is_main:
        task.save_best(model, run_dir, record)
    barrier()


def _last_logged_loss(path: Path) -> float:
    """The training loss of the last row of ``metrics.jsonl`` (NaN when there is none)."""
    if not path.is_file():
        return math.nan
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [r["loss"] for r in rows if "loss" in r]
    return float(losses[-1]) if losses else math.nan


def _backend_key(cfg: TrainConfig) -> str:
    """The config key that sets the model's attention backend, for messages: ``model.overrides.attention.backend``
    whichever spelling set it (the loose ``model.overrides.backend`` of before warns where it is converted)."""
    o = cfg.model.overrides
    if "backend" in o or (isinstance(o.get("attention"), dict) and "backend" in o["attention"]):
        return "model.overrides.attention.backend"
    return f"the attention backend of model {cfg.model.name!r} (model.overrides.attention.backend)"


def check_run_dir(run_dir: Path, resume: str | None, overwrite: bool) -> None:
    """Refuse to train into ``run_dir`` when that would replace files by accident: it holds anything and neither
    ``resume`` nor ``overwrite`` is given; ``overwrite`` of a directory that is not a run (no ``config.yaml``);
    ``resume`` together with ``overwrite``; a file where the directory should be."""
    if resume is not None and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: continue the run, or replace it")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"run directory {str(run_dir)!r} is a file; give --out a folder")
    if resume is not None or not run_dir.is_dir():
        return
    entries = sorted(p.name for p in run_dir.iterdir())
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:4]) + (", …" if len(entries) > 4 else "")
        raise RunExistsError(f"run directory {str(run_dir)!r} is not empty ({shown}); continue the run with "
                             f"--resume auto, replace it with --overwrite, or choose another --out")
    leftovers = all(e.startswith(".") and e.endswith(".tmp") for e in entries)  # a run killed before config.yaml
    if not (run_dir / "config.yaml").is_file() and not leftovers:
        raise UsageError(f"--overwrite replaces a previous run, but {str(run_dir)!r} holds no config.yaml (it is not a "
                         f"run directory) and is not empty; choose another --out")


class RunLog:
    """Where a run reports (rank 0 writes, every rank may call): ``metrics.jsonl``, TensorBoard, the progress bar
    and the end-of-epoch line."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, run_dir: Path, steps_per_epoch: int) -> None:
        self.cfg, self.env, self.path, self.spe = cfg, env, run_dir / "metrics.jsonl", steps_per_epoch
        self.writer = self.bar = None
        self.postfix: dict[str, str] = {}
        self.epoch_losses: list[float] = []

    def open(self, start: int, total: int) -> None:
        """Drop rows logged after ``start`` (a fresh run: all of them), open TensorBoard and the progress bar."""
        if self.env.is_main:
            from torch.utils.tensorboard import SummaryWriter

            if start:
                _truncate_metrics(self.path, start)
            elif self.path.exists():
                self.path.unlink()
            self.writer = SummaryWriter(str(self.path.parent / "tensorboard"), purge_step=start + 1)
        self.start = start
        self.bar = progress(total=total, initial=start, disable=not (self.env.is_main and self.cfg.run.progress),
                            unit="step", desc="train")
        self.t_epoch = self.t_log = time.perf_counter()

    def _write(self, row: dict, scalars: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, row["step"])

    def step(self, done: int, total: int, loss: float, lr: float, grad_norm: torch.Tensor, model) -> None:
        """After optimizer step ``done``: the progress bar; every ``run.log_every`` steps (and at the last) a row
        of ``metrics.jsonl``; at the end of an epoch its mean loss, throughput and λ."""
        run = self.cfg.run
        self.epoch_losses.append(loss)
        self.bar.update(1)
        if done % run.log_every == 0 or done == total:
            now = time.perf_counter()
            n_steps = min(run.log_every, done - self.start) if done % run.log_every == 0 else \
                (done - self.start) % run.log_every or run.log_every
            row = {"step": done, "epoch": round(done / self.spe, 4), "loss": loss, "lr": lr,
                   "grad_norm": float(grad_norm), "samples_per_s": round(n_steps * run.batch_size /
                                                                         max(now - self.t_log, 1e-9), 2)}
            self.t_log = now
            lams = mean_lambdas(model) if self.env.is_main and run.distributed != "fsdp2" else []
            if lams:
                row["lambda"] = lams
            if self.env.is_main:
                self._write(row, {**{f"train/{k}": row[k] for k in ("loss", "lr", "grad_norm", "samples_per_s")},
                                  **{f"lambda/layer_{i}": v for i, v in enumerate(lams)}})
                self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", sps=row["samples_per_s"], **self.postfix)
        if done % self.spe == 0 and self.env.is_main:
            dt = time.perf_counter() - self.t_epoch
            lams = mean_lambdas(model) if run.distributed != "fsdp2" else []
            self.bar.write(f"epoch {done // self.spe}: loss {sum(self.epoch_losses) / len(self.epoch_losses):.4f}  "
                           f"lr {lr:.2e}  {len(self.epoch_losses) * run.batch_size / dt:.1f} samples/s  {dt:.1f} s"
                           + (f"  λ {lams}" if lams else ""))
            self.epoch_losses, self.t_epoch = [], time.perf_counter()

    def eval(self, done: int, scores: dict[str, float], metric: str, loss: float, lr: float) -> None:
        if self.env.is_main:
            self._write({"step": done, "eval": scores}, {f"val/{k}": v for k, v in scores.items()})
            self.postfix = {f"val_{metric}": f"{scores[metric]:.4f}"}
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", **self.postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


class Trainer:
    """One run of :func:`train`, in parts: :meth:`setup` (every check, the model built once, the data, the resume
    point), :meth:`restore` (optimizer, scheduler, EMA; a checkpoint's state or per-rank seeds),
    :meth:`open_run_dir`, :meth:`loop` (the loop body of :func:`run_steps`, then per step :meth:`after_step`:
    :class:`RunLog`, :meth:`validate`, :meth:`checkpoint`), :meth:`save_final` and :meth:`result`."""

    def __init__(self, cfg: TrainConfig, out: str | os.PathLike | None = None, resume: str | None = None, *,
                 overwrite: bool = False) -> None:
        self.env = init_distributed(cfg.run.device)
        self.run_dir = Path(out if out is not None else cfg.run.out)
        self.cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, out=str(self.run_dir)))  # what runs
        self.resume, self.overwrite = resume, overwrite
        self.losses: list[float] = []
        self.ema = self.best = None

    def say(self, msg: str) -> None:
        if self.env.is_main:
            print(msg, file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------- setup

    def setup(self) -> None:
        """Everything a user can get wrong, checked before the run directory is created or touched; the model is
        built once (the same initial weights on every rank, seeded identically), its data read after it."""
        cfg, env = self.cfg, self.env
        check_run_dir(self.run_dir, self.resume, self.overwrite)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.ema_decay is not None and cfg.run.distributed == "fsdp2" and env.distributed:
            raise UsageError("run.ema_decay is not supported with run.distributed 'fsdp2' (the weights are sharded)")
        with user_input():
            self.amp_dtype = _precision(cfg, env)
            self.task = task = build_task(cfg)
            check_fits(task, cfg.model, env, task.size_keys)
            seed_everything(cfg.run.seed)
            self.model = build_run_model(task, cfg.model).to(env.device)
            check_backends(self.model, env.device, _backend_key(cfg))
            self.dataset = task.dataset(self.model)
            task.check_data(self.model, self.dataset)
            self.val_set = None
            if cfg.eval.every is not None:
                with user_input("eval: "):
                    self.val_set = task.val_dataset(self.model)
            self.total = steps_for(cfg.run, len(self.dataset))
            self.sampler = StepBatchSampler(len(self.dataset), cfg.run.batch_size, world_size=env.world_size,
                                            rank=env.rank, accum_steps=cfg.run.accum_steps, seed=cfg.run.seed,
                                            start_step=0, total_steps=self.total)
            self.ckpt_path, self.ckpt, skipped = find_resume(self.resume, self.run_dir)
            self.planned = self.total
            if self.ckpt is not None:
                self.planned = _check_resume(self.ckpt, cfg, env, self.ckpt_path, len(self.dataset))
                if int(self.ckpt["step"]) > self.total:
                    raise UsageError(f"the step budget is {self.total} steps, but checkpoint {self.ckpt_path} is at "
                                     f"step {self.ckpt['step']}; a resumed run can only be extended: give run.steps >= "
                                     f"{self.ckpt['step']}")
        for path, why in skipped:
            self.say(f"skipped checkpoint {path}: {why}")
        self.start = int(self.ckpt["step"]) if self.ckpt is not None else 0
        self.best = self.ckpt.get("best") if self.ckpt is not None else None  # {"step", "metric", "value"} of best/

    @property
    def finished(self) -> bool:
        return self.start >= self.total

    def finish(self) -> dict[str, Any]:
        """A finished run: nothing to train; the final model is saved if a kill prevented it."""
        self.model.load_state_dict(self.ckpt["model"])
        final_loss = _last_logged_loss(self.run_dir / "metrics.jsonl")
        if self.env.is_main and not self.task.final_saved(self.run_dir):
            self.task.save_final(self.model, self.run_dir)
        self.say(f"{self.run_dir} already finished at step {self.start} of {self.total}; nothing to train")
        barrier()
        return {"run_dir": str(self.run_dir), "steps": self.total, "final_loss": final_loss, "losses": [],
                "resumed_from": self.start, "finished": True}

    # ------------------------------------------------------------------------------------------ resume

    def restore(self) -> None:
        """The optimizer, lr schedule, loss scaler and EMA; then a checkpoint's state (extending its schedule when
        the step budget changed), or, for a new run, each rank seeded differently (dropout, mixup, augmentation)."""
        cfg, env, model, ckpt = self.cfg, self.env, self.model, self.ckpt
        self.ddp_model = wrap_model(model, env, cfg.run.distributed)  # FSDP2 shards ``model`` in place
        mode = cfg.run.compile if isinstance(cfg.run.compile, str) else None  # e.g. "reduce-overhead": CUDA graphs
        self.fwd_model = torch.compile(self.ddp_model, mode=mode) if cfg.run.compile else self.ddp_model
        self.optimizer = build_optimizer(model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.total)
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.amp_dtype is torch.float16)
        self.ema = EMA(model, cfg.run.ema_decay) if cfg.run.ema_decay is not None else None
        if ckpt is None:
            seed_everything(cfg.run.seed + 1_000_003 * env.rank + 1)
            return
        _load_full_state(model, self.optimizer, ckpt["model"], ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(ckpt["ema"])
        set_rng_state(ckpt["rng"][env.rank])
        self.ckpt = None
        self.say(f"resumed from step {self.start} of {self.total} ({self.ckpt_path})")
        if self.planned != self.total:
            self._extend()

    def _extend(self) -> None:
        start, total = self.start, self.total
        _extend_schedule(self.optimizer, self.scheduler, start, total, self.cfg)
        self.say(f"extended the run from {self.planned} to {total} steps: from step {start + 1} on the lr follows the "
                 f"warm-up + cosine schedule of a {total}-step run (lr {self.optimizer.param_groups[0]['lr']:.3g} at "
                 f"step {start + 1}); the first {start} steps are unchanged")
        if self.env.is_main and (self.run_dir / "eval").is_dir():
            self.say(f"{self.run_dir / 'eval'} holds the evaluation of the step-{start} model; run diffattn eval "
                     f"again after this run")

    def open_run_dir(self) -> None:
        """Rank 0 creates (or, with ``overwrite``, replaces) the run directory and writes what the run needs to be
        rebuilt (``config.yaml``, the task's initial files); a fresh start drops the previous logs and ``best/``."""
        barrier()  # every rank has checked the run directory before rank 0 changes it
        run_dir = self.run_dir
        if self.env.is_main:
            import yaml

            if self.overwrite and run_dir.is_dir():
                remove_dir(run_dir)
                self.say(f"replaced the previous run in {run_dir} (--overwrite)")
            run_dir.mkdir(parents=True, exist_ok=True)
            self.task.save_initial(self.model, run_dir)
            with atomic_write_file(run_dir / "config.yaml", "w") as f:
                yaml.safe_dump(run_config_dict(self.cfg), f, sort_keys=False)
            for stale in ("tensorboard", "best"):  # a fresh start (resume auto without a checkpoint)
                if not self.start and (run_dir / stale).is_dir():
                    remove_dir(run_dir / stale)
        self.log = RunLog(self.cfg, self.env, run_dir, self.sampler.steps_per_epoch)
        self.log.open(self.start, self.total)

    # -------------------------------------------------------------------------------------------- loop

    def loop(self) -> None:
        """Steps ``start`` … ``total − 1`` through :func:`run_steps`: micro-batches under autocast, DDP's sync on
        the last, gradients of parameters no rank used reduced, the task's post-step hook, the EMA."""
        cfg, env = self.cfg, self.env
        self.sampler.start_step = self.start
        loader = DataLoader(self.dataset, batch_sampler=self.sampler, num_workers=cfg.data.num_workers,
                            pin_memory=env.device.type == "cuda")
        batches = (_to(b, env.device) for b in loader)
        amp = self.amp_dtype
        self.model.train()
        run_steps(self.fwd_model, self.optimizer, self.scheduler, batches, self.task.loss,
                  range(self.start, self.total), params=list(self.model.parameters()), grad_clip=cfg.optim.grad_clip,
                  accum_steps=cfg.run.accum_steps, scaler=self.scaler, check_finite=True,
                  autocast=lambda: torch.autocast(env.device.type, dtype=amp, enabled=amp is not None),
                  no_sync=getattr(self.ddp_model, "no_sync", None),
                  before_step=[lambda _: reduce_ignored_grads(self.model)],
                  after_step=[lambda _: self.task.after_step(self.model),
                              *([lambda _: self.ema.update(self.model)] if self.ema is not None else [])],
                  on_step=self.after_step)
        self.log.close()

    def after_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        """Optimizer step ``step`` (0-based) is done: log its loss (averaged over ranks), validate, checkpoint."""
        done, total = step + 1, self.total
        step_loss = float(all_reduce_mean(loss))
        self.losses.append(step_loss)
        self.log.step(done, total, step_loss, lr, grad_norm, self.model)
        if self.val_set is not None and (done % self.cfg.eval.every == 0 or done == total):
            self.validate(done, step_loss, lr)
        if done % self.cfg.run.ckpt_every == 0 or done == total:
            self.checkpoint(done)

    def validate(self, done: int, loss: float, lr: float) -> None:
        """The task's validation (:func:`_validate`), logged; a new best (``eval.metric``) is saved to ``best/``."""
        metric, lower_better = val_metric(self.cfg)
        scores = _validate(self.task, self.model, self.val_set, self.env, self.amp_dtype)
        value = scores[metric]
        self.log.eval(done, scores, metric, loss, lr)
        best = self.best
        if best is None or (value < best["value"] if lower_better else value > best["value"]):
            self.best = {"step": done, "metric": metric, "value": value}
            _save_best(self.task, self.model, self.optimizer, self.cfg, self.env, self.run_dir, self.best)

    def checkpoint(self, done: int) -> None:
        """Everything an exact resume needs (weights, optimizer, schedule, scaler, EMA, every rank's RNG, best/),
        written atomically by rank 0 (:func:`~diffattn.train.checkpoint.save_checkpoint`)."""
        model_sd, optim_sd = _full_state(self.model, self.optimizer)
        rngs = _gather_rng(self.env)
        if self.env.is_main:
            save_checkpoint(self.run_dir, done, {
                "step": done, "world_size": self.env.world_size, "config": config_digest(self.cfg),
                "model": model_sd, "optimizer": optim_sd, "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(), "ema": self.ema.state_dict() if self.ema is not None else None,
                "rng": rngs, "best": self.best}, self.cfg.run.keep_last)
        barrier()

    # ------------------------------------------------------------------------------------------- final

    def save_final(self) -> None:
        """The final model (``save_pretrained``: ``diffattn eval RUN_DIR`` loads it; adapters only for retrofits) and
        the EMA's weights in ``ema/``; FSDP2 gathers the full weights into a fresh model first."""
        model, env = self.model, self.env
        final = model
        if self.cfg.run.distributed == "fsdp2" and env.distributed:
            model_sd, _ = _full_state(model, self.optimizer)
            final = build_run_model(self.task, self.cfg.model) if env.is_main else None
            if final is not None:
                final.load_state_dict(model_sd)
        if env.is_main:
            self.task.save_final(final, self.run_dir)
            if self.ema is not None:
                self.ema.copy_to(model)
                self.task.save_final(model, self.run_dir / "ema")
        barrier()

    def result(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "steps": self.total,
                "final_loss": self.losses[-1] if self.losses else math.nan, "losses": self.losses,
                "resumed_from": self.start, "extended_from": self.planned if self.planned != self.total else None}


def train(cfg: TrainConfig, out: str | os.PathLike | None = None, resume: str | None = None, *,
          overwrite: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into the run directory ``out`` (default ``cfg.run.out``).

    ``resume``: None (a new run: ``out`` must be empty or absent, unless ``overwrite`` replaces the previous run),
    ``"auto"`` (the newest intact checkpoint of ``out``; a new run if there is none) or a checkpoint / run
    directory. Returns ``{"run_dir", "steps", "final_loss", "losses", "resumed_from", "extended_from"}`` (losses of
    the steps this call trained, averaged over ranks; ``resumed_from`` is the step it started at; ``extended_from``
    the total the resumed run was planned for when ``run.steps`` / ``run.epochs`` changed it, else None).

    Resuming with another step budget (``run.steps`` or ``run.epochs``; a finished run included) extends the run:
    the steps before the checkpoint stay as they were, and from the checkpoint's step on the lr is the warm-up +
    cosine schedule of a run planned for the new total (:func:`_extend_schedule`). Any other config key that differs
    from the checkpoint's is refused, each one named with its old and new value.

    The parts are :class:`Trainer`'s methods, in this order; :func:`fit` shares its loop body (:func:`run_steps`).

    Raises:
        diffattn.extras.MissingExtraError: a package of the ``train`` extra is missing (nothing is written then).
    """
    require("train", "diffattn.train.train")
    trainer = Trainer(cfg, out, resume, overwrite=overwrite)
    trainer.setup()  # every check, the model (built once), the data, the resume point
    if trainer.finished:
        return trainer.finish()
    trainer.restore()  # optimizer, schedule, EMA; the checkpoint's state or per-rank seeds
    trainer.open_run_dir()
    trainer.loop()  # per step: run_steps' body, then log, validate, checkpoint
    trainer.save_final()
    return trainer.result()
