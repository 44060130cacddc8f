"""Where a run reports: ``metrics.jsonl`` (one JSON row per logged step, ``{"step", "epoch", "loss", "lr",
"grad_norm", "samples_per_s", "lambda"}``, and ``{"step", "eval": {...}}`` per validation), TensorBoard
(``train/*``, ``lambda/layer_*``, ``val/*``), the progress bar and the end-of-epoch line. Rank 0 writes; every rank
may call.

    log = RunLog(cfg, env, run_dir, steps_per_epoch)
    log.open(start, total)          # a resumed run first drops the rows logged after its checkpoint
    log.step(done, total, loss, lr, grad_norm, model)
    log.close()
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from ..io import atomic_write_file
from ..progress import progress
from .config import TrainConfig
from .distributed import DistEnv
from .tasks import mean_lambdas

__all__ = ["RunLog", "truncate_metrics", "last_logged_loss"]


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric rows logged after ``step`` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    with atomic_write_file(path, "w") as f:
        f.write("".join(r + "\n" for r in rows))


def last_logged_loss(path: Path) -> float:
    """The training loss of the last row of ``metrics.jsonl`` (NaN when there is none)."""
    if not path.is_file():
        return math.nan
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [r["loss"] for r in rows if "loss" in r]
    return float(losses[-1]) if losses else math.nan


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
                truncate_metrics(self.path, start)
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
