"""``diffattn demo``: CLIP vs DiffCLIP trained and evaluated end to end on the offline image–caption data, with a
pre-registered control and a verdict (:func:`diffattn.studies.diffclip.demo`, which the ``diffattn.cli`` docstring
describes).

    diffattn demo [--variants clip diffclip …] [--steps N] [--batch-size N] [--seed N] [--quick] [--device DEV]
"""

from __future__ import annotations

import argparse

from ..studies.diffclip import DEMO_DEFAULT_VARIANTS, DEMO_VARIANTS, demo
from ..utils import resolve_device
from .common import DEVICE_HELP, bounded, device_type

__all__ = ["register"]


def _demo_command(args: argparse.Namespace) -> int:
    if args.device is not None:
        resolve_device(args.device, "--device")  # a GPU torch cannot see is named as the flag, before any work
    res = demo(args.out, tuple(args.variants), steps=args.steps, batch_size=args.batch_size, seed=args.seed,
               quick=args.quick, config_dir=args.config_dir, progress=not args.no_progress,
               max_pairs=args.max_pairs, device=args.device)
    print()
    print("\n".join(line for line in res["answer"]["lines"] if line))
    print()
    print(res["table"])
    print(f"\n{res['seconds'] / 60:.1f} min. Report with plots: {res['report']}; models under "
          f"{args.out}/<variant>/model (load with diffattn.from_pretrained).")
    return 0


def register(subparsers) -> None:
    """Add ``diffattn demo``."""
    d = subparsers.add_parser("demo", help="CLIP vs DiffCLIP trained and evaluated end to end on the offline "
                              "image–caption data (diffattn data prepare), with a pre-registered control and a "
                              "verdict")
    d.add_argument("--out", default="runs/demo", help="folder for the runs, report.md, results.json and plots")
    d.add_argument("--variants", nargs="+", default=list(DEMO_DEFAULT_VARIANTS), choices=list(DEMO_VARIANTS),
                   help="the models, the first the baseline (default: clip diffclip)")
    d.add_argument("--steps", type=bounded(int, 1), default=None, help="override the recipes' run.steps")
    d.add_argument("--batch-size", type=bounded(int, 1), default=None, help="override the recipes' run.batch_size")
    d.add_argument("--seed", type=bounded(int, 0), default=0)
    d.add_argument("--max-pairs", type=bounded(int, 1), default=None, help="cap the pairs taken from each set")
    d.add_argument("--quick", action="store_true", help="small evaluation protocol (smoke test)")
    d.add_argument("--config-dir", default=None, help="folder of the recipes (default: the packaged demo/*)")
    d.add_argument("--device", type=device_type, default=None, help=DEVICE_HELP + "; training and diffattn eval "
                   "run there, the demo's own measurements on the CPU")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.set_defaults(func=_demo_command)
