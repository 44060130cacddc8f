"""The recall factorial's tables and interaction contrasts, rendered from its committed results.

The factorial (the recall ablation's registered questions ``recall_factorial_scale_w64`` and ``..._w128``) trains
Diff V1 (Ye et al. 2024, Eq. 1-3) at every combination of three factors, each cell with its own tuned lr, on MQAR
(Arora et al. 2023) at depth 2:

- the per-head sub-norm, on or off (§2.1: RMSNorm of each head's (A1 − λA2)V);
- λ_init, the constants 0.2 / 0.5 / 0.8;
- the output scale, tied to (1 − λ_init) (the paper's, applied after the sub-norm) or fixed at 1.

The registered test compares one pair of cells (scale fixed − tied at sub-norm on, λ_init 0.8). This module adds the
interaction contrasts, each a per-seed linear combination of four (or eight) cells on the same seed, tested with
the exact two-sided sign-flip permutation test (:func:`.stats.permutation_p`) and Holm-adjusted over the contrasts of
one width. They were not registered before the runs: they are exploratory.

For an interaction of factors A and B, the contrast is (effect of A at B's first level) − (effect of A at B's second
level): zero when A's effect does not depend on B. The cells are found by asking the ablation's variant table for
their settings (:func:`.recall_ablation.variant_settings`), not by their names.

    diffattn study-summary     # renders these tables into docs/studies.md from studies/results/
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..layers import DiffAttention
from .recall_ablation import CONTROL_VARIANT, VARIANTS, variant_settings
from .stats import holm, mean_std, paired_test, permutation_p

__all__ = ["CONTRASTS", "LEVELS", "cells", "contrast", "contrasts", "render_factorial", "FACTORIAL_START",
           "FACTORIAL_END", "FACTORIAL_RESULTS"]

FACTORIAL_START = "<!-- factorial:start (rendered by `diffattn study-summary` from studies/results/) -->"
FACTORIAL_END = "<!-- factorial:end -->"
#: the committed results the factorial's tables are rendered from, one per width (``studies/results/<name>/``)
FACTORIAL_RESULTS = ("recall_factorial_scale_w64", "recall_factorial_scale_w128")

#: the factors' levels: (sub-norm, output scale) columns and λ_init rows
LEVELS = {"columns": ((True, "tied"), (True, "fixed"), (False, "tied"), (False, "fixed")),
          "lambda_init": (0.2, 0.5, 0.8)}
_COLUMN_TITLES = {(True, "tied"): "sub-norm × (1 − λ_init)", (True, "fixed"): "sub-norm × 1",
                  (False, "tied"): "no sub-norm × (1 − λ_init)", (False, "fixed"): "no sub-norm × 1"}

Cell = tuple[bool, str, float]  # (sub-norm, output scale, λ_init)

#: name → (what it asks, {cell: weight}); the weights sum to zero
CONTRASTS: dict[str, tuple[str, dict[Cell, int]]] = {
    "scale × λ_init (sub-norm on)": (
        "(tied − fixed at λ_init 0.8) − (tied − fixed at 0.2): does the scale's effect depend on λ_init?",
        {(True, "tied", 0.8): 1, (True, "fixed", 0.8): -1, (True, "tied", 0.2): -1, (True, "fixed", 0.2): 1}),
    "sub-norm × scale (λ_init 0.8)": (
        "(tied − fixed with the sub-norm) − (tied − fixed without): does the scale act through the sub-norm?",
        {(True, "tied", 0.8): 1, (True, "fixed", 0.8): -1, (False, "tied", 0.8): -1, (False, "fixed", 0.8): 1}),
    "sub-norm × λ_init (scale tied)": (
        "(0.8 − 0.2 with the sub-norm) − (0.8 − 0.2 without), scale (1 − λ_init)",
        {(True, "tied", 0.8): 1, (True, "tied", 0.2): -1, (False, "tied", 0.8): -1, (False, "tied", 0.2): 1}),
    "sub-norm × λ_init (scale 1)": (
        "(0.8 − 0.2 with the sub-norm) − (0.8 − 0.2 without), scale fixed at 1",
        {(True, "fixed", 0.8): 1, (True, "fixed", 0.2): -1, (False, "fixed", 0.8): -1, (False, "fixed", 0.2): 1}),
    "sub-norm × scale × λ_init": (
        "the scale × λ_init contrast with the sub-norm minus the same without it",
        {(True, "tied", 0.8): 1, (True, "fixed", 0.8): -1, (True, "tied", 0.2): -1, (True, "fixed", 0.2): 1,
         (False, "tied", 0.8): -1, (False, "fixed", 0.8): 1, (False, "tied", 0.2): 1, (False, "fixed", 0.2): -1}),
}


def cells(variants: Sequence[str]) -> dict[Cell, str]:
    """The factorial's cells among ``variants``: (sub-norm, output scale, λ_init) → variant, for every Diff V1
    variant with a constant λ_init among the factorial's levels (the layer's default scale: tied with the sub-norm, 1
    without)."""
    out: dict[Cell, str] = {}
    for v in variants:
        kind, settings = variant_settings(v)
        if kind != DiffAttention.kind or settings.get("lambda_init") not in LEVELS["lambda_init"]:
            continue
        sub_norm = settings.get("sub_norm", True)
        scale = settings.get("output_scale") or ("tied" if sub_norm else "fixed")
        out[(sub_norm, scale, settings["lambda_init"])] = v
    return out


def contrast(values: Mapping[str, Sequence[float]], found: Mapping[Cell, str],
             weights: Mapping[Cell, int]) -> list[float] | None:
    """The per-seed contrast Σ w · value(cell) (None when a cell of it was not run)."""
    if any(c not in found for c in weights):
        return None
    runs = [values[found[c]] for c in weights]
    return [sum(w * r[i] for w, r in zip(weights.values(), runs)) for i in range(len(runs[0]))]


def _values(results: Mapping[str, Any], width: str, metric: str) -> dict[str, list[float]]:
    return {v: [100.0 * r[metric] for r in runs] for v, runs in results["reported"][width].items()}


def contrasts(results: Mapping[str, Any], width: str, metric: str = "auc") -> list[dict[str, Any]]:
    """Every contrast of :data:`CONTRASTS` whose cells ran at ``width`` (e.g. ``"w64"``): per-seed values (points),
    mean, 95 % interval (t), exact sign-flip permutation p and Holm's p over those contrasts."""
    values = _values(results, width, metric)
    found = cells(list(values))
    rows = []
    for name, (asks, weights) in CONTRASTS.items():
        c = contrast(values, found, weights)
        if c is None:
            continue
        t = paired_test(c, [0.0] * len(c))
        rows.append({"name": name, "asks": asks, "values": c, "mean": t["mean_diff"], "ci95": t["ci95"],
                     "p": permutation_p(c)})
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = p
    return rows


