"""Write constraints/tested.txt: the exact version of every package in this environment, after a green `make test`.

`make install` installs with these constraints, so a new checkout gets the versions that last passed; CI installs
the newest releases pyproject.toml allows (`.ci/run` sets CONSTRAINTS to empty) and the oldest ones
(constraints/oldest.txt), so a release that breaks either end fails CI instead of a user. Refresh after a green run
of the newest versions:

    make test CONSTRAINTS= && make constraints

torch and its CUDA wheels are left out: `make install` installs torch first from TORCH_SPEC, and their wheels differ by
platform.
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
from importlib.metadata import distributions
from pathlib import Path

#: installed by TORCH_SPEC, platform-specific, or this project itself
SKIP = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|diffattn|pip|setuptools|wheel)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    seen: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and not SKIP.match(_canonical(name)):
            seen.setdefault(_canonical(name), dist.version)
    return [f"{n}=={v}" for n, v in sorted(seen.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "constraints" / "tested.txt")
    args = ap.parse_args(argv)
    head = [
        "# The versions that last passed `make test` (newest releases pyproject.toml allowed that day), written by",
        "# scripts/freeze_constraints.py (`make constraints`); `make install` uses them. Do not edit by hand.",
        f"# Python {platform.python_version()} on {sys.platform}/{platform.machine()}; torch comes from TORCH_SPEC.",
    ]
    args.out.write_text("\n".join(head + pins()) + "\n")
    print(f"wrote {args.out} ({len(pins())} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
