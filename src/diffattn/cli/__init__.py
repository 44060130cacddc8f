"""The ``diffattn`` command.

    diffattn demo      # the main job: CLIP vs DiffCLIP trained and evaluated end to end, with a control and a verdict
    diffattn study NAME|YAML  # a study over seeds (diffclip, retrofit, dgvit, noise, paligemma, llava, detection,
                              # needles, recall)
    diffattn models    # list registered models (optionally a pattern: diffattn models 'diffclip*')
    diffattn study-summary [--check]         # the summary tables of docs/studies.md and README.md, rendered
    diffattn train / eval / compare / data   # train a recipe, evaluate a run, compare runs, the offline datasets
    diffattn object-attention / lm-eval / inspect   # detectors' object attention, lm-eval's CLI, a model's noise
    diffattn openclip-train ARGS             # open_clip's training script with diffattn's CLIP models by name
    diffattn timm-train TRAIN_PY ARGS        # timm's train.py with diffattn's vision models registered

``diffattn`` (or ``python -m diffattn``) is the package's only entry point: no other module runs as a script. Every
command lives in :mod:`diffattn.app`, one module per command group; :func:`main` answers ``--version``, builds the
parser of :mod:`diffattn.app.parser` and runs the command's handler.

``demo`` is the DiffCLIP study (Hammoud & Ghanem 2025, §4) at a CPU size, through the code path a user runs on
CC3M: it lists the offline image–caption pairs (Tux Paint stamps + Noto emoji, ``make data``) in an open_clip-style
TSV, trains CLIP and DiffCLIP (``--variants`` adds DiffCLIP*, DiffCLIP†) with ``diffattn train demo/<variant>``
(same data, seed and budget; only the attention differs), answers its pre-registered question (does DiffCLIP
retrieve the held-out pairs of its training distribution better than CLIP?) with a control on CLIP and a verdict,
evaluates each with ``diffattn eval`` (zero-shot on the 16 Tux Paint categories, image↔text retrieval, linear
probe, CLS attention inside vs outside the foreground masks), adds zero-shot Fashion-MNIST, retrieval on held-out
emoji and zero-shot accuracy under common corruptions as secondary results, then prints the control, the verdict
and a side-by-side table and writes ``runs/demo/report.md`` with plots (attention maps of every model on the same
images, λ per layer, learning curves).

Errors. A mistake a user can make (a typo in a config, a missing file or data set, a damaged checkpoint, a run
directory in use) is printed as one line ``diffattn: error: …`` naming the file, key or argument, and the exit
status is 2 (:func:`main`; :func:`diffattn.errors.is_user_error` says which errors those are). ``--debug`` (or
``DIFFATTN_DEBUG=1``) shows the traceback instead. Under torchrun only rank 0 prints.
"""

from __future__ import annotations

import os
import sys

from .._version import __version__
from ..errors import is_user_error, one_line
from ..progress import library_bars

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``diffattn`` command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status. A user error
    (module docstring) is one line on stderr and status 2; ``--debug`` anywhere in ``argv`` (or
    ``DIFFATTN_DEBUG=1``) re-raises it instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:  # before the parser imports torch
        print(f"diffattn {__version__}")
        raise SystemExit(0)  # as argparse's version action
    from ..app import parser as app_parser  # the parser and the handlers: torch, the studies, the training code

    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut] or os.environ.get("DIFFATTN_DEBUG", "") not in ("", "0")
    argv = [a for i, a in enumerate(argv) if not (a == "--debug" and i < cut)]
    parser = app_parser.build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):  # a command that hands every argument to another program's CLI
        args.args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    library_bars(not getattr(args, "no_progress", False))  # transformers' bars follow diffattn's (progress.py)
    try:
        return int(args.func(args) or 0)
    except Exception as e:
        if debug or not is_user_error(e):
            raise
        if os.environ.get("RANK", "0") in ("", "0"):  # under torchrun only rank 0 prints
            print(f"diffattn: error: {one_line(e)}", file=sys.stderr, flush=True)
        _finish_distributed()
        return 2


def _finish_distributed() -> None:
    if "torch.distributed" not in sys.modules:  # never started
        return
    dist = sys.modules["torch.distributed"]
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
