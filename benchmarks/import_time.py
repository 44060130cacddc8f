"""Import time of diffattn against ``import torch``: each command in a fresh interpreter, side by side.

Each row is one command run in a new process (``subprocess``), wall-clock time from start to exit, so it includes
the interpreter's own start. The commands are timed in interleaved rounds (A, B, C, …, A, B, C, …) after one
untimed warm-up round (which fills the page cache), so that a slow-down of a shared machine hits all of them alike;
the median of the rounds is reported, with the ratio to ``import torch``.

    PYTHONPATH=src python benchmarks/import_time.py --rounds 15
    PYTHONPATH=src python benchmarks/import_time.py --markdown docs/benchmarks.md

Rows: ``python -c pass`` (the interpreter alone), ``import torch``, ``import diffattn`` (lazy: torch and the rest on
first use), ``diffattn --version`` (as ``python -m diffattn --version``), and the library with torch
(``from diffattn import create_model, retrofit, DiffAttention``: every library subpackage but no optional one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata

#: (label, the command after ``python``)
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python -c pass", ("-c", "pass")),
    ("import torch", ("-c", "import torch")),
    ("import diffattn", ("-c", "import diffattn")),
    ("diffattn --version", ("-m", "diffattn", "--version")),
    ("from diffattn import create_model, retrofit, DiffAttention",
     ("-c", "from diffattn import create_model, retrofit, DiffAttention")),
)
BASELINE = "import torch"


def run_once(args: tuple[str, ...], env: dict[str, str]) -> float:
    """Seconds from starting ``python ARGS`` to its exit; raises if it fails."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(rounds: int, env: dict[str, str]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {label: [] for label, _ in COMMANDS}
    for r in range(rounds + 1):  # round 0 warms the page cache and is dropped
        for label, args in COMMANDS:
            t = run_once(args, env)
            if r:
                times[label].append(t)
    return times


def machine() -> str:
    from diffattn.utils import cpu_name

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return (f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch_version}, "
            f"{platform.system()} {platform.release()}")


def table(times: dict[str, list[float]]) -> tuple[str, list[dict]]:
    base = statistics.median(times[BASELINE])
    rows, lines = [], ["| command | median s | min s | max s | × import torch |", "|---|---:|---:|---:|---:|"]
    for label, ts in times.items():
        med = statistics.median(ts)
        rows.append({"command": label, "median_s": med, "min_s": min(ts), "max_s": max(ts), "ratio": med / base})
        lines.append(f"| `{label}` | {med:.2f} | {min(ts):.2f} | {max(ts):.2f} | {med / base:.2f} |")
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=11, help="timed rounds per command (median reported)")
    p.add_argument("--markdown", default=None, help="write the results into this file's import-time section")
    p.add_argument("--json", default=None, help="write the raw times to this JSON file")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    times = measure(args.rounds, env)
    text, rows = table(times)
    where = machine()
    print(f"Machine: {where}\n")
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": where, "rounds": args.rounds, "rows": rows, "times": times}, f, indent=1)
    if args.markdown:
        from diffattn.utils import write_markdown_section

        cmd = f"PYTHONPATH=src python benchmarks/import_time.py --rounds {args.rounds} --markdown {args.markdown}"
        write_markdown_section(args.markdown, "import-time", "\n".join([
            "## Import time",
            "",
            "`benchmarks/import_time.py` runs each command in a fresh interpreter and times it to its exit "
            f"(interleaved rounds after one warm-up round, median of {args.rounds}), as a ratio to `import torch`. "
            "`diffattn --version` is run as `python -m diffattn --version` (the same `diffattn.cli.main` as the "
            "script). `import diffattn` imports neither torch nor any optional library (each public name is "
            "resolved on first use); the last row is the library with torch (every subpackage `import diffattn` "
            "used to load eagerly, no optional dependency).",
            "",
            f"Command: `{cmd}`",
            f"Machine: {where}.",
            "",
            text,
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
