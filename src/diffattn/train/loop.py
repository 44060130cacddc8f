"""The training loop: one loop body, every task, one process or torchrun.

    cfg = load_config("tiny/clip", ["optim.lr=3e-4"])
    train(cfg, out="runs/clip", resume="auto")

:func:`train` runs a recipe into a run directory, with checkpoints; its :class:`Trainer` is in parts with one job
each (setup and checks, restore, the run directory, the loop, validation, checkpoints, the final save), and each
part's rules live in their own module: the optimizer step and the loop body (:mod:`~diffattn.train.step`:
:func:`~diffattn.train.step.run_steps`, which :func:`~diffattn.train.step.fit` shares), the run's model and its
checks (:mod:`~diffattn.train.build`, :mod:`~diffattn.train.memory`), the resume arithmetic
(:mod:`~diffattn.train.resume`), the run directory (:mod:`~diffattn.train.rundir`), the log
(:class:`~diffattn.train.runlog.RunLog`) and the checkpoints (:mod:`~diffattn.train.checkpoint`). The task (the
loss, the post-step hook, the validation, the data) is the registered :class:`~diffattn.train.tasks.Task` of
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

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..deprecations import moved_attribute
from ..errors import UsageError, user_input
from ..extras import require
from . import build, memory, runlog, step
from .build import backend_key, build_run_model, check_backends, check_fits
from .checkpoint import find_resume, full_state, gather_rng, load_full_state, rng_state, save_checkpoint, set_rng_state
from .config import TrainConfig, config_digest, val_metric
from .data import StepBatchSampler, steps_for
from .data import to_device as _to
from .distributed import DistEnv, all_reduce_mean, barrier, init_distributed, reduce_ignored_grads, wrap_model
from .optim import EMA, build_optimizer, build_scheduler
from .resume import check_resume, extend_schedule
from .rundir import check_run_dir, prepare_run_dir, write_run_config
from .runlog import RunLog, last_logged_loss
from .step import run_steps
from .tasks import build_task

__all__ = ["train", "Trainer", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators with ``seed`` (numpy's modulo 2³²)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _precision(cfg: TrainConfig, env: DistEnv) -> torch.dtype | None:
    """The autocast dtype: ``auto`` is bf16 on CUDA and fp32 (no autocast) on CPU."""
    p = cfg.run.precision
    if p == "auto":
        p = "bf16" if env.device.type == "cuda" else "fp32"
    if p == "fp16" and env.device.type != "cuda":
        raise ValueError("run.precision 'fp16' needs CUDA; use 'fp32' or 'bf16' on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[p]


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
        model_sd, _ = full_state(model, optimizer)
        if env.is_main:
            full = build_run_model(task, cfg.model)
            full.load_state_dict(model_sd)
            task.save_best(full, run_dir, record)
    elif env.is_main:
        task.save_best(model, run_dir, record)
    barrier()


class Trainer:
    """One run of :func:`train`, in parts: :meth:`setup` (every check, the model built once, the data, the resume
    point), :meth:`restore` (optimizer, scheduler, EMA; a checkpoint's state or per-rank seeds),
    :meth:`open_run_dir`, :meth:`loop` (the loop body of :func:`~diffattn.train.step.run_steps`, then per step
    :meth:`after_step`: :class:`~diffattn.train.runlog.RunLog`, :meth:`validate`, :meth:`checkpoint`),
    :meth:`save_final` and :meth:`result`."""

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
            check_backends(self.model, env.device, backend_key(cfg.model))
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
                self.planned = check_resume(self.ckpt, cfg, env, self.ckpt_path, len(self.dataset), self.total)
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
        final_loss = last_logged_loss(self.run_dir / "metrics.jsonl")
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
        load_full_state(model, self.optimizer, ckpt["model"], ckpt["optimizer"])
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
        extend_schedule(self.optimizer, self.scheduler, start, total, self.cfg)
        self.say(f"extended the run from {self.planned} to {total} steps: from step {start + 1} on the lr follows the "
                 f"warm-up + cosine schedule of a {total}-step run (lr {self.optimizer.param_groups[0]['lr']:.3g} at "
                 f"step {start + 1}); the first {start} steps are unchanged")
        if self.env.is_main and (self.run_dir / "eval").is_dir():
            self.say(f"{self.run_dir / 'eval'} holds the evaluation of the step-{start} model; run diffattn eval "
                     f"again after this run")

    def open_run_dir(self) -> None:
        """Rank 0 creates (or, with ``overwrite``, replaces) the run directory and writes what the run needs to be
        rebuilt (``config.yaml``, the task's initial files); a fresh start drops the previous logs and ``best/``
        (:func:`~diffattn.train.rundir.prepare_run_dir`)."""
        barrier()  # every rank has checked the run directory before rank 0 changes it
        run_dir = self.run_dir
        if self.env.is_main:
            if prepare_run_dir(run_dir, overwrite=self.overwrite, fresh=not self.start):
                self.say(f"replaced the previous run in {run_dir} (--overwrite)")
            self.task.save_initial(self.model, run_dir)
            write_run_config(run_dir, self.cfg)
        self.log = RunLog(self.cfg, self.env, run_dir, self.sampler.steps_per_epoch)
        self.log.open(self.start, self.total)

    # -------------------------------------------------------------------------------------------- loop

    def loop(self) -> None:
        """Steps ``start`` … ``total − 1`` through :func:`~diffattn.train.step.run_steps`: micro-batches under
        autocast, DDP's sync on the last, gradients of parameters no rank used reduced, the task's post-step hook,
        the EMA."""
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
        model_sd, optim_sd = full_state(self.model, self.optimizer)
        rngs = gather_rng(self.env)
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
            model_sd, _ = full_state(model, self.optimizer)
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
    cosine schedule of a run planned for the new total (:func:`~diffattn.train.resume.extend_schedule`). Any other
    config key that differs from the checkpoint's is refused, each one named with its old and new value
    (:func:`~diffattn.train.resume.check_resume`).

    The parts are :class:`Trainer`'s methods, in this order; :func:`~diffattn.train.step.fit` shares its loop body
    (:func:`~diffattn.train.step.run_steps`).

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


#: the public names this module held before they moved to the module of their part
__getattr__ = moved_attribute(__name__, {
    "fit": lambda: step.fit, "run_steps": lambda: step.run_steps, "optimizer_step": lambda: step.optimizer_step,
    "RunLog": lambda: runlog.RunLog, "training_bytes": lambda: memory.training_bytes,
    "check_fits": lambda: build.check_fits, "check_backends": lambda: build.check_backends,
    "build_run_model": lambda: build.build_run_model, "LAMBDA_VECTORS": lambda: build.LAMBDA_VECTORS,
})
