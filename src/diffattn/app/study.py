"""``diffattn study NAME|YAML``: a study config (variants × seeds × one budget), run by
:func:`diffattn.studies.run_study`, with mean ± std and paired tests.

    diffattn study noise --seeds 0 1 2 --set steps=100 [--out DIR] [--protocol a|b] [--device DEV]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..configs import parse_set
from ..errors import UsageError, user_input
from ..studies import get_study, load_study, run_study, study_names
from ..studies.config import WALL_TIMES, budget_warnings
from ..studies.provenance import RESULTS, project_root
from ..utils import resolve_device
from .common import DEVICE_HELP, bounded, device_type

__all__ = ["register", "device_studies"]


def device_studies() -> list[str]:
    """The packaged studies with a ``device`` key (those that train through ``diffattn train``), which
    ``diffattn study --device`` sets; the others train in this process on the CPU."""
    return [name for name in study_names() if "device" in getattr(get_study(name), "defaults", {})]


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
    res = run_study(cfg, progress=not args.no_progress)
    print()
    print(res["table"])
    print(f"\n{res['seconds'] / 60:.1f} min. Report with the paired tests: {res['report']}")
    return 0


def _registered_times() -> str:
    """The measured wall time of each registered run whose results a checkout holds (``studies/results/*/run.json``,
    one line per command), or nothing outside a checkout."""
    root = project_root()
    folder = root / RESULTS if root is not None else None
    if folder is None or not folder.is_dir():
        return ""
    times: dict[str, str] = {}
    for path in sorted(folder.glob("*/run.json")):
        run = json.loads(path.read_text(encoding="utf-8"))
        config = next((w for w in run.get("command", "").split() if w.endswith(".yaml")), path.parent.name)
        times.setdefault(Path(config).stem, f"{run.get('wall_minutes')} min ({run.get('note') or 'one thread'})")
    return ("\n\nRegistered runs of this checkout (studies/registrations/configs/, measured):\n"
            + "\n".join(f"  {name:<16} {t}" for name, t in times.items())) if times else ""


def register(subparsers) -> None:
    """Add ``diffattn study``."""
    st = subparsers.add_parser("study", help="a study config (variants × seeds × one budget): mean ± std and paired "
                               "tests", formatter_class=argparse.RawDescriptionHelpFormatter,
                               description="Train every variant of a study at every seed with one budget, check the "
                               "baseline's control,\nthen report mean ± std with paired tests (docs/studies.md).\n\n"
                               "Packaged studies and their wall time as measured for docs/studies.md (shared 2-core "
                               "CPU, one thread per study):\n"
                               + "\n".join(f"  {name:<10} {t}" for name, t in WALL_TIMES.items())
                               + _registered_times())
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
    st.add_argument("--device", type=device_type, default=None, help=DEVICE_HELP + "; the config's device, for "
                    "the studies that train through diffattn train (diffclip, dgvit, paligemma); the others train "
                    "on the CPU")
    st.add_argument("--no-progress", action="store_true", help="no progress bars")
    st.set_defaults(func=_study_command)
