"""Copy a registered study run's results into studies/results/<registration>/ for every registration it answers.

    python scripts/record_study_results.py runs/studies/registered/recall_headline \
        --library-commit 91fd0c9 --command "diffattn study studies/registrations/configs/recall_headline.yaml"

Writes ``results.json`` and ``report.md`` (the run's own files, unchanged) and ``run.json``: the library commit the
run trained at, the command, the wall time (minutes, from the run's ``seconds`` or ``--wall-minutes``), the machine.
Commit them in a commit of their own after the registrations' (``tests/test_study_registration.py`` checks the
order), then run ``diffattn study-summary`` and commit the rendered tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from diffattn.studies.provenance import RESULTS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the run's folder (its results.json and report.md)")
    ap.add_argument("--library-commit", required=True, help="the commit of diffattn the run trained at")
    ap.add_argument("--command", required=True, help="the command that ran it")
    ap.add_argument("--wall-minutes", type=float, default=None,
                    help="the run's wall time when its results.json's own 'seconds' is a read-back call's")
    ap.add_argument("--note", default="", help="anything about the run a reader needs (load, split processes)")
    ap.add_argument("--only", nargs="+", default=None, metavar="REGISTRATION",
                    help="record these of the run's registrations only (e.g. a width the run did not reach)")
    args = ap.parse_args(argv)
    results = json.loads((args.out / "results.json").read_text(encoding="utf-8"))
    names = results.get("config", {}).get("registrations") or []
    if not names:
        ap.error(f"{args.out}/results.json names no registration: only registered runs are recorded")
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            ap.error(f"--only names {unknown}, which the run does not answer; it answers {names}")
        names = [n for n in names if n in args.only]
    minutes = args.wall_minutes if args.wall_minutes is not None else round(results["seconds"] / 60, 1)
    run = {"library_commit": args.library_commit, "command": args.command, "wall_minutes": minutes,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
                      f"{platform.release()}, Python {platform.python_version()}", "note": args.note}
    for name in names:
        folder = ROOT / RESULTS / name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out / "results.json", folder / "results.json")
        shutil.copyfile(args.out / "report.md", folder / "report.md")
        (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        print(f"{folder.relative_to(ROOT)}: results.json, report.md, run.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
