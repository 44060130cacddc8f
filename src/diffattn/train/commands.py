"""``diffattn train CONFIG [--set key=value …] [--out DIR] [--resume auto|PATH]`` (also under torchrun:
``torchrun --nproc_per_node 2 -m diffattn train CONFIG``)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def _train_command(args: argparse.Namespace) -> int:
    from ..extras import missing

    absent = missing("train")
    if absent:  # before anything is written to the run directory
        print(f"diffattn: error: diffattn train needs {', '.join(absent)}: pip install 'diffattn[train]'",
              file=sys.stderr)
        return 2
    from .config import load_config
    from .loop import train

    try:
        cfg = load_config(args.config, args.set)
    except ValueError as e:
        raise SystemExit(f"diffattn train: {e}") from None
    result = train(cfg, out=args.out, resume=args.resume)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"trained {result['steps']} steps, final loss {result['final_loss']:.4f}; run in {result['run_dir']}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model from a YAML recipe (one process or torchrun)",
                              description=__doc__)
    p.add_argument("config", help="a YAML file, or a packaged recipe's name: tiny/clip, tiny/classify, … "
                   "(diffattn.configs.config_names)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set optim.lr=3e-4")
    p.add_argument("--out", default=None, help="run directory (default: the config's run.out)")
    p.add_argument("--resume", default=None, help="'auto' (newest checkpoint of the run directory, if any), a "
                   "checkpoint directory or a run directory")
    p.set_defaults(func=_train_command)
