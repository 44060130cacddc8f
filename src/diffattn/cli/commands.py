"""The ``diffattn`` command's parser and its own subcommands (``demo``, ``study``, ``models``, ``openclip-train``,
``timm-train``), with :data:`COMMAND_MODULES`, which add the others. :func:`diffattn.cli.main` imports this module
(torch, the studies, the training and evaluation code) after it has answered ``--version``."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import runpy
import sys
from typing import Any

from .._version import __version__
from ..configs import parse_set
from ..errors import UsageError, did_you_mean, user_input
from ..factory import register_timm
from ..models import list_models, list_pretrained
from ..models.registry import model_info
from ..openclip import main as openclip_main
from ..studies import get_study, run_study, study_names
from ..studies import load_study as _load_study
from ..studies.config import WALL_TIMES, budget_warnings
from ..studies.diffclip import (
    DEMO_DATASETS,
    DEMO_DEFAULT_VARIANTS,
    DEMO_ROWS,
    DEMO_VARIANTS,
    demo,
    demo_pairs,
    demo_table,
)
from ..utils import device_type, resolve_device

__all__ = ["demo", "study", "load_study", "build_parser", "plain_text", "bounded", "ArgumentParser",
           "COMMAND_MODULES", "DEMO_VARIANTS", "DEMO_DATASETS", "DEMO_ROWS", "demo_pairs", "demo_table"]


def load_study(config: str | os.PathLike, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A study config (:func:`diffattn.studies.load_study`)."""
    return _load_study(config, overrides)


def study(config: str | os.PathLike, progress: bool = True) -> dict[str, Any]:
    """Run a study config (:func:`diffattn.studies.run_study`): writes ``<out>/results.json`` and ``report.md``."""
    return run_study(config, progress=progress)


# --------------------------------------------------------------------------------------------------- CLI

#: Modules that add subcommands: each defines ``register(subparsers)``, which adds its parsers and sets
#: ``func`` (called with the parsed args, returns the exit code) through ``set_defaults``.
COMMAND_MODULES: tuple[str, ...] = ("diffattn.app.data_commands", "diffattn.train.commands", "diffattn.eval.commands",
                                    "diffattn.studies.summary")


