"""A LLaVA-style VLM with a CLIP vs a DiffCLIP image tower, same recipe and budget (Hammoud & Ghanem 2025, §5.1:
DiffCLIP's tower in LLaVA; Liu et al. 2023 (LLaVA), §4.2: the two training stages).

    diffattn study llava      # the towers of `diffattn study diffclip` (seed k's VLM takes seed k's towers)

Per seed and variant: ``llava_clip_tiny`` / ``llava_diffclip_tiny`` with the variant's tower (``towers``: variant →
a diffattn CLIP ``model/`` folder, ``{seed}`` replaced by the seed; ``random`` leaves the tower at its random
init), trained with :func:`diffattn.train.llava.train_llava` (stage 1: projector on the captions; stage 2:
projector + LM on the questions; the tower frozen), then evaluated on the test questions
(:func:`diffattn.eval.vlm_bench.evaluate_vlm`: VQA score, POPE per split, MMNeedle) and its decoder attention on
the image tokens (:func:`diffattn.eval.vlm_bench.image_attention`). Training asks POPE questions of
``train_pope_splits`` only (one yes and one no per image and split; all three would make yes/no 70 % of the data).

:func:`llava_compare` runs the same over any set of towers without the study's seeds and report (its rows, and
:func:`llava_table` over them).

Control (:func:`control`, stated before any comparison): the baseline VLM must answer at least 60 % of the POPE
questions of the first split it was trained on (``train_pope_splits``) right; one yes and one no question per image
make chance and the always-yes prior 50 %. Below that the towers are not compared.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.vqa import POPE_SPLITS, QUESTION_KINDS, VQADataset
from ..eval.vlm_bench import evaluate_vlm, image_attention, llava_answerer
from ..factory import create_model
from ..io import atomic_write_file
from ..models.clip import image_transform
from ..train.llava import train_llava
from ..train.tasks.vlm import QuestionImages, vlm_vocabulary
from . import claims
from .base import Study, StudyConfig
from .common import minimum_errors, pope_control, require_datasets, vlm_metrics
from .report import Control, run_seeds

__all__ = ["LLaVAStudy", "VARIANTS", "DEFAULTS", "control", "train_and_evaluate", "llava_compare", "llava_table"]

#: variant → (registered VLM, label)
VARIANTS: dict[str, tuple[str, str]] = {
    "clip": ("llava_clip_tiny", "clip"),
    "diffclip": ("llava_diffclip_tiny", "diffclip"),
}
#: the budget (diffattn/configs/studies/llava.yaml)
DEFAULTS: dict[str, Any] = {
    "towers": {"clip": "runs/studies/diffclip/seed{seed}/clip/model",
               "diffclip": "runs/studies/diffclip/seed{seed}/diffclip/model"},
    "stage1_steps": 100, "stage2_steps": 250, "batch_size": 32, "stage1_lr": 1.0e-3, "stage2_lr": 1.0e-3,
    "needle_count": 100, "train_pope_splits": ["random"], "attention_questions": 64, "max_new_tokens": 6,
    "threads": 1,
}


#: a tower whose name contains this gets the differential VLM (the study's towers are named clip and diffclip)
DIFFERENTIAL_TOWER_MARK = "diff"


def train_and_evaluate(model_name: str, tower: str | None, seed: int, *, stage1_steps: int, stage2_steps: int,
                       batch_size: int, stage1_lr: float, stage2_lr: float, needle_count: int,
                       train_pope_splits: Sequence[str], vocab: list[str], root=None, attention_questions: int = 64,
                       max_new_tokens: int = 6, log=print) -> dict[str, Any]:
    """One VLM (module docstring): built with ``seed``, its image tower loaded from ``tower`` (None: random init),
    both stages trained, evaluated on the test questions. Returns the metrics, ``final_loss`` and timings."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = create_model(model_name, vocab=vocab)
    if tower:
        model.load_vision_tower(tower)
    tf = image_transform(model.img_size)
    train = VQADataset("train", ("what", "category", "pope", "needle"), root=root, seed=seed,
                       needle_count=4 * needle_count, pope_splits=tuple(train_pope_splits))
    losses = train_llava(model, QuestionImages(train, tf), stage1_steps=stage1_steps, stage2_steps=stage2_steps,
                         batch_size=batch_size, seed=seed, stage1_lr=stage1_lr, stage2_lr=stage2_lr,
                         captions=QuestionImages(train, tf, captions=True), log=log)
    t_train = time.perf_counter() - t0
    test = VQADataset("test", QUESTION_KINDS, root=root, seed=0, needle_count=needle_count)
    res = evaluate_vlm(llava_answerer(model, max_new_tokens), test, tf)
    pope_qs = [q for q in test.questions if q["kind"] == "pope"][:attention_questions]
    imgs = torch.stack([tf(test.image(q)) for q in pope_qs])
    res["image_attention"] = image_attention(model, imgs, [q["question"] for q in pope_qs])
    res.pop("answers")
    return {**res, "final_loss": losses[-1], "train_s": round(t_train, 1),
            "total_s": round(time.perf_counter() - t0, 1)}


