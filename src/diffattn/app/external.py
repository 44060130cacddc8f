"""Other libraries' training scripts with diffattn's models registered; every argument goes to them.

    diffattn openclip-train ARGS             # open_clip's training script with diffattn's CLIP models by name
    diffattn timm-train TRAIN_PY ARGS        # timm's train.py with diffattn's vision models registered
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ..errors import UsageError
from ..factory import register_timm
from ..openclip import main as openclip_main

__all__ = ["register"]


def _openclip_train_command(args: argparse.Namespace) -> int:
    openclip_main(args.args)
    return 0


def _timm_train_command(args: argparse.Namespace) -> int:
    if not args.args or not os.path.isfile(args.args[0]):
        raise UsageError(f"timm-train needs the path of timm's train.py (pytorch-image-models) first, got "
                         f"{args.args[0] if args.args else 'nothing'!r}")
    register_timm()  # diffattn's vision models in timm's registry, then timm's script as if run by python
    script, rest = args.args[0], args.args[1:]
    saved = sys.argv
    sys.argv = [script, *rest]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    return 0


def register(subparsers) -> None:
    """Add ``diffattn openclip-train`` and ``diffattn timm-train`` (``passthrough``: :func:`diffattn.cli.main` hands
    them every argument)."""
    oc = subparsers.add_parser("openclip-train", add_help=False, help="open_clip's training script "
                               "(open_clip_train.main) with diffattn's CLIP models available by name; every argument "
                               "goes to open_clip")
    oc.set_defaults(func=_openclip_train_command, passthrough=True)
    tt = subparsers.add_parser("timm-train", add_help=False, help="timm's train.py (give its path first) with "
                               "diffattn's vision models registered with timm; the other arguments go to it")
    tt.set_defaults(func=_timm_train_command, passthrough=True)
