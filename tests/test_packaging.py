"""The supported version range is the tested one: pyproject.toml's lower bounds are the oldest releases that
scripts/test_oldest.sh runs against, every range has an upper bound, and the recorded constraints fall inside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
BOUNDED = ("torch", "transformers", "peft", "timm", "open-clip-torch", "huggingface-hub")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _deps() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    return {_canon(r.name): r for r in reqs}


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[_canon(name)] = version
    return out


def _lower(req: Requirement) -> str | None:
    return next((s.version for s in req.specifier if s.operator == ">="), None)


def test_oldest_lane_pins_are_the_lower_bounds():
    deps, oldest = _deps(), _pins(ROOT / "constraints" / "oldest.txt")
    assert set(oldest) >= {"transformers", "peft", "timm", "open-clip-torch", "huggingface-hub"}
    for name, version in oldest.items():
        assert Version(_lower(deps[name])) == Version(version), (name, str(deps[name]), version)


def test_breaking_majors_are_excluded():
    deps = _deps()
    for name in BOUNDED + ("ultralytics",):
        assert any(s.operator in ("<", "<=") for s in deps[name].specifier), f"{name} has no upper bound"


def test_tested_constraints_satisfy_pyproject():
    deps, tested = _deps(), _pins(ROOT / "constraints" / "tested.txt")
    assert "transformers" in tested and "peft" in tested
    for name, version in tested.items():
        if name in deps:
            assert deps[name].specifier.contains(version, prereleases=True), (name, version, str(deps[name]))