def _tower(path: str | None, seed: int) -> str | None:
    """This seed's tower folder (``{seed}`` replaced), or None for ``random`` / empty."""
    return None if path in (None, "", "random") else path.replace("{seed}", str(seed))


def control(cfg: dict[str, Any]) -> Control:
    """The positive control: the baseline's POPE accuracy on the first training split (``train_pope_splits``) at
    least 60 % (chance and the always-yes prior: 50 %)."""
    return pope_control(cfg["train_pope_splits"][0])


class LLaVAStudy(Study, name="llava", title="Study: LLaVA-style VLM, CLIP vs DiffCLIP image tower", variants=VARIANTS,
                 defaults=DEFAULTS, control=control):
    """The llava study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("batch_size", "needle_count", "attention_questions", "max_new_tokens",
                                      "threads"), where)
        errors += minimum_errors(cfg, ("stage1_steps", "stage2_steps"), where, 0)
        if cfg["stage1_steps"] + cfg["stage2_steps"] < 1:
            errors.append(f"stage1_steps + stage2_steps in {where} must be >= 1, got 0")
        missing = [v for v in cfg["variants"] if v not in cfg["towers"]]
        if missing or not all(isinstance(p, str) for p in cfg["towers"].values()):
            errors.append(f"towers in {where} must map every variant ({', '.join(cfg['variants'])}) to a CLIP model/ "
                          f"folder or 'random', got {cfg['towers']!r}")
        if not cfg["train_pope_splits"] or any(s not in POPE_SPLITS for s in cfg["train_pope_splits"]):
            errors.append(f"train_pope_splits in {where} must be a non-empty list from {list(POPE_SPLITS)}, got "
                          f"{cfg['train_pope_splits']!r}")
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every seed (``<out>/seed<k>/results.json``), aggregated into ``<out>/results.json`` and ``report.md``; a
        tower folder that is not there raises, naming the study that trains it."""
        require_datasets(["tuxpaint_captions"], "the llava study")
        for v in cfg["variants"]:
            for seed in cfg["seeds"]:
                tower = _tower(cfg["towers"][v], seed)
                if tower is not None and not (Path(tower) / "config.json").is_file():
                    raise FileNotFoundError(f"towers.{v} in the llava study: {tower} holds no trained CLIP "
                                            f"(config.json); train the towers with `diffattn study diffclip` or set "
                                            f"towers.{v}: random")
        torch.set_num_threads(cfg["threads"])
        vocab = vlm_vocabulary()
        budget = {k: cfg[k] for k in ("stage1_steps", "stage2_steps", "batch_size", "stage1_lr", "stage2_lr",
                                      "needle_count", "train_pope_splits", "attention_questions", "max_new_tokens")}
        log = print if progress else None

        def one_seed(seed: int, folder: Path) -> dict:
            results = {}
            for v in cfg["variants"]:
                model_name, label = VARIANTS[v]
                r = train_and_evaluate(model_name, _tower(cfg["towers"][v], seed), seed, vocab=vocab, log=log, **budget)
                results[label] = r
                print(f"[study llava] seed {seed} {label}: VQA {r['vqa']}, final loss {r['final_loss']:.3f} "
                      f"({r['total_s']:.0f} s)", flush=True)
            return results

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        layers = max(len(r["image_attention"]) for res in per_seed.values() for r in res.values())
        towers = ", ".join(f"{v}: {cfg['towers'][v]}" for v in cfg["variants"])
        intro = (f"A LLaVA-style VLM (tiny: tower frozen, a projector and an LM trained from scratch) with each image "
                 f"tower ({towers}), same recipe: stage 1 "
                 f"{cfg['stage1_steps']} steps on the captions (projector, lr {cfg['stage1_lr']:g}), stage 2 "
                 f"{cfg['stage2_steps']} steps of {cfg['batch_size']} questions (projector + LM, lr "
                 f"{cfg['stage2_lr']:g}; POPE {', '.join(cfg['train_pope_splits'])} negatives, "
                 f"{4 * cfg['needle_count']} needle grids). Test split: {cfg['needle_count']} needle grids, greedy "
                 f"answers of at most {cfg['max_new_tokens']} tokens.")
        return self.write_report(cfg, intro, per_seed,
                                 vlm_metrics(layers, ("existence", "index", "exact"), "final training loss",
                                             pope_claim=claims.LLAVA_POPE), seconds)


