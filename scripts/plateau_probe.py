"""Run the plateau probe (diffattn.studies.probe) and record it with its provenance in studies/exploratory/.

    python scripts/plateau_probe.py --from studies/results/recall_factorial_scale_w64/results.json \
        --variants standard diff_lambda0.8 diff_lambda0.8_fixed diff_lambda0.2 --seeds 200 201 202

Retrains the variants at the seeds and lrs of a committed recall-ablation results.json with the probe on, writes
``results.json`` and ``run.json`` (the library commit, the command, the wall time, the machine) into ``--out``
(default: studies/exploratory/plateau_probe), then ``diffattn study-summary`` renders its table into docs/studies.md.
Exploratory: nothing here was registered.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from diffattn.io import atomic_write_file  # noqa: E402
from diffattn.studies.probe import PROBE_RESULTS, probe_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", required=True, help="a committed recall-ablation results.json")
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--width", default=None, help="e.g. w64 (default: the results' first width)")
    ap.add_argument("--out", type=Path, default=ROOT / PROBE_RESULTS)
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    found = probe_runs(json.loads(Path(args.source).read_text()), args.variants, args.seeds, args.out,
                       width=args.width, source=args.source)
    command = "python scripts/plateau_probe.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = {"library_commit": commit, "command": command, "wall_minutes": round(found["seconds"] / 60, 1),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
                      f"Python {platform.python_version()}"}
    with atomic_write_file(args.out / "run.json", "w") as f:
        f.write(json.dumps(run, indent=1) + "\n")
    print(f"[probe] {len(found['variants'])} variants × {len(found['seeds'])} seeds in {run['wall_minutes']} min -> "
          f"{args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