def _fmt(v: float, sign: bool = False) -> str:
    return f"{v:{'+' if sign else ''}.1f}".replace("-", "−")


def _cell_text(runs: Sequence[Mapping[str, Any]], level: float) -> str:
    auc, sd = mean_std([100.0 * r["auc"] for r in runs])
    learnt = sum(r["accuracy"] >= level for r in runs)
    return f"{_fmt(auc)} ± {_fmt(sd)} ({learnt}/{len(runs)})"


def _width_tables(results: Mapping[str, Any], width: str, commit: str, command: str) -> list[str]:
    cfg = results["config"]
    level = cfg.get("control_accuracy", 0.9)
    reported = results["reported"][width]
    found = cells(list(reported))
    seeds = cfg["seeds"]
    lines = [f"**Width {width[1:]}** ({len(seeds)} seeds {seeds[0]}–{seeds[-1]}, depth {cfg['depth']}, "
             f"{cfg['steps']} steps, each cell's lr tuned on seeds {cfg['tuning_seeds']}; trained at {commit[:7]}: "
             f"`{command}`). Area under the learning curve with {cfg['pairs'][0]} pairs (%), mean ± sd, and in "
             f"brackets the seeds whose final accuracy reaches {100 * level:g} %:", "",
             "| λ_init | " + " | ".join(_COLUMN_TITLES[c] for c in LEVELS["columns"]) + " |",
             "|---:|" + "---:|" * len(LEVELS["columns"])]
    for lam in LEVELS["lambda_init"]:
        row = [_cell_text(reported[found[(*c, lam)]], level) if (*c, lam) in found else "not run"
               for c in LEVELS["columns"]]
        lines.append(f"| {lam:g} | " + " | ".join(row) + " |")
    if CONTROL_VARIANT in reported:
        lines += ["", f"{VARIANTS[CONTROL_VARIANT]}: {_cell_text(reported[CONTROL_VARIANT], level)}."]
    rows = contrasts(results, width)
    if rows:
        lines += ["", "Interaction contrasts (exploratory: not registered), per seed on the same seeds; exact "
                  "two-sided sign-flip permutation p, Holm over the contrasts of this width:", "",
                  "| contrast | what it asks | mean [95 % CI] (points) | permutation p | Holm p |",
                  "|---|---|---|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['name']} | {r['asks']} | {_fmt(r['mean'], True)} [{_fmt(r['ci95'][0], True)}, "
                         f"{_fmt(r['ci95'][1], True)}] | {r['p']:.3g} | {r['p_holm']:.3g} |")
    return lines


def render_factorial(root: str | Path) -> str:
    """The factorial's tables for docs/studies.md, one per width with committed results (module docstring)."""
    lines: list[str] = []
    done: set[str] = set()  # a width recorded under two registrations (one call ran both) is shown once
    for name in FACTORIAL_RESULTS:
        folder = Path(root) / "studies" / "results" / name
        if not (folder / "results.json").is_file():
            continue
        results = json.loads((folder / "results.json").read_text())
        run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
        for width in results["reported"]:
            if width in done:
                continue
            done.add(width)
            if lines:
                lines.append("")
            lines += _width_tables(results, width, str(run.get("library_commit", "?")), run.get("command", "?"))
    if not lines:
        return "The factorial has no committed results yet."
    return "\n".join(lines)