def bounded(kind: type, minimum: float | None = None, *, strict: bool = False):
    """An argparse ``type`` that parses ``kind`` and rejects values below ``minimum`` (or equal, if ``strict``),
    so a bad number is a one-line usage error naming the option instead of a traceback later."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"needs {kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"needs a finite number, got {text!r}")
        if minimum is not None and (value <= minimum if strict else value < minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


#: what ``--device`` says on ``demo`` and ``study``, as on ``train`` and ``eval``
_DEVICE_HELP = ("cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu; CUDA_VISIBLE_DEVICES picks the "
                "GPUs torch sees)")


def device_studies() -> list[str]:
    """The packaged studies with a ``device`` key (those that train through ``diffattn train``), which
    ``diffattn study --device`` sets; the others train in this process on the CPU."""
    return [name for name in study_names() if "device" in getattr(get_study(name), "defaults", {})]


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


def _study_command(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    for item in args.set:
        parts, value = parse_set(item)
        overrides[".".join(parts)] = value
    if args.out is not None:
        overrides["out"] = args.out
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.protocol is not None:
        overrides["protocol"] = args.protocol
    if args.device is not None:
        resolve_device(args.device, "--device")  # a GPU torch cannot see is named as the flag, before any work
    with user_input():  # a study config is what the user gave: its ValueErrors are usage errors
        cfg = load_study(args.config, overrides)
    if args.device is not None:
        if "device" in cfg.budget:
            cfg = cfg.replace(device=args.device)
        elif args.device != "cpu":
            raise UsageError(f"--device {args.device!r}: study {cfg.study!r} trains in this process on the CPU; "
                             f"--device applies to the studies that train through diffattn train "
                             f"({', '.join(device_studies())})")
    for line in budget_warnings(cfg):
        print(f"diffattn: warning: {line}", file=sys.stderr, flush=True)
    res = study(cfg, progress=not args.no_progress)
    print()
    print(res["table"])
    print(f"\n{res['seconds'] / 60:.1f} min. Report with the paired tests: {res['report']}")
    return 0


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


def _models_command(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        raise UsageError(f"no registered model matches {args.pattern!r}"
                         f"{did_you_mean(args.pattern.strip('*?'), list_models())} (diffattn models lists them all)")
    if args.names:
        print("\n".join(names))
        return 0
    rows = [dict(model_info(n), pretrained=[t for _, t in list_pretrained(n)]) for n in names]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = [("name", "params", "family", "attention", "pretrained", "description")]
    for r in rows:
        att = r["attention"] if isinstance(r["attention"], str) else \
            ", ".join(f"{t} {a}" for t, a in r["attention"].items())
        table.append((r["name"], f"{r['params'] / 1e6:.2f}M", r["family"], att, ", ".join(r["pretrained"]) or "—",
                      r["description"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [c.rjust(w) if i == 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells + [row[-1]]).rstrip())
    return 0


def plain_text(text: str) -> str:
    """``text`` without the reST markup of docstrings: double backquotes dropped, a role such as :func: replaced by
    the name it points to (its last part where the role has a tilde)."""
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    return re.sub(r":[a-z]+:`(~?)([^`]+)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error, ``diffattn: error: <subcommand>: <message>`` (exit status 2), and help
    without reST markup (:func:`plain_text`): help strings and descriptions borrowed from docstrings read as
    text."""

    def format_help(self) -> str:
        return plain_text(super().format_help())

    def format_usage(self) -> str:
        return plain_text(super().format_usage())

    def error(self, message: str):
        print(f"diffattn: error: {self.prog.removeprefix('diffattn').strip() + ': ' if self.prog != 'diffattn' else ''}"
              f"{message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The ``diffattn`` argument parser with every subcommand registered."""
    p = ArgumentParser(prog="diffattn", description="Differential attention for PyTorch.")
    p.add_argument("--version", action="version", version=f"diffattn {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (also DIFFATTN_DEBUG=1); "
                   "may be given anywhere on the command line")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="CLIP vs DiffCLIP trained and evaluated end to end on the offline image–caption "
                       "data (diffattn data prepare), with a pre-registered control and a verdict")
    d.add_argument("--out", default="runs/demo", help="folder for the runs, report.md, results.json and plots")
    d.add_argument("--variants", nargs="+", default=list(DEMO_DEFAULT_VARIANTS), choices=list(DEMO_VARIANTS),
                   help="the models, the first the baseline (default: clip diffclip)")
    d.add_argument("--steps", type=bounded(int, 1), default=None, help="override the recipes' run.steps")
    d.add_argument("--batch-size", type=bounded(int, 1), default=None, help="override the recipes' run.batch_size")
    d.add_argument("--seed", type=bounded(int, 0), default=0)
    d.add_argument("--max-pairs", type=bounded(int, 1), default=None, help="cap the pairs taken from each set")
    d.add_argument("--quick", action="store_true", help="small evaluation protocol (smoke test)")
    d.add_argument("--config-dir", default=None, help="folder of the recipes (default: the packaged demo/*)")
    d.add_argument("--device", type=device_type, default=None, help=_DEVICE_HELP + "; training and diffattn eval "
                   "run there, the demo's own measurements on the CPU")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.set_defaults(func=_demo_command)
    st = sub.add_parser("study", help="a study config (variants × seeds × one budget): mean ± std and paired tests",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Train every variant of a study at every seed with one budget, check the "
                        "baseline's control,\nthen report mean ± std with paired tests (docs/studies.md).\n\n"
                        "Packaged studies and their wall time as measured for docs/studies.md (shared 2-core CPU, "
                        "one thread per study):\n" + "\n".join(f"  {name:<10} {t}" for name, t in WALL_TIMES.items()))
    st.add_argument("config", help="a YAML file, or a packaged study name (diffclip, retrofit, dgvit, noise, "
                    "paligemma, llava, detection, needles, recall)")
    st.add_argument("--out", default=None, help="folder for the seeds' runs, results.json and report.md (default: "
                    "the config's out)")
    st.add_argument("--seeds", type=bounded(int, 0), nargs="+", default=None, metavar="SEED",
                    help="the seeds to run (at least 2), e.g. --seeds 0 1 2")
    st.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the study config (repeatable), e.g. --set steps=100 or "
                    "--set model.dim=32")
    st.add_argument("--protocol", choices=("a", "b"), default=None,
                    help="a: the config's one recipe, tuned on the Transformer only; b: lr tuned per model on the "
                    "config's tuning_seeds, then its seeds (needles, recall, dgvit, noise; --set protocol=b)")
    st.add_argument("--device", type=device_type, default=None, help=_DEVICE_HELP + "; the config's device, for "
                    "the studies that train through diffattn train (diffclip, dgvit, paligemma); the others train "
                    "on the CPU")
    st.add_argument("--no-progress", action="store_true", help="no progress bars")
    st.set_defaults(func=_study_command)
    m = sub.add_parser("models", help="list registered models")
    m.add_argument("pattern", nargs="?", default="*", help="shell-style pattern, e.g. 'diffclip*'")
    m.add_argument("--json", action="store_true", help="a JSON list with one object per model (name, family, "
                   "description, attention, params, module, pretrained tags)")
    m.add_argument("--names", action="store_true", help="names only, one per line")
    m.set_defaults(func=_models_command)
    oc = sub.add_parser("openclip-train", add_help=False, help="open_clip's training script (open_clip_train.main) "
                        "with diffattn's CLIP models available by name; every argument goes to open_clip")
    oc.set_defaults(func=_openclip_train_command, passthrough=True)
    tt = sub.add_parser("timm-train", add_help=False, help="timm's train.py (give its path first) with diffattn's "
                        "vision models registered with timm; the other arguments go to it")
    tt.set_defaults(func=_timm_train_command, passthrough=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p
