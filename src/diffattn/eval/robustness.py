"""Robustness: common corruptions × severities and additive Gaussian input noise.

Corruptions (Hendrycks & Dietterich 2019 §3): the 15 ImageNet-C corruptions at severities 1–5, applied to uint8
images with the ``imagecorruptions`` package. Reported: accuracy per corruption and severity, their mean, and the
mean corruption error as the DiffCLIP and M-DGSA robustness tables use it, mCE = 100 − 100 · mean accuracy (the
unnormalised form: Hendrycks & Dietterich divide each corruption's error by AlexNet's, which a small model trained
here has no counterpart for).

Gaussian noise (M-DGSA (2025) §5.1): x + σ·ε with ε ~ N(0, I) added to the model's (normalised) input at each
level σ, accuracy per level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..progress import progress as progress_bar
from ._checks import as_tensor

__all__ = ["COMMON_CORRUPTIONS", "corrupt_images", "corruption_table", "mean_corruption_error", "noise_robustness"]

#: The 15 corruptions of ImageNet-C (Hendrycks & Dietterich 2019, Fig. 1), in their order.
COMMON_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)


def corrupt_images(images: np.ndarray, corruption: str, severity: int, *, seed: int = 0) -> np.ndarray:
    """Corrupt uint8 images (N, H, W) or (N, H, W, C) with C ∈ {1, 3}; returns the same shape and dtype.

    Grey images are corrupted as RGB (the grey value in all three channels) and averaged back. ``imagecorruptions``
    needs at least 32×32 pixels: smaller images are upsampled by pixel replication with the smallest integer factor
    f that reaches 32, corrupted, and averaged back over f×f blocks (a clean image round-trips exactly). ``seed``
    seeds numpy's global generator, which ``imagecorruptions`` draws from, so a table is reproducible.
    """
    from imagecorruptions import corrupt, get_corruption_names

    if corruption not in get_corruption_names("all"):
        raise ValueError(f"corruption must be one of {get_corruption_names('all')}, got {corruption!r}")
    if not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
        raise ValueError(f"images must be uint8 (N, H, W) or (N, H, W, C) with C in (1, 3), got {images.dtype} "
                         f"{images.shape}")
    grey = images.ndim == 3 or images.shape[-1] == 1
    rgb = np.repeat(images.reshape(*images.shape[:3], 1), 3, axis=-1) if grey else images
    N, H, W, _ = rgb.shape
    f = -(-32 // min(H, W))  # ceil(32 / min side)
    if f > 1:
        rgb = rgb.repeat(f, axis=1).repeat(f, axis=2)  # (N, fH, fW, 3)
    np.random.seed(seed)
    out = np.stack([np.asarray(corrupt(im, corruption_name=corruption, severity=severity)) for im in rgb])
    out = np.clip(out.astype(np.float64), 0, 255)
    if f > 1:
        out = out.reshape(N, H, f, W, f, 3).mean(axis=(2, 4))
    out = out.round().astype(np.uint8)
    if grey:
        out = out.astype(np.float32).mean(-1).round().astype(np.uint8).reshape(images.shape)
    return out


def _accuracy(predict: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor,
              batch_size: int) -> float:
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            correct += int((predict(x[i:i + batch_size]).argmax(-1).cpu() == y[i:i + batch_size]).sum())
    return correct / len(y)


def corruption_table(predict: Callable[[torch.Tensor], torch.Tensor], images: np.ndarray, labels,
                     transform: Callable[[np.ndarray], torch.Tensor], *,
                     corruptions: Sequence[str] = COMMON_CORRUPTIONS, severities: Sequence[int] = (1, 2, 3, 4, 5),
                     batch_size: int = 256, seed: int = 0, progress: bool = True) -> dict:
    """Accuracy of ``predict`` (a batch of model inputs → class scores) on clean and corrupted ``images``.

    images: uint8 (N, H, W[, C]); transform: uint8 images → the model's input batch (N, C, H, W).
    Returns ``{"clean": acc, "table": {corruption: {severity: acc}}, "mean_accuracy": …, "mce": …}`` with
    accuracies as fractions and mCE in percent (module docstring).
    """
    y = as_tensor("labels", labels, dim=1, floating=False).cpu()
    if len(y) != len(images):
        raise ValueError(f"labels must have one entry per image ({len(images)}), got {len(y)}")
    clean = _accuracy(predict, transform(np.asarray(images)), y, batch_size)
    table: dict[str, dict[int, float]] = {}
    jobs = [(c, s) for c in corruptions for s in severities]
    for c, s in progress_bar(jobs, desc="corruptions", disable=not progress, leave=False):
        x = transform(corrupt_images(images, c, s, seed=seed))
        table.setdefault(c, {})[s] = _accuracy(predict, x, y, batch_size)
    mean_acc = float(np.mean([a for row in table.values() for a in row.values()])) if table else float("nan")
    return {"clean": clean, "table": table, "mean_accuracy": mean_acc, "mce": mean_corruption_error(table)}


def mean_corruption_error(table: dict[str, dict[int, float]]) -> float:
    """mCE = 100 − 100 · mean accuracy over every (corruption, severity) cell of ``table`` (fractions in [0, 1])."""
    cells = [a for row in table.values() for a in row.values()]
    if not cells:
        raise ValueError("table must hold at least one (corruption, severity) accuracy")
    if any(not 0.0 <= a <= 1.0 for a in cells):
        raise ValueError(f"table accuracies must be fractions in [0, 1], got {cells}")
    return 100.0 - 100.0 * float(np.mean(cells))


def noise_robustness(predict: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, labels,
                     levels: Sequence[float] = (0.0, 0.1, 0.25, 0.5, 1.0), *, batch_size: int = 256,
                     seed: int = 0) -> dict[float, float]:
    """``{σ: accuracy}`` with x + σ·ε, ε ~ N(0, I) (one fixed draw per level from ``seed``), added to ``inputs``."""
    x = as_tensor("inputs", inputs, floating=True)
    y = as_tensor("labels", labels, dim=1, floating=False).cpu()
    if len(y) != len(x):
        raise ValueError(f"labels must have one entry per input ({len(x)}), got {len(y)}")
    if any(s < 0 for s in levels):
        raise ValueError(f"levels must be >= 0, got {list(levels)}")
    out = {}
    for s in levels:
        g = torch.Generator().manual_seed(seed)
        noisy = x + float(s) * torch.randn(x.shape, generator=g, dtype=x.dtype) if s > 0 else x
        out[float(s)] = _accuracy(predict, noisy, y, batch_size)
    return out
