"""ViT vs DiffViT vs DGViT on Fashion-MNIST, clean and under noise (M-DGSA 2025, §5.1).

M-DGSA (2025) reports that differential gated self-attention (DGViT) keeps more accuracy than a ViT and a
DiffViT (Ye et al. 2024's differential attention in a ViT) when Gaussian noise is added to the images. Here the
three nano models (same width, depth and heads; only the attention differs) are trained from scratch with the same
recipe, seed and budget through ``diffattn train`` (task ``classify``, the train split standardised with its own
pixel mean / std), then evaluated on the test split:

- clean accuracy;
- Gaussian noise: x + σ·ε on [0, 1] pixels (ε ~ N(0, I), one fixed draw per σ, no clipping), then the same
  standardisation, at each σ of ``noise_levels`` (:func:`diffattn.eval.noise_robustness`);
- common corruptions (Hendrycks & Dietterich 2019) at ``severities``: mean accuracy and
  mCE = 100 − 100 · mean accuracy (:func:`diffattn.eval.robustness.corrupt_images` and
  :func:`~diffattn.eval.robustness.mean_corruption_error`; the corrupted images are made once per study, with
  corruption seed 0, and shared by every model and seed).

Control (:data:`CONTROL`, stated before any comparison): the baseline (ViT) must classify at least 50 % of the clean
test images right, five times chance (10 %: ten balanced classes); below that the models are not compared.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import get_dataset
from ..data.transforms import pixel_stats
from ..eval import noise_robustness
from ..eval.robustness import COMMON_CORRUPTIONS, corrupt_images, mean_corruption_error
from ..factory import from_pretrained
from ..train.config import config_from_dict
from ..train.loop import train
from ..utils import device_errors
from . import claims
from .base import Study, StudyConfig
from .common import minimum_errors, require_datasets
from .protocol import PROTOCOL_DEFAULTS, lr_text, protocol_errors
from .report import Control, Metric, run_seeds

__all__ = ["DGViTStudy", "VARIANTS", "DEFAULTS", "CONTROL", "train_and_evaluate"]

#: variant → (registered model, label)
VARIANTS: dict[str, tuple[str, str]] = {
    "vit": ("vit_nano", "ViT"),
    "diff_vit": ("diff_vit_nano", "DiffViT"),
    "dg_vit": ("dg_vit_nano", "DGViT"),
}
#: the positive control: the baseline's clean test accuracy, at least 50 % (chance: 10 %, ten balanced classes)
CONTROL = Control("baseline clean test accuracy (%; chance 10 %)", "clean", 50.0, scale=100.0)
#: the budget (diffattn/configs/studies/dgvit.yaml)
DEFAULTS: dict[str, Any] = {
    "steps": 600, "batch_size": 32, "lr": 2.0e-3, "weight_decay": 0.05, "warmup_steps": 20,
    "label_smoothing": 0.1, "model": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10},
    "test_images": 500, "noise_levels": [0.1, 0.2, 0.4],
    "corruptions": ["gaussian_noise", "defocus_blur", "contrast", "jpeg_compression"],
    "severities": [1, 3, 5], "threads": 1, "device": None, **PROTOCOL_DEFAULTS,
}


def _train_config(cfg: dict[str, Any], variant: str, seed: int, progress: bool):
    return config_from_dict({
        "task": {"name": "classify", "label_smoothing": cfg["label_smoothing"]},
        "model": {"name": VARIANTS[variant][0], "overrides": dict(cfg["model"])},
        "data": {"name": "fashion_mnist"},
        "optim": {"lr": cfg["lr"], "weight_decay": cfg["weight_decay"], "warmup_steps": cfg["warmup_steps"]},
        "run": {"steps": cfg["steps"], "batch_size": cfg["batch_size"], "seed": seed, "threads": cfg["threads"],
                "log_every": max(1, cfg["steps"] // 10), "ckpt_every": cfg["steps"], "keep_last": 1,
                "progress": progress, "device": cfg["device"]},
    })


def test_set(cfg: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The evaluation images, the same for every variant and seed: ``test_images`` Fashion-MNIST test images
    (a fixed random subset), their labels, and every (corruption, severity) version of them (corruption seed 0),
    computed once per study because corrupting is the slow part."""
    test = get_dataset("fashion_mnist", split="test")
    pick = np.random.default_rng(0).permutation(len(test.images))[:cfg["test_images"]]
    images = np.asarray(test.images)[pick]  # (N, 28, 28) uint8
    corrupted = {}
    for c in cfg["corruptions"]:
        for sev in cfg["severities"]:
            corrupted[(c, sev)] = corrupt_images(images, c, sev, seed=0)
    return {"images": images, "labels": torch.as_tensor(np.asarray(test.labels)[pick], dtype=torch.long),
            "corrupted": corrupted}