def llava_compare(towers: dict[str, str | None], seeds: Sequence[int] = (0, 1, 2), *, stage1_steps: int = 100,
                  stage2_steps: int = 250, batch_size: int = 32, stage1_lr: float = 1e-3, stage2_lr: float = 1e-3,
                  root=None, needle_count: int = 100, train_pope_splits: Sequence[str] = ("random",),
                  out: str | Path | None = None, log=print) -> list[dict]:
    """:func:`train_and_evaluate` on each image tower of ``towers`` (name → a diffattn CLIP ``model/`` folder, or
    None for a tower left at random init; ``{seed}`` in the folder is replaced by the seed; a name containing
    ``diff`` gets the differential VLM) and each seed. Returns one row per (tower, seed); with ``out`` also writes
    ``results.json`` and ``results.md`` (:func:`llava_table`) there, atomically, after every run."""
    vocab = vlm_vocabulary(root)
    rows = []
    for name, clip in towers.items():
        for seed in seeds:
            tower = clip and clip.replace("{seed}", str(seed))  # this seed's tower
            vlm = "llava_diffclip_tiny" if DIFFERENTIAL_TOWER_MARK in name else "llava_clip_tiny"
            res = train_and_evaluate(vlm, tower, seed,
                                     stage1_steps=stage1_steps, stage2_steps=stage2_steps, batch_size=batch_size,
                                     stage1_lr=stage1_lr, stage2_lr=stage2_lr, needle_count=needle_count,
                                     train_pope_splits=train_pope_splits, vocab=vocab, root=root, log=log)
            row = {"tower": name, "clip": tower, "seed": seed,
                   "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "batch_size": batch_size,
                   "lr": [stage1_lr, stage2_lr], **res}
            rows.append(row)
            if log:
                log(json.dumps({k: row[k] for k in ("tower", "seed", "final_loss", "vqa", "total_s")}))
            if out is not None:
                Path(out).mkdir(parents=True, exist_ok=True)
                with atomic_write_file(Path(out) / "results.json", "w") as f:
                    json.dump(rows, f, indent=1)
                with atomic_write_file(Path(out) / "results.md", "w") as f:
                    f.write(llava_table(rows))
    return rows


def _row_value(row: dict, key: str):
    value = row
    for part in key.split("."):
        if isinstance(value, list):
            value = value[int(part)] if int(part) < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        if value is None:
            return None
    return value


def llava_table(rows: Sequence[dict]) -> str:
    """The Markdown table of :func:`llava_compare`'s rows: per metric (test split, %) and tower, mean ± sample std
    over the seeds; the wall time per run in seconds."""
    import statistics

    towers = list(dict.fromkeys(r["tower"] for r in rows))
    by_tower = {t: [r for r in rows if r["tower"] == t] for t in towers}
    seeds = sorted({r["seed"] for r in rows})
    metrics = [("VQA score, what is this?", "vqa.what", 100), ("VQA score, category", "vqa.category", 100)]
    for split in [s for s in POPE_SPLITS if any(s in r.get("pope", {}) for r in rows)]:
        metrics += [(f"POPE {split}: {name}", f"pope.{split}.{key}", 100)
                    for name, key in (("accuracy", "accuracy"), ("F1", "f1"), ("yes-ratio", "yes_ratio"))]
    metrics += [(f"MMNeedle {name}", f"mmneedle.{name}", 100) for name in ("existence", "index", "exact")]
    metrics += [("MMNeedle two-step location", "mmneedle.location", 100)]
    cells = sorted({c for r in rows for c in r.get("mmneedle", {}).get("cells", {})})
    metrics += [(f"MMNeedle location, cell ({c})", f"mmneedle.cells.{c}", 100) for c in cells]
    layers = max((len(r.get("image_attention", [])) for r in rows), default=0)
    metrics += [(f"decoder attention on image tokens, layer {i}", f"image_attention.{i}", 100) for i in range(layers)]
    metrics += [("final training loss", "final_loss", 1), ("wall time per run (s, train + eval)", "total_s", 1)]
    lines = [f"| metric (test split, %, mean ± std over seeds {', '.join(map(str, seeds))}) | " + " | ".join(towers)
             + " |", "|---|" + "---|" * len(towers)]
    for name, key, scale in metrics:
        cells_out = []
        for t in towers:
            vals = [_row_value(r, key) for r in by_tower[t]]
            if any(v is None for v in vals):
                cells_out.append("–")
                continue
            vals = [scale * float(v) for v in vals]
            digits = 3 if key == "final_loss" else (0 if key == "total_s" else 1)
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells_out.append(f"{statistics.fmean(vals):.{digits}f} ± {sd:.{digits}f}")
        lines.append(f"| {name} | " + " | ".join(cells_out) + " |")
    return "\n".join(lines) + "\n"


