"""The training loop: one function, every task, one process or torchrun.

    cfg = load_config("tiny/clip", ["optim.lr=3e-4"])
    train(cfg, out="runs/clip", resume="auto")

Per optimizer step: ``accum_steps`` micro-batches (forward under bf16 autocast on CUDA, fp32 on CPU; DDP syncs
gradients on the last one only), gradient clipping, AdamW, the warm-up + cosine lr, the task's post-step hook
(CLIP logit-scale clamp, retrofit λ schedule), the EMA; then the loss averaged over ranks is logged, and every
``ckpt_every`` steps a checkpoint is written. The batch order depends only on (seed, step), so a run resumed from
a checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ..io import atomic_write_file
from .checkpoint import load_checkpoint, resolve_resume, rng_state, save_checkpoint, set_rng_state
from .config import TrainConfig, config_digest, digest_hash
from .data import StepBatchSampler, steps_for
from .distributed import DistEnv, all_reduce_mean, barrier, init_distributed, reduce_ignored_grads, wrap_model
from .optim import EMA, build_optimizer, build_scheduler
from .tasks import build_task, mean_lambdas

__all__ = ["train", "seed_everything"]


def seed_everything(seed: int) -> None:
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


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


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


def _check_resume(ckpt: dict, cfg: TrainConfig, env: DistEnv, path: Path) -> None:
    if ckpt["world_size"] != env.world_size:
        raise ValueError(f"checkpoint {path} was written by {ckpt['world_size']} processes, this run has "
                         f"{env.world_size}; resume with the same world size (the RNG states are per rank)")
    mine, theirs = config_digest(cfg), ckpt["config"]
    if digest_hash(mine) != digest_hash(theirs):
        diffs = [f"{s}.{k}: checkpoint {theirs.get(s, {}).get(k)!r} vs now {v!r}"
                 for s, sec in mine.items() for k, v in sec.items() if theirs.get(s, {}).get(k) != v]
        raise ValueError(f"checkpoint {path} is from another config; differing keys: {'; '.join(diffs)}")


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric rows logged after ``step`` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    with atomic_write_file(path, "w") as f:
        f.write("".join(r + "\n" for r in rows))


def train(cfg: TrainConfig, out: str | os.PathLike | None = None, resume: str | None = None) -> dict[str, Any]:
    """Train ``cfg`` into the run directory ``out`` (default ``cfg.run.out``); ``resume``: None, ``"auto"`` or a
    checkpoint / run directory. Returns ``{"run_dir", "steps", "final_loss", "losses"}`` (losses of this process's
    steps, averaged over ranks).

    Raises:
        diffattn.extras.MissingExtraError: a package of the ``train`` extra is missing (nothing is written then).
    """
    from ..extras import require

    require("train", "diffattn.train.train")
    env = init_distributed()
    run_dir = Path(out if out is not None else cfg.run.out)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    if cfg.run.ema_decay is not None and cfg.run.distributed == "fsdp2" and env.distributed:
        raise ValueError("run.ema_decay is not supported with run.distributed 'fsdp2' (the weights are sharded)")
    amp_dtype = _precision(cfg, env)

    # --- model, data, optimizer: the same initial weights on every rank (seeded identically)
    seed_everything(cfg.run.seed)
    task = build_task(cfg)
    model = task.build_model().to(env.device)
    dataset = task.dataset()
    total = steps_for(cfg.run, len(dataset))
    ddp_model = wrap_model(model, env, cfg.run.distributed)  # FSDP2 shards ``model`` in place and returns it
    fwd_model = torch.compile(ddp_model) if cfg.run.compile else ddp_model
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, total)
    scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype is torch.float16)
    ema = EMA(model, cfg.run.ema_decay) if cfg.run.ema_decay is not None else None

    # --- resume, or seed each rank differently for dropout / mixup / augmentation
    start = 0
    ckpt_path = resolve_resume(resume, run_dir)
    if ckpt_path is not None:
        ckpt = load_checkpoint(ckpt_path)
        _check_resume(ckpt, cfg, env, ckpt_path)
        _load_full_state(model, optimizer, ckpt["model"], ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        if ema is not None:
            ema.load_state_dict(ckpt["ema"])
        set_rng_state(ckpt["rng"][env.rank])
        start = int(ckpt["step"])
    else:
        seed_everything(cfg.run.seed + 1_000_003 * env.rank + 1)

    metrics_path = run_dir / "metrics.jsonl"
    writer = None
    if env.is_main:
        import yaml

        run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write_file(run_dir / "config.yaml", "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
        if start:
            _truncate_metrics(metrics_path, start)
        elif metrics_path.exists():
            metrics_path.unlink()
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start + 1)

    sampler = StepBatchSampler(len(dataset), cfg.run.batch_size, world_size=env.world_size, rank=env.rank,
                               accum_steps=cfg.run.accum_steps, seed=cfg.run.seed, start_step=start,
                               total_steps=total)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.data.num_workers,
                        pin_memory=env.device.type == "cuda")
    batches = iter(loader)
    spe = sampler.steps_per_epoch

    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=start, disable=not (env.is_main and cfg.run.progress), unit="step",
               dynamic_ncols=True, file=sys.stderr)
    losses: list[float] = []
    epoch_losses: list[float] = []
    t_epoch = t_log = time.perf_counter()
    A = cfg.run.accum_steps
    model.train()
    for step in range(start, total):
        lr = optimizer.param_groups[0]["lr"]
        loss_sum = torch.zeros((), device=env.device)
        for a in range(A):
            batch = _to(next(batches), env.device)
            sync = a == A - 1 or not hasattr(ddp_model, "no_sync")
            with contextlib.nullcontext() if sync else ddp_model.no_sync():
                with torch.autocast(env.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = task.loss(fwd_model, batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step + 1}; lower optim.lr or "
                                             f"raise optim.warmup_steps")
                scaler.scale(loss / A).backward()
            loss_sum += loss.detach()
        reduce_ignored_grads(model)
        scaler.unscale_(optimizer)
        grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                     if cfg.optim.grad_clip else torch.zeros(()))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        task.after_step(model)
        if ema is not None:
            ema.update(model)

        done = step + 1
        step_loss = float(all_reduce_mean(loss_sum / A))
        losses.append(step_loss)
        epoch_losses.append(step_loss)
        bar.update(1)
        if done % cfg.run.log_every == 0 or done == total:
            now = time.perf_counter()
            n_steps = min(cfg.run.log_every, done - start) if done % cfg.run.log_every == 0 else \
                (done - start) % cfg.run.log_every or cfg.run.log_every
            row = {"step": done, "epoch": round(done / spe, 4), "loss": step_loss, "lr": lr,
                   "grad_norm": float(grad_norm), "samples_per_s": round(n_steps * cfg.run.batch_size /
                                                                         max(now - t_log, 1e-9), 2)}
            t_log = now
            lams = mean_lambdas(model) if env.is_main and cfg.run.distributed != "fsdp2" else []
            if lams:
                row["lambda"] = lams
            if env.is_main:
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                for k in ("loss", "lr", "grad_norm", "samples_per_s"):
                    writer.add_scalar(f"train/{k}", row[k], done)
                for i, v in enumerate(lams):
                    writer.add_scalar(f"lambda/layer_{i}", v, done)
                bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", sps=row["samples_per_s"])
        if done % spe == 0 and env.is_main:
            dt = time.perf_counter() - t_epoch
            bar.write(f"epoch {done // spe}: loss {sum(epoch_losses) / len(epoch_losses):.4f}  lr {lr:.2e}  "
                      f"{len(epoch_losses) * cfg.run.batch_size / dt:.1f} samples/s  {dt:.1f} s"
                      + (f"  λ {mean_lambdas(model)}" if cfg.run.distributed != "fsdp2" else ""))
            epoch_losses, t_epoch = [], time.perf_counter()
        if done % cfg.run.ckpt_every == 0 or done == total:
            model_sd, optim_sd = _full_state(model, optimizer)
            rngs = _gather_rng(env)
            if env.is_main:
                save_checkpoint(run_dir, done, {
                    "step": done, "world_size": env.world_size, "config": config_digest(cfg),
                    "model": model_sd, "optimizer": optim_sd, "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(), "ema": ema.state_dict() if ema is not None else None,
                    "rng": rngs}, cfg.run.keep_last)
            barrier()
    bar.close()

    # --- the final model: save_pretrained (``diffattn eval RUN_DIR`` loads it), adapters only for retrofits
    if cfg.run.distributed == "fsdp2" and env.distributed:
        model_sd, _ = _full_state(model, optimizer)
        final = task.build_model() if env.is_main else None
        if final is not None:
            final.load_state_dict(model_sd)
    else:
        final = model
    if env.is_main:
        task.save_final(final, run_dir)
        if ema is not None:
            ema.copy_to(model)
            task.save_final(model, run_dir / "ema")
        writer.close()
    barrier()
    final_loss = losses[-1] if losses else math.nan
    return {"run_dir": str(run_dir), "steps": total, "final_loss": final_loss, "losses": losses}
