"""Which registered question a study run answers, and the commit that registered it: what every study report prints
so that a reader can tell confirmatory results from exploratory ones.

A registration is one YAML file ``studies/registrations/<name>.yaml`` in the project's checkout
(:mod:`diffattn.studies.registration` defines and checks the format). A run answers a registration when its config
names it (``registrations: [<name>, ...]``, a report key: it never changes a seed's result). Its results are
*confirmatory* for the registration's primary endpoint when the file exists, git knows the commit that added it
(``git log --diff-filter=A --format=%H -- <file>``) and the run's study and seeds are the registered ones; every
other number of the report, and every number of a run that names no registration, is *exploratory*.

Committed results live in ``studies/results/<name>/`` (``results.json`` and ``report.md`` of the run, copied there);
the commit that added them must strictly descend from the registration's commit
(:func:`results_descend_errors`).

This module reads files and asks git; it imports nothing else of diffattn, so that the report writers can use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["REGISTRATIONS", "RESULTS", "UNREGISTERED", "project_root", "git_root", "added_in", "is_ancestor",
           "registration_status", "results_descend_errors"]

#: where the registrations live, relative to the project's checkout
REGISTRATIONS = Path("studies") / "registrations"
#: where committed results live, one folder per registration, relative to the project's checkout
RESULTS = Path("studies") / "results"
#: what a report says for a run that names no registration
UNREGISTERED = "unregistered: exploratory"


def project_root(start: str | os.PathLike | None = None) -> Path | None:
    """The first of ``start`` (default: the working directory) and its parents that holds
    ``studies/registrations``, or None."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / REGISTRATIONS).is_dir():
            return folder
    return None


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess | None:
    """``git <args>`` in ``cwd``, or None when git is not installed."""
    if shutil.which("git") is None:
        return None
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def git_root(path: str | os.PathLike) -> Path | None:
    """The top of the git checkout that holds ``path`` (a folder), or None (no git, or not a checkout)."""
    done = _git(["rev-parse", "--show-toplevel"], Path(path))
    if done is None or done.returncode != 0:
        return None
    return Path(done.stdout.strip())


def added_in(path: str | os.PathLike) -> list[str]:
    """The commits that added the file ``path``, or a file under the folder ``path``, newest first
    (``git log --diff-filter=A --format=%H -- <path>``); empty when git is missing, the path is outside a checkout
    or not committed. A registration's commit is the first of the list."""
    path = Path(path).resolve()
    cwd = path if path.is_dir() else path.parent
    if not cwd.is_dir():
        return []
    done = _git(["log", "--diff-filter=A", "--format=%H", "--", "." if path.is_dir() else path.name], cwd)
    if done is None or done.returncode != 0:
        return []
    return done.stdout.split()


def is_ancestor(older: str, newer: str, cwd: str | os.PathLike) -> bool:
    """Whether commit ``older`` is an ancestor of ``newer`` (or the same commit; ``git merge-base --is-ancestor``)."""
    done = _git(["merge-base", "--is-ancestor", older, newer], Path(cwd))
    return done is not None and done.returncode == 0


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def registration_status(cfg: Mapping[str, Any], root: str | os.PathLike | None = None) -> dict[str, Any]:
    """What a report prints about the registrations a run's config names (``cfg["registrations"]``): ``{"label":
    "confirmatory" | "exploratory", "registrations": [{"name", "file", "commit", "primary_endpoint", "comparison",
    "confirmatory", "reason"}], "lines": [markdown]}``. ``root``: the project's checkout (default:
    :func:`project_root` of the working directory). A registration is confirmatory when its file exists, git knows
    the commit that added it and the run's study and seeds are the registered ones (module docstring)."""
    names = list(cfg.get("registrations") or [])
    if not names:
        return {"label": "exploratory", "registrations": [],
                "lines": [f"Registration: {UNREGISTERED} (this run's config names no registration; every number in "
                          f"this report is exploratory)."]}
    base = Path(root) if root is not None else project_root()
    entries, lines = [], []
    for name in names:
        path = (base / REGISTRATIONS / f"{name}.yaml") if base is not None else None
        data = _read(path) if path is not None and path.is_file() else {}
        commit = next(iter(added_in(path)), None) if data else None
        reason = ""
        if not data:
            reason = f"no registration file {REGISTRATIONS / f'{name}.yaml'} in the checkout"
        elif commit is None:
            reason = "the registration file is not committed (or git is unavailable), so its date cannot be checked"
        elif data.get("study") != cfg.get("study"):
            reason = f"the registration is for study {data.get('study')!r}, the run is {cfg.get('study')!r}"
        elif sorted(data.get("seeds") or []) != sorted(cfg.get("seeds") or []):
            reason = f"the run's seeds {list(cfg.get('seeds') or [])} are not the registered {data.get('seeds')}"
        comparison = data.get("comparison") or {}
        entry = {"name": name, "file": str(REGISTRATIONS / f"{name}.yaml"), "commit": commit,
                 "primary_endpoint": data.get("primary_endpoint"), "comparison": dict(comparison),
                 "test": data.get("test"), "confirmatory": not reason, "reason": reason}
        entries.append(entry)
        what = (f"{entry['primary_endpoint']}, {comparison.get('variant')} − {comparison.get('baseline')} "
                f"({entry['test']})")
        if reason:
            lines.append(f"Registration `{name}` ({entry['file']}): exploratory, because {reason}.")
        else:
            lines.append(f"Registration `{name}` ({entry['file']}), added in commit {commit}: **confirmatory** for "
                         f"{what}.")
    label = "confirmatory" if any(e["confirmatory"] for e in entries) else "exploratory"
    lines.append("Every other number in this report is exploratory." if label == "confirmatory" else
                 "Every number in this report is exploratory.")
    return {"label": label, "registrations": entries, "lines": lines}


def results_descend_errors(root: str | os.PathLike) -> list[str]:
    """One message per results folder ``studies/results/<name>/`` of the checkout at ``root`` that has no
    committed registration ``studies/registrations/<name>.yaml``, or that is not committed, or one of whose files
    was added in a commit that does not strictly descend from the registration's (``git merge-base --is-ancestor``
    and a different commit).
    No folder: no message."""
    root = Path(root)
    results = root / RESULTS
    if not results.is_dir():
        return []
    errors = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        reg = root / REGISTRATIONS / f"{folder.name}.yaml"
        registered = next(iter(added_in(reg)), None) if reg.is_file() else None
        added = added_in(folder)
        if registered is None:
            errors.append(f"{RESULTS / folder.name} has no committed registration {REGISTRATIONS / reg.name}")
        elif not added:
            errors.append(f"{RESULTS / folder.name} is not committed, so it cannot be shown to follow its "
                          f"registration (commit {registered})")
        for commit in added if registered is not None else ():
            if commit == registered or not is_ancestor(registered, commit, root):
                errors.append(f"{RESULTS / folder.name} has files added in commit {commit}, which does not strictly "
                              f"descend from commit {registered} that added {REGISTRATIONS / reg.name}: results "
                              f"must be committed after their registration")
    return errors
