"""``diffattn train CONFIG [--set key=value …] [--out DIR] [--device cpu|cuda|cuda:N]
[--resume auto|PATH | --overwrite]`` (also under torchrun: ``torchrun --nproc_per_node 2 -m diffattn train CONFIG``):
the recipe read by :func:`diffattn.train.config.load_config`, trained by :func:`diffattn.train.loop.train`."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..extras import require
from ..train.config import budget_warnings, load_config
from ..train.loop import train
from ..utils import resolve_device
from .common import device_type

__all__ = ["register"]


def _train_command(args: argparse.Namespace) -> int:
    require("train", "diffattn train")  # before anything is written to the run directory
    if args.device is not None:  # a GPU torch cannot see is named as the flag, before the config is read
        resolve_device(args.device, "--device", local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                       world_size=int(os.environ.get("WORLD_SIZE", "1")))
    cfg = load_config(args.config, [*args.set, *([f"run.device={args.device}"] if args.device else [])])
    if _is_main_rank():
        for line in budget_warnings(cfg):
            print(f"diffattn: warning: {line}", file=sys.stderr, flush=True)
    result = train(cfg, out=args.out, resume=args.resume, overwrite=args.overwrite)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        loss = result["final_loss"]
        loss_text = f"final loss {loss:.4f}" if not math.isnan(loss) else "no loss logged"
        if result.get("finished"):
            print(f"nothing to train: the run was already finished at step {result['steps']} ({loss_text}); run in "
                  f"{result['run_dir']}")
        else:
            resumed = f" (resumed from step {result['resumed_from']})" if result.get("resumed_from") else ""
            if result.get("extended_from"):
                resumed = (f" (resumed from step {result['resumed_from']}, extended from {result['extended_from']} "
                           f"steps)")
            print(f"trained {result['steps']} steps{resumed}, {loss_text}; run in {result['run_dir']}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") in ("", "0")


def register(subparsers) -> None:
    """Add ``diffattn train``."""
    p = subparsers.add_parser("train", help="train a model from a YAML recipe (one process or torchrun)",
                              description="Train a model from a YAML recipe into a run directory (config.yaml, "
                              "metrics.jsonl, checkpoints, model/). Several processes: torchrun --nproc_per_node 2 "
                              "-m diffattn train CONFIG.")
    p.add_argument("config", help="a YAML file, or a packaged recipe's name: tiny/clip, tiny/classify, … "
                   "(diffattn.configs.config_names)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set optim.lr=3e-4; an attention setting "
                   "updates the model's own and keeps the rest, its kind included: --set "
                   "model.overrides.attention.lambda_init=0.5")
    p.add_argument("--out", default=None, help="run directory (default: the config's run.out)")
    p.add_argument("--device", type=device_type, default=None, help="cpu, cuda or cuda:N (run.device; default: "
                   "cuda when torch sees a GPU, else cpu; under torchrun cuda is each process's LOCAL_RANK GPU). "
                   "CUDA_VISIBLE_DEVICES picks the GPUs torch sees")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--resume", default=None, help="'auto' (newest intact checkpoint of the run directory, if any), "
                     "a checkpoint directory or a run directory")
    run.add_argument("--overwrite", action="store_true", help="replace the previous run in the run directory "
                     "(without it, a run directory that is not empty is refused)")
    p.set_defaults(func=_train_command)
