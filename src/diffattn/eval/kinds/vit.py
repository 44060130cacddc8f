"""Vision transformers (logits over classes): top-1 / top-5 / mean per-class recall on the test split; accuracy
under Gaussian input noise (M-DGSA (2025) §5.1); a corruption × severity table and mCE (Hendrycks & Dietterich
2019); attention diagnostics with CLS rollout.

A model with a patch embedding and ``forward_features`` (diffattn's ``VisionTransformer``) is one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...data import get_dataset
from ...data.transforms import pixel_stats
from ...diagnostics.plots import plot_corruption_curves
from ...errors import UsageError
from ..classification import classification_chance, classification_metrics
from ..robustness import COMMON_CORRUPTIONS, corruption_table, noise_robustness
from ..sampling import stratified_subset
from .base import EvalContext, EvalKind, attention_diagnostics, image_sample

__all__ = ["VIT"]

#: (channels, image size) → the built-in dataset a model of that input is evaluated on by default
DEFAULT_DATASETS = {(1, 8): "digits", (1, 28): "fashion_mnist"}


def recognises(model: nn.Module, layout: str) -> bool:
    """A vision transformer: a patch embedding and ``forward_features``."""
    return hasattr(model, "patch_embed") and hasattr(model, "forward_features")


def _standardise(x_tr: np.ndarray, x: np.ndarray, size: int, chans: int) -> torch.Tensor:
    """uint8 (N, H, W[, C]) → float (N, C, size, size): /255, standardised with the train split's mean and std."""

    mean, std = pixel_stats(x_tr)
    t = torch.tensor(x, dtype=torch.float32) / 255.0
    t = t[:, None] if t.dim() == 3 else t.permute(0, 3, 1, 2)
    if t.shape[1] == 1 and chans == 3:
        t = t.expand(-1, 3, -1, -1)
    elif t.shape[1] == 3 and chans == 1:
        t = t.mean(1, keepdim=True)
    if t.shape[-1] != size:
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return (t - mean) / std


def run(ctx: EvalContext) -> dict:
    """The vision suite: classification, noise, corruptions and attention diagnostics on ``ctx.dataset`` (default:
    the built-in set of the model's input size, :data:`DEFAULT_DATASETS`)."""
    model, p, out, seed, device = ctx.model, ctx.protocol, ctx.out, ctx.seed, ctx.device
    size, chans = model.patch_embed.img_size, model.patch_embed.proj.in_channels
    dataset = ctx.dataset
    if dataset is None:
        dataset = DEFAULT_DATASETS.get((chans, size))
        if dataset is None:
            raise UsageError(f"no default dataset for {chans}-channel {size}×{size} images: pass --dataset")
    tr, te = get_dataset(dataset, split="train"), get_dataset(dataset, split="test")
    idx = stratified_subset(te.labels, p["max_images"], seed)
    x_tr, x_te = np.asarray(tr.images), np.asarray(te.images)[idx]
    y_te = torch.as_tensor(np.asarray(te.labels)[idx])

    def transform(imgs):
        return _standardise(x_tr, imgs, size, chans)

    def predict(x):
        return model(x.to(device)).float().cpu()

    x = transform(x_te)
    with torch.no_grad():
        logits = torch.cat([predict(x[i:i + 256]) for i in range(0, len(x), 256)])
    who = f"{ctx.who} on {dataset}"
    res: dict[str, Any] = {"dataset": dataset, "split": "test", "images": len(y_te),
                           "preprocessing": "pixels/255, standardised with the train split's mean and std"}
    res["classification"] = classification_metrics(logits, y_te)
    res["num_classes"] = int(logits.shape[1])  # the classes the model chooses among, whichever the subset holds
    res["chance"] = classification_chance("classification", res["classification"], res["num_classes"])
    res["noise"] = {str(k): v for k, v in noise_robustness(predict, x, y_te, p["noise_levels"], seed=seed).items()}
    table = corruption_table(predict, x_te, y_te, transform, corruptions=p["corruptions"] or COMMON_CORRUPTIONS,
                             severities=p["severities"], seed=seed, progress=ctx.progress)
    res["corruptions"] = {"clean": table["clean"], "mce": table["mce"], "mean_accuracy": table["mean_accuracy"],
                          "table": {c: {str(s): a for s, a in row.items()} for c, row in table["table"].items()}}
    plots = [plot_corruption_curves(table["table"], out / "corruptions.png", clean=table["clean"],
                                    title=f"accuracy under corruption\n{who}").name]
    grid = (size // model.patch_embed.patch_size,) * 2
    diag, _ = attention_diagnostics(model, model, x[:8], out, "vision", grid=grid, device=device, who=who)
    res["diagnostics"] = diag
    res["plots"] = plots + diag.pop("plots")
    return res


#: the vision transformer kind (registered by :mod:`diffattn.eval.kinds`)
VIT = EvalKind(
    name="vit", label="vision transformer", suite="vision", groups=("classification", "noise", "corruptions"),
    datasets=("digits", "fashion_mnist"), recognises=recognises, run=run, sample=image_sample)
