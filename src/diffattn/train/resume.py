"""Resume arithmetic: whether a checkpoint may continue this config, the step budget it was planned for, and the lr
schedule of a run whose budget changed.

    planned = check_resume(ckpt, cfg, env, path, len(dataset), total)   # refuses another config or world size
    ...                                                                 # the checkpoint's state loaded
    if planned != total:
        extend_schedule(optimizer, scheduler, int(ckpt["step"]), total, cfg)

Only the step budget (:data:`~diffattn.train.config.BUDGET_KEYS`: ``run.steps``, ``run.epochs``) may differ between
a checkpoint and the config that resumes it. A changed budget extends (or shortens) the run: the steps before the
checkpoint stay as they were, and from its step on the lr is that of a run planned for the new total.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from .config import BUDGET_KEYS, TrainConfig, config_digest, digest_hash
from .data import steps_for
from .distributed import DistEnv
from .optim import warmup_cosine

__all__ = ["check_resume", "extend_schedule", "flat"]


def flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (empty dicts stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume(ckpt: dict, cfg: TrainConfig, env: DistEnv, path: Path, n_samples: int, total: int) -> int:
    """Refuse a checkpoint of another world size or another config, naming every differing key (old → new), and
    one past the step budget ``total`` of ``cfg`` (a resumed run can only be extended); the step budget
    (:data:`~diffattn.train.config.BUDGET_KEYS`) may differ. Returns the total steps the checkpoint's run was
    planned for, over ``n_samples`` training samples (:func:`~diffattn.train.data.steps_for`)."""
    if ckpt["world_size"] != env.world_size:
        raise UsageError(f"checkpoint {path} was written by {ckpt['world_size']} processes, this run has "
                         f"{env.world_size}; resume with the same world size (the RNG states are per rank)")
    mine, theirs = config_digest(cfg), config_digest(ckpt["config"])
    old_run = dict(theirs.get("run", {}))
    for d in (mine, theirs):
        for section, key in BUDGET_KEYS:
            d.get(section, {}).pop(key, None)
    if digest_hash(mine) != digest_hash(theirs):
        new, old = flat(mine), flat(theirs)
        missing = "(unset)"
        diffs = [f"{k} {old.get(k, missing)!r} → {new.get(k, missing)!r}" for k in sorted(set(new) | set(old))
                 if old.get(k, missing) != new.get(k, missing)]
        raise UsageError(f"checkpoint {path} was trained with another config: {'; '.join(diffs)}; only the step "
                         f"budget (run.steps, run.epochs) may change when resuming: set these keys back, or train "
                         f"the new config with --overwrite (replaces the run) or into another --out")
    planned = dataclasses.replace(cfg.run, steps=old_run.get("steps"), epochs=old_run.get("epochs"))
    planned_total = steps_for(planned, n_samples)
    if int(ckpt["step"]) > total:
        raise UsageError(f"the step budget is {total} steps, but checkpoint {path} is at step {ckpt['step']}; a "
                         f"resumed run can only be extended: give run.steps >= {ckpt['step']}")
    return planned_total


def extend_schedule(optimizer: torch.optim.Optimizer, scheduler, start: int, total: int, cfg: TrainConfig) -> None:
    """After loading a checkpoint planned for another total: the lr of every step from ``start`` (0-based) on is
    ``base_lr · warmup_cosine(step, total, …)`` (:func:`~diffattn.train.optim.warmup_cosine`), what a run planned
    for ``total`` steps has at that step. The scheduler's closure already holds the new total; only the lr the
    optimizer kept from the old schedule is set."""
    factor = warmup_cosine(start, total, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio)
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * factor
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
