"""``diffattn compare``: evaluated runs side by side, one column per run argument with the mean ± std over the seeds
found under it, the direction of better (:mod:`diffattn.directions`), the chance level and the difference to the
first run; the rows are those of ``diffattn eval``'s table (:func:`diffattn.eval.report.headline_metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..directions import better
from ..errors import UsageError
from ..io import atomic_write_file
from .report import BOOKKEEPING, format_value, headline_metrics, metric_label, suite_names

__all__ = ["compare", "load_results", "flatten", "recorded_chance"]


def flatten(d: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested results as ``{"suite.group.metric": value}`` in the order of the results (plots,
    paths, lists and the protocol's own numbers, :data:`~diffattn.eval.report.BOOKKEEPING`, left out)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            if k in ("model", "skipped", "diagnostics", "sweep", "chance"):
                continue
            out.update(flatten(v, key))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and k not in BOOKKEEPING:
            out[key] = float(v)
    return out


def load_results(path: str | Path) -> list[dict]:
    """Every ``results.json`` for one run argument: the file itself, ``<dir>/results.json``,
    ``<dir>/eval/results.json``, else all of them below ``<dir>`` (one per seed)."""
    path = Path(path)
    if path.is_file():
        return [_read_results(path)]
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} does not exist (give results.json files or evaluated run folders)")
    for p in (path / "results.json", path / "eval" / "results.json"):
        if p.is_file():
            return [_read_results(p)]
    found = sorted(path.rglob("results.json"))
    if not found:
        raise UsageError(f"no results.json under {str(path)!r}: it has not been evaluated; run `diffattn eval {path}` "
                         f"first")
    return [_read_results(p) for p in found]


def _read_results(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object of results, got {type(data).__name__}")
    return data


def _compared(results: dict) -> dict[str, float]:
    """The metrics ``compare`` shows for one results dict: the eval table's rows (:func:`headline_metrics`) of every
    suite, ``suite.group.metric``."""
    return {f"{suite}.{k}": float(v) for suite in suite_names() if isinstance(results.get(suite), dict)
            for k, v in headline_metrics(results[suite]).items()}


def recorded_chance(results: dict) -> dict[str, float]:
    """The chance levels a results dict records, keyed as :func:`flatten` keys its metrics (``suite.group.metric``)."""
    return {f"{suite}.{k}": float(v) for suite, r in results.items() if isinstance(r, dict)
            and isinstance(r.get("chance"), dict) for k, v in r["chance"].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def compare(runs: Sequence[str | Path], out: str | Path | None = None,
            labels: Sequence[str] | None = None) -> str:
    """A markdown table with one column per run argument: mean ± std (population, over the seeds found under it)
    of every metric the runs share, in the order of the first run's results, with the direction of better (↑/↓),
    the chance level where the results record one (:func:`recorded_chance`; "varies" where the runs' levels
    differ) and one Δ column per further run (its mean minus the first run's); a note below the table where a
    column holds one run (n = 1). The rows are those of ``diffattn eval``'s table (:func:`headline_metrics`),
    the directions those of :mod:`diffattn.directions`; written to ``out`` (and ``out`` with ``.json``) when
    given. Runs that share no metric are a :class:`~diffattn.errors.UsageError`."""
    if len(runs) < 1:
        raise UsageError("compare needs at least one run")
    labels = list(labels) if labels else [Path(r).name for r in runs]
    if len(labels) != len(runs):
        raise UsageError(f"--labels must give one name per run ({len(runs)}), got {len(labels)}")
    cols = []
    names: dict[str, str] = {}  # row labels: few-shot with its way and shot
    levels: dict[str, set[float]] = {}
    for r in runs:
        found = load_results(r)
        for res in found:
            names.update({f"{suite}.{k}": f"{suite}.{metric_label(res[suite], k)}" for suite in suite_names()
                          if isinstance(res.get(suite), dict) for k in headline_metrics(res[suite])})
            for k, v in recorded_chance(res).items():
                levels.setdefault(k, set()).add(v)
        flat = [_compared(x) for x in found]
        shared = set.intersection(*(set(f) for f in flat))
        cols.append({k: (float(np.mean([f[k] for f in flat])), float(np.std([f[k] for f in flat])), len(flat))
                     for k in flat[0] if k in shared})
    keys = [k for k in cols[0] if all(k in c for c in cols[1:])]
    if not keys:
        what = " and ".join(f"{lab} ({', '.join(list(c)[:3]) or 'no metric'}…)" for lab, c in zip(labels, cols))
        raise UsageError(f"the runs share no metric to compare: {what}; evaluate them with the same suite "
                         f"(diffattn eval)")
    n = [next(iter(c.values()))[2] for c in cols]
    chance = {k: (next(iter(levels[k])) if len(levels[k]) == 1 else "varies") for k in keys if k in levels}
    head = ["metric", "better"] + (["chance"] if chance else []) + [f"{lab} (n={k})" for lab, k in zip(labels, n)] + \
        [f"Δ {lab}" for lab in labels[1:]]
    lines = ["| " + " | ".join(head) + " |",
             "|---|:-:|" + "---:|" * (len(cols) + len(cols) - 1 + bool(chance))]
    for k in keys:
        cells = [format_value(chance.get(k, ""))] if chance else []
        for c in cols:
            mean, std, count = c[k]
            cells.append(f"{mean:.4f} ± {std:.4f}" if count > 1 else f"{mean:.4f}")
        deltas = [f"{c[k][0] - cols[0][k][0]:+.4f}" for c in cols[1:]]
        lines.append(f"| {names.get(k, k)} | {better(k)} | " + " | ".join(cells + deltas) + " |")
    single = [lab for lab, k in zip(labels, n) if k == 1]
    if single:
        lines += ["", f"n = 1 for {', '.join(single)}: one evaluated run (one seed) per column. At this size single "
                  f"seeds vary by several points, so read a Δ of a few points as noise; give a folder holding several "
                  f"seeds' runs for mean ± std."]
    if chance:
        lines += ["", "chance: what guessing uniformly scores (as recorded by diffattn eval)."]
    table = "\n".join(lines) + "\n"
    if out is not None:
        out = Path(out)
        with atomic_write_file(out, "w") as f:
            f.write(table)
        with atomic_write_file(out.with_suffix(".json"), "w") as f:
            json.dump({lab: {k: {"mean": v[0], "std": v[1], "n": v[2], **({"chance": chance[k]} if k in chance
                                                                          else {})}
                             for k, v in c.items() if k in keys}
                       for lab, c in zip(labels, cols)}, f, indent=1)
    return table
