"""The DiffCLIP study (Hammoud & Ghanem 2025, §4) at a CPU size: ``diffattn study diffclip``, the demo
(:mod:`.diffclip_demo`, ``diffattn demo``) at several seeds, aggregated.

The study runs the demo at every seed into ``<out>/seed<k>/`` (a seed whose ``results.json`` already holds every
variant is read back instead of retrained) and aggregates the table's metrics over seeds. With ``curve_points``
the zero-shot accuracy and image↔text recall@1 on the Tux Paint test split are also measured along training, at
``curve_points`` evenly spaced steps (:func:`~.diffclip_demo.learning_curve`), so that a difference in how fast the
models learn shows as well as where they end.

The question (:data:`QUESTION`, pre-registered 2026-11-27, before any run of it; :mod:`.diffclip_question`): does
DiffCLIP retrieve held-out pairs of its own training distribution better than CLIP trained on the same data, seed
and budget? The metric is the mean recall of :func:`~.diffclip_question.heldout_retrieval` (R@1, R@5 and R@10,
image→text and text→image, averaged per pair) on the 222 held-out pairs of the two training sets (the test splits
of the Tux Paint stamps and the emoji, never trained on). Its control (:data:`CONTROL`): the baseline must reach
twice chance (9.6 %; chance 4.8 %), at the demo's seed and on the mean over the study's seeds; below it the verdict
is "inconclusive". The verdict (:func:`~.diffclip_question.verdict`) is one of :data:`VERDICTS`: the demo (one seed)
tests the difference paired over the 222 held-out pairs, the study paired over seeds. Zero-shot Tux Paint,
Fashion-MNIST, the linear probe, corruptions and the attention maps stay as secondary results. The earlier control,
zero-shot Tux Paint top-1 ≥ 12.5 %, failed (CLIP 8.8 % at seed 0, 12.1 % over five seeds; flat from step 300): the
16 category names ("animals") are folders the captions ("A frog.") never name, so at this size it measured
transfer, not whether CLIP learnt its training task.

The demo's and the question's names (``demo``, ``DEMO_VARIANTS``, ``QUESTION``, ``CONTROL``, ``attention_figure``,
…) are importable from here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..deprecations import moved_attribute
from ..directions import higher_is_better
from ..utils import device_errors
from . import claims
from .base import Study, StudyConfig
from .diffclip_demo import (
    DEMO_DATASETS,
    DEMO_DEFAULT_VARIANTS,
    DEMO_ROWS,
    DEMO_VARIANTS,
    attention_figure,
    curve_point,
    demo,
    demo_pairs,
    demo_table,
    learning_curve,
)
from .diffclip_question import (
    CONTROL,
    PAPER_EFFECT,
    QUESTION,
    VERDICTS,
    compare_to_baseline,
    heldout_retrieval,
    study_answer,
    verdict,
)
from .report import Metric, lookup
from .stats import mean_std

__all__ = ["DiffCLIPStudy", "VARIANTS", "DEFAULTS", "curve_table",
           # the demo's and the question's, from their modules
           "DEMO_VARIANTS", "DEMO_DEFAULT_VARIANTS", "DEMO_DATASETS", "DEMO_ROWS", "QUESTION", "CONTROL", "VERDICTS",
           "PAPER_EFFECT", "heldout_retrieval", "verdict", "compare_to_baseline", "study_answer", "curve_point",
           "learning_curve", "attention_figure", "demo", "demo_pairs", "demo_table"]

#: the variants a study config may name (the first listed in the config is the baseline)
VARIANTS = tuple(DEMO_VARIANTS)
#: the budget keys of diffattn/configs/studies/diffclip.yaml (None: the demo recipe's value)
DEFAULTS: dict[str, Any] = {"steps": None, "batch_size": None, "quick": False, "max_pairs": None,
                            "curve_points": None, "device": None}


def _metrics():
    neither = {"clip.foreground_attention.signed.density_ratio", "clip.foreground_attention.relu.density_ratio"}
    return [Metric(name, key, 100.0 if kind == "pct" else 1.0, 1 if kind in ("pct", ".1f") else 3,
                   None if key in neither else higher_is_better(key) is not False,
                   claim=claims.DIFFCLIP_RETRIEVAL if key == CONTROL.key else None)
            for name, key, kind in DEMO_ROWS if kind not in ("list", "int") and key != "train_seconds"]


def _finished_demo(folder: Path, cfg: dict[str, Any]) -> dict | None:
    """The summary of a finished demo in ``folder`` run with this config's variants, steps and batch size, else
    None (so that a re-run of the study only trains the missing seeds)."""
    import yaml

    path = folder / "results.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text()).get("summary", {})
    if [s.get("variant") for s in summary.values()] != list(cfg["variants"]):
        return None
    if any("primary" not in s for s in summary.values()):  # a demo from before the question: measure it again
        return None
    if cfg["curve_points"] and any(len(s.get("curve", {}).get("steps", ())) < cfg["curve_points"]
                                   for s in summary.values()):
        return None
    for s in summary.values():
        run_cfg = folder / s["variant"] / "config.yaml"
        if not run_cfg.is_file():
            return None
        run = (yaml.safe_load(run_cfg.read_text()) or {}).get("run", {})
        if any(cfg[k] is not None and run.get(k) != cfg[k] for k in ("steps", "batch_size")):
            return None
    return summary


class DiffCLIPStudy(Study, name="diffclip", title="Study: CLIP vs DiffCLIP",
                    variants={v: label for v, (_, label) in DEMO_VARIANTS.items()}, defaults=DEFAULTS, control=CONTROL):
    """The demo at every seed (``<out>/seed<k>/``, each with its own report; finished seeds are read back), then the
    table's metrics as mean ± std over seeds with paired tests against the first variant."""

    def endpoint_values(self, results: Mapping[str, Any], key: str, variant: str) -> list[float | None]:
        """A metric of the study's table by its key (e.g. ``primary.mean_recall``, held-out retrieval mean recall)
        for ``variant`` per seed, on the table's scale (points (%) for rates)."""
        metric = next((m for m in _metrics() if m.key == key), None)
        if metric is None:
            raise ValueError(f"results of study diffclip have no metric {key!r}; its metrics: "
                             f"{[m.key for m in _metrics()]}")
        values = [lookup(r, key) for r in self.seed_results(results, variant)]
        return [None if v is None else float(v) * metric.scale for v in values]

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        """``steps``, ``batch_size``, ``max_pairs`` and ``curve_points`` are None (the recipes' values; no curve) or
        ints >= 1."""
        errors: list[str] = []  # every constraint the config breaks, reported together
        for key in ("steps", "batch_size", "max_pairs", "curve_points"):
            v = cfg[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                errors.append(f"{key} in {where} must be null (the demo recipe's value) or an int >= 1, got {v!r}")
        errors += device_errors(cfg, where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        out = Path(cfg["out"])
        per_seed = {}
        for seed in cfg["seeds"]:
            folder = out / f"seed{seed}"
            summary = _finished_demo(folder, cfg)
            if summary is None:
                print(f"[study] seed {seed}: diffattn demo -> {folder}", flush=True)
                summary = demo(folder, tuple(cfg["variants"]), steps=cfg["steps"], batch_size=cfg["batch_size"],
                               seed=seed, quick=cfg["quick"], progress=progress, max_pairs=cfg["max_pairs"],
                               curve_points=cfg["curve_points"], device=cfg["device"])["summary"]
            else:
                print(f"[study] seed {seed}: reusing the finished demo in {folder}", flush=True)
            per_seed[seed] = summary
        return per_seed

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        intro = ("CLIP vs DiffCLIP variants (Hammoud & Ghanem 2025, §4) trained from scratch on the offline Tux Paint "
                 "+ emoji pairs with the demo's recipes (demo/*), one budget, several seeds; accuracies and recalls "
                 "in %. The control is the demo's question's (held-out retrieval mean recall), on the mean over "
                 "seeds.\n\n" + study_answer(per_seed))
        extra = ["Per-seed reports: " + ", ".join(f"[seed {s}](seed{s}/report.md)" for s in per_seed)]
        if cfg["curve_points"]:
            extra.insert(0, curve_table(per_seed))
        return self.write_report(cfg, intro, per_seed, _metrics(), seconds, extra)


#: the metrics measured along training (:func:`curve_point`) and their names in the report
CURVE_METRICS = (("zero_shot_top1", "zero-shot Tux Paint top-1"), ("image_to_text@1", "Tux Paint image→text R@1"),
                 ("text_to_image@1", "Tux Paint text→image R@1"))


def curve_table(per_seed: dict[int, dict]) -> str:
    """The report section of the learning curves: per metric, one row per measured step with every variant's mean ±
    sample std over seeds (in %). Seeds share the steps (same budget)."""
    labels = list(next(iter(per_seed.values())))
    steps = next(iter(per_seed.values()))[labels[0]]["curve"]["steps"]
    lines = ["## Along training", "",
             f"Measured on the Tux Paint test split at steps {steps} (mean ± sample std over {len(per_seed)} seeds, "
             f"in %): how fast each model learns, not only where it ends. No test per step: the paired tests above "
             f"are on the final models."]
    for key, name in CURVE_METRICS:
        lines += ["", f"| {name}: step | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
        for i, step in enumerate(steps):
            cells = []
            for lab in labels:
                m, sd = mean_std([100 * res[lab]["curve"][key][i] for res in per_seed.values()])
                cells.append(f"{m:.1f} ± {sd:.1f}")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the 0.1.0 entry point, read with a warning: ``diffattn.studies.run_study(cfg)`` runs a study config
__getattr__ = moved_attribute(__name__, {"run": lambda: DiffCLIPStudy().execute})