def _to_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W) → (N, 1, H, W) floats in [0, 1]."""
    return torch.as_tensor(np.asarray(images), dtype=torch.float32)[:, None] / 255.0


@torch.no_grad()
def _accuracy(predict, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    return sum(int((predict(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, len(y), batch)) \
        / len(y)


def train_and_evaluate(cfg: dict[str, Any], variant: str, seed: int, run_dir: Path, test: dict[str, Any],
                       progress: bool = True) -> dict[str, Any]:
    """Train one variant at one seed into ``run_dir`` (``diffattn train``) and evaluate it on ``test``
    (:func:`test_set`; module docstring)."""
    t0 = time.perf_counter()
    result = train(_train_config(cfg, variant, seed, progress), out=run_dir, overwrite=True)  # a seed rerun
    train_s = time.perf_counter() - t0
    model = from_pretrained(run_dir / "model").eval()
    mean, std = pixel_stats(get_dataset("fashion_mnist", split="train").images)

    def predict(x01: torch.Tensor) -> torch.Tensor:  # (B, 1, H, W) pixels in [0, 1] → logits (B, 10)
        return model((x01 - mean) / std)

    labels = test["labels"]
    noise = noise_robustness(predict, _to_unit(test["images"]), labels, levels=(0.0, *cfg["noise_levels"]),
                             seed=seed)
    table: dict[str, dict[int, float]] = {}
    for (c, sev), imgs in test["corrupted"].items():
        table.setdefault(c, {})[sev] = _accuracy(predict, _to_unit(imgs), labels)
    mean_acc = float(np.mean([a for row in table.values() for a in row.values()]))
    return {"params": sum(p.numel() for p in model.parameters()), "train_seconds": round(train_s, 1),
            "final_loss": result["final_loss"],
            "mean_train_loss": sum(result["losses"]) / len(result["losses"]) if result["losses"] else None,
            "clean": noise[0.0],
            "noise": {f"{s:g}": noise[float(s)] for s in cfg["noise_levels"]},
            "corruptions": {"mean_accuracy": mean_acc, "mce": mean_corruption_error(table),
                            "table": {c: {str(k): v for k, v in row.items()} for c, row in table.items()}}}


def _metrics(cfg: dict[str, Any]) -> list[Metric]:
    chance = 1 / cfg["model"]["num_classes"] if cfg.get("model", {}).get("num_classes") else None  # balanced classes
    return [Metric("final train loss", "final_loss", 1.0, 3, False),
            Metric("clean test accuracy (%)", "clean", 100.0, 1, chance=chance),
            *[Metric(f"accuracy, Gaussian noise σ = {s:g} (%)", f"noise.{s:g}", 100.0, 1, chance=chance,
                     claim=claims.NOISE_ROBUSTNESS) for s in cfg["noise_levels"]],
            Metric("corruptions: mean accuracy (%)", "corruptions.mean_accuracy", 100.0, 1, chance=chance,
                   claim=claims.CORRUPTION_ROBUSTNESS),
            Metric("corruptions: mCE", "corruptions.mce", 1.0, 1, False)]


#: the evaluation images of a process, by (test_images, corruptions, severities) (:func:`test_set`)
_TEST_SETS: dict[str, dict[str, Any]] = {}


class DGViTStudy(Study, name="dgvit", title="Study: ViT vs DiffViT vs DGViT under noise", variants=VARIANTS,
                 defaults=DEFAULTS, control=CONTROL):
    """The dgvit study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("steps", "batch_size", "test_images", "threads"), where)
        if not cfg["noise_levels"] or any(not isinstance(s, (int, float)) or s <= 0 for s in cfg["noise_levels"]):
            errors.append(f"noise_levels in {where} must be a non-empty list of numbers > 0, got "
                          f"{cfg['noise_levels']!r}")
        if any(s not in (1, 2, 3, 4, 5) for s in cfg["severities"]) or not cfg["severities"]:
            errors.append(f"severities in {where} must be a non-empty list from 1..5, got {cfg['severities']!r}")

        bad = [c for c in cfg["corruptions"] if c not in COMMON_CORRUPTIONS]
        if bad or not cfg["corruptions"]:
            errors.append(f"corruptions in {where} must be a non-empty list from {list(COMMON_CORRUPTIONS)}, got "
                          f"{cfg['corruptions']!r}")
        errors += protocol_errors(cfg, where) + device_errors(cfg, where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every variant at every seed (``<out>/seed<k>/<variant>/`` run folders), aggregated."""
        require_datasets(["fashion_mnist"], "the dgvit study")
        key = repr((cfg["test_images"], cfg["corruptions"], cfg["severities"]))

        def one_seed(seed: int, folder: Path) -> dict:
            test = _TEST_SETS.get(key)
            if test is None:  # once per process: protocol (b) calls this once per model and lr
                print(f"[study dgvit] corrupting {cfg['test_images']} test images once for every model", flush=True)
                test = _TEST_SETS[key] = test_set(cfg, progress)
            res = {}
            for v in cfg["variants"]:
                print(f"[study dgvit] seed {seed}: {VARIANTS[v][1]} ({VARIANTS[v][0]}) -> {folder / v}", flush=True)
                res[VARIANTS[v][1]] = r = train_and_evaluate(cfg, v, seed, folder / v, test, progress)
                print(f"[study dgvit] {VARIANTS[v][1]}: clean {100 * r['clean']:.1f} %, mCE "
                      f"{r['corruptions']['mce']:.1f}, {r['train_seconds']:.0f} s training", flush=True)
            return res

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        first = next(iter(per_seed.values()))
        first = next(iter(first.values()))
        intro = (f"ViT vs DiffViT vs DGViT (M-DGSA 2025, §5.1): nano models ({first['params']:,} parameters for "
                 f"{VARIANTS[cfg['variants'][0]][1]}; patch {cfg['model']['patch_size']}, 28×28 grey) trained from "
                 f"scratch on Fashion-MNIST for {cfg['steps']} steps of {cfg['batch_size']} images (AdamW "
                 f"{lr_text(cfg)}, label smoothing {cfg['label_smoothing']}), evaluated on {cfg['test_images']} test "
                 f"images: clean, with Gaussian noise of σ ∈ {cfg['noise_levels']} added to [0, 1] pixels, and under "
                 f"{', '.join(cfg['corruptions'])} at severities {cfg['severities']} (mCE = 100 − 100 · "
                 f"mean accuracy).")
        return self.write_report(cfg, intro, per_seed, _metrics(cfg), seconds)

    def tuning_score(self, cfg: StudyConfig, result: Mapping[str, Any]) -> tuple[float, float]:
        """Protocol (b)'s ranking of one run (:func:`.protocol.select_lr`), from the training split alone (the test
        images are the same for every seed): minus the area under the training-loss curve (its mean over the steps) and
        minus the final training loss."""
        return -result["mean_train_loss"], -result["final_loss"]

