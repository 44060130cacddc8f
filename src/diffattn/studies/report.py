"""Aggregate per-seed results of a study: mean ± std per variant and metric, paired tests against the baseline
(the first variant), and the files ``<out>/results.json`` and ``<out>/report.md``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io import atomic_write_file
from .stats import mean_std, paired_statement, paired_test

__all__ = ["Metric", "aggregate", "markdown_table", "write_study", "read_seed", "write_seed", "run_seeds"]


@dataclass(frozen=True)
class Metric:
    """One row of a study table: ``name`` (shown), ``key`` (dotted path in a variant's per-seed result),
    ``scale`` (100 shows fractions as %), ``digits`` and whether higher is better (None: neither)."""

    name: str
    key: str
    scale: float = 1.0
    digits: int = 2
    higher_is_better: bool | None = True


def _get(d: Mapping, path: str):
    """``d[a][b]…`` for the dotted ``path`` "a.b…"; a key that itself holds dots ("noise.0.1" → d["noise"]["0.1"])
    is matched whole first."""
    while True:
        if not isinstance(d, Mapping):
            return None
        if path in d:
            return d[path]
        head, _, path = path.partition(".")
        if not path or head not in d:
            return None
        d = d[head]


def aggregate(per_seed: Mapping[int, Mapping[str, Mapping]], metrics: Sequence[Metric]) -> list[dict[str, Any]]:
    """Rows ``{"metric", "key", "scale", "digits", "higher_is_better", "values": {label: [per seed]},
    "summary": {label: {"mean", "std"}}, "vs_baseline": {label: {paired test…, "statement"}}}`` for every metric
    that every variant has at every seed. ``per_seed``: seed → variant label → result (the first label is the
    baseline)."""
    seeds = list(per_seed)
    labels = list(per_seed[seeds[0]])
    base = labels[0]
    rows = []
    for m in metrics:
        vals = {lab: [_get(per_seed[s].get(lab, {}), m.key) for s in seeds] for lab in labels}
        if any(v is None for vs in vals.values() for v in vs):
            continue
        values = {lab: [float(v) * m.scale for v in vs] for lab, vs in vals.items()}
        row = {"metric": m.name, "key": m.key, "scale": m.scale, "digits": m.digits,
               "higher_is_better": m.higher_is_better, "values": values,
               "summary": {lab: dict(zip(("mean", "std"), mean_std(v))) for lab, v in values.items()},
               "vs_baseline": {}}
        for lab in labels[1:]:
            test = paired_test(values[lab], values[base])
            row["vs_baseline"][lab] = {**test, "statement": paired_statement(test, lab, base, digits=m.digits)}
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[Mapping], labels: Sequence[str], n_seeds: int) -> str:
    """Metric × variant table of mean ± std, with the baseline-relative paired t-test p-value per cell."""
    lines = [f"| metric (mean ± std over {n_seeds} seeds) | " + " | ".join(labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for r in rows:
        d = r["digits"]
        arrow = {True: " ↑", False: " ↓", None: ""}[r["higher_is_better"]]
        cells = []
        for lab in labels:
            s = r["summary"][lab]
            cell = f"{s['mean']:.{d}f} ± {s['std']:.{d}f}"
            if lab in r["vs_baseline"]:
                cell += f" (p = {r['vs_baseline'][lab]['p']:.2f})"
            cells.append(cell)
        lines.append(f"| {r['metric']}{arrow} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_study(out: str | Path, cfg: Mapping, title: str, intro: str, per_seed: Mapping[int, Mapping],
                metrics: Sequence[Metric], seconds: float, extra_sections: Sequence[str] = ()) -> dict[str, Any]:
    """Aggregate ``per_seed`` (:func:`aggregate`), write ``<out>/results.json`` and ``<out>/report.md``; returns
    ``{"rows", "table", "seconds", "report", "results"}``."""
    out = Path(out)
    rows = aggregate(per_seed, metrics)
    labels = list(next(iter(per_seed.values())))
    table = markdown_table(rows, labels, len(per_seed))
    tests = [f"- {r['metric']}: " + "; ".join(v["statement"] for v in r["vs_baseline"].values()) for r in rows]
    report = "\n".join([
        f"# {title}", "", intro, "",
        f"Seeds {list(per_seed)}; wall time {seconds / 60:.1f} min. Cells: mean ± sample std over seeds, and the "
        f"two-sided paired t-test p-value against {labels[0]} (↑ higher is better, ↓ lower is better).", "",
        table, "", f"## Paired over seeds: each variant minus {labels[0]}", "", *tests, "",
        "With 3 seeds the sign test cannot go below p = 0.25 and the t-test has 2 degrees of freedom: only large, "
        "consistent differences reach p < 0.05.", "", *extra_sections, ""])
    with atomic_write_file(out / "report.md", "w") as f:
        f.write(report)
    results = {"study": cfg.get("study"), "config": dict(cfg), "labels": labels, "seeds": list(per_seed),
               "rows": rows, "per_seed": {str(s): v for s, v in per_seed.items()}, "seconds": round(seconds, 1)}
    with atomic_write_file(out / "results.json", "w") as f:
        json.dump(results, f, indent=1, default=float)
    return {"rows": rows, "table": table, "seconds": seconds, "report": str(out / "report.md"), "results": results}


def _budget(cfg: Mapping) -> dict[str, Any]:
    """The config without the keys that do not change a seed's result (seeds, out)."""
    return {k: v for k, v in cfg.items() if k not in ("seeds", "out")}


def read_seed(folder: str | Path, cfg: Mapping) -> dict | None:
    """The per-variant results saved in ``<folder>/seed_results.json`` by :func:`write_seed` for the same budget
    (the config minus seeds and out), else None: a finished seed is not recomputed when a study is re-run."""
    path = Path(folder) / "seed_results.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("budget") != json.loads(json.dumps(_budget(cfg), default=float)):
        return None
    return saved["results"]


def write_seed(folder: str | Path, cfg: Mapping, results: Mapping) -> None:
    """Save one seed's per-variant results with the budget that produced them (:func:`read_seed`)."""
    with atomic_write_file(Path(folder) / "seed_results.json", "w") as f:
        json.dump({"budget": _budget(cfg), "results": results}, f, indent=1, default=float)


def run_seeds(cfg: Mapping, compute: Callable[[int, Path], dict]) -> dict[int, dict]:
    """Every seed of ``cfg``: its per-variant results read back from ``<out>/seed<k>/`` when they were computed with
    this budget (:func:`read_seed`), else ``compute(seed, folder)``, saved at once (:func:`write_seed`) so that a
    killed study resumes at the first unfinished seed."""
    per_seed: dict[int, dict] = {}
    for seed in cfg["seeds"]:
        folder = Path(cfg["out"]) / f"seed{seed}"
        res = read_seed(folder, cfg)
        if res is None:
            res = compute(seed, folder)
            write_seed(folder, cfg, res)
        per_seed[seed] = res
    return per_seed
