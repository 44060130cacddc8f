"""Object attention of YOLO detectors: how much the attention layers of a detector look at the objects.

A detector's attention layers (Ultralytics' C2PSA ``Attention``, :class:`~diffattn.detect.DiffPSAAttention`,
:class:`~diffattn.detect.DiffAttention2d`) work on the N = h·w tokens of a feature map, with no CLS token. The
attention-noise question of Ye et al. 2024 (§3.4: does the differential map put less mass on irrelevant context?) and
Hammoud & Ghanem 2025 (DiffCLIP §4: attention on the object vs the background) becomes: for the feature-map tokens
that lie on a labelled object, how much of their attention goes to object tokens and how much to background tokens.
:func:`object_attention` captures every attention layer with :func:`diffattn.diagnostics.capture_attention` over
images of a YOLO dataset and reduces the union of each image's boxes to the layer's grid
(:func:`diffattn.diagnostics.patch_mask`); :func:`diffattn.diagnostics.foreground_attention` with
``query="foreground"`` gives the mass and per-token density inside vs outside the objects. ``density_ratio`` > 1
means object tokens look at objects more than at the background; a uniform map gives 1.

Command line (:mod:`diffattn.app.eval`), over the runs of ``diffattn study detection`` (needs
``diffattn[detect]``)::

    diffattn object-attention --results runs/studies/detection/detection.json [--results more/detection.json] \\
        --out runs/studies/detection/object_attention.md

It reads each run's ``best.pt`` and the val split of the data the runs trained on, and writes a Markdown table of
``density_ratio`` per model and layer (mean ± std over seeds, paired difference from the first model) and the rows
as JSON beside it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn

from ..detect.offline import offline_env
from ..diagnostics import capture_attention, foreground_attention, patch_mask

__all__ = ["detection_images", "object_attention", "compare_object_attention", "object_attention_table"]


def detection_images(data_yaml: str | Path, split: str = "val", imgsz: int = 128,
                     limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of a YOLO dataset split as (B, 3, imgsz, imgsz) floats in [0, 1], and the union of each image's
    boxes as a pixel mask (B, imgsz, imgsz) bool. Images are resized to a square (the exporter of
    :mod:`diffattn.data.detection` writes square images, so nothing is distorted there); labels are YOLO rows
    ``class cx cy w h`` in [0, 1]."""
    import numpy as np
    import yaml
    from PIL import Image

    data_yaml = Path(data_yaml)
    if not data_yaml.is_file():
        raise FileNotFoundError(f"data_yaml must be a YOLO dataset YAML, got {str(data_yaml)!r} (no such file)")
    cfg = yaml.safe_load(data_yaml.read_text())
    if split not in cfg:
        raise ValueError(f"split must be a split of {data_yaml} ({[k for k in ('train', 'val', 'test') if k in cfg]})"
                         f", got {split!r}")
    root = Path(cfg.get("path") or data_yaml.parent)
    root = root if root.is_absolute() else data_yaml.parent / root
    image_dir = root / cfg[split]
    paths = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))[:limit]
    if not paths:
        raise ValueError(f"no images in {image_dir}")
    parts = list(image_dir.parts)  # Ultralytics' layout: the labels of .../images/<split> are in .../labels/<split>
    if "images" not in parts:
        raise ValueError(f"{image_dir} has no 'images' folder, so its 'labels' folder is unknown (YOLO layout)")
    i = len(parts) - 1 - parts[::-1].index("images")
    label_dir = Path(*parts[:i], "labels", *parts[i + 1:])
    images, masks = [], []
    for p in paths:
        img = np.asarray(Image.open(p).convert("RGB").resize((imgsz, imgsz), Image.BILINEAR))
        images.append(torch.from_numpy(img.copy()).permute(2, 0, 1).float() / 255.0)  # (3, S, S)
        mask = torch.zeros(imgsz, imgsz, dtype=torch.bool)
        label = label_dir / (p.stem + ".txt")
        for line in (label.read_text().splitlines() if label.is_file() else []):
            if line.strip():
                _, cx, cy, w, h = (float(v) for v in line.split()[:5])
                x0, x1 = round((cx - w / 2) * imgsz), round((cx + w / 2) * imgsz)
                y0, y1 = round((cy - h / 2) * imgsz), round((cy + h / 2) * imgsz)
                mask[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = True
        masks.append(mask)
    return torch.stack(images), torch.stack(masks)


def _grid(n: int, height: int, width: int) -> tuple[int, int]:
    """The (h, w) feature grid with h·w = n tokens for an input of height × width (one stride for both sides)."""
    s = math.sqrt(height * width / n)
    h, w = round(height / s), round(width / s)
    if h * w != n:
        raise ValueError(f"cannot place {n} tokens on a grid for an input of {height}×{width}")
    return h, w


@torch.no_grad()
def object_attention(model: nn.Module, images: torch.Tensor, masks: torch.Tensor, *,
                     modes: Sequence[str] = ("signed", "relu"), threshold: float = 0.5) -> dict[str, dict]:
    """For every attention layer of ``model`` (a YOLO ``DetectionModel``, or any model whose attention
    :func:`~diffattn.diagnostics.capture_attention` records over a feature map): ``{layer: {"grid": [h, w],
    "images": n, "object_share": f, mode: foreground_attention(...)}}``. ``images`` (B, 3, H, W); ``masks``
    (B, H, W) the union of each image's boxes. Only images whose mask gives the layer's grid at least one object and
    one background token (coverage ≥ ``threshold``) count; ``object_share`` is the mean fraction of object tokens
    among them (what a uniform map would put on the objects)."""
    if images.dim() != 4 or masks.dim() != 3 or masks.shape[0] != images.shape[0] \
            or masks.shape[-2:] != images.shape[-2:]:
        raise ValueError(f"images must be (B, 3, H, W) and masks (B, H, W) of the same B, H, W, got "
                         f"{tuple(images.shape)} and {tuple(masks.shape)}")
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model) as cap:
            model(images)
    finally:
        model.train(was_training)
    out = {}
    for m in cap.layers:
        grid = _grid(m.combined.shape[-1], images.shape[-2], images.shape[-1])
        fg = patch_mask(masks, grid, threshold)  # (B, h·w)
        keep = fg.any(1) & (~fg).any(1)
        if not bool(keep.any()):
            raise ValueError(f"no image has both object and background tokens on the {grid} grid of {m.name}")
        row = {"grid": list(grid), "images": int(keep.sum()), "object_share": float(fg[keep].float().mean())}
        for mode in modes:
            row[mode] = foreground_attention([m.combined[keep]], masks[keep], grid, num_prefix_tokens=0,
                                             mode=mode, query="foreground", threshold=threshold)
        out[m.name] = row
    return out


def _layer_keys(rows: Sequence[dict]) -> list[str]:
    """Per row, its attention module by YOLO layer index, the same across model YAMLs: ``model.10.m.0.attn`` and
    ``model.10.attn`` → ``model.10``; a second attention module inside the same YOLO layer of the same run (a block
    repeated n times) → ``model.10#1``, and so on, so no two modules of a run share a key."""
    seen: dict[tuple, int] = {}
    keys = []
    for r in rows:
        prefix = ".".join(r["layer"].split(".")[:2])
        j = seen.get((r["model"], r["seed"], prefix), 0)
        seen[r["model"], r["seed"], prefix] = j + 1
        keys.append(prefix if j == 0 else f"{prefix}#{j}")
    return keys


def compare_object_attention(runs: Sequence[dict], data_yaml: str | Path, *, split: str = "val", imgsz: int = 128,
                             limit: int | None = None) -> list[dict]:
    """:func:`object_attention` of every run of ``diffattn study detection`` (the rows of its ``detection.json``:
    ``model``, ``seed``, ``weights``) on the same images; one row per run and layer."""
    offline_env()
    from ultralytics import YOLO

    from ..detect import register

    register()  # the differential modules, so that their checkpoints load

    images, masks = detection_images(data_yaml, split, imgsz, limit)
    rows = []
    for r in runs:
        model = YOLO(r["weights"]).model.float()
        for layer, res in object_attention(model, images, masks).items():
            rows.append({"model": r["model"], "seed": r["seed"], "layer": layer, **res})
    return rows


def object_attention_table(rows: Sequence[dict], mode: str = "signed") -> str:
    """Markdown: ``density_ratio`` (``mode``) per model and YOLO layer, mean ± std over seeds, and the paired
    difference from the first model (same seed and layer) with how many seeds are higher and the two-sided paired
    t-test's p (scipy's ``ttest_1samp`` on the differences)."""
    from scipy.stats import ttest_1samp

    models = list(dict.fromkeys(r["model"] for r in rows))
    keys = _layer_keys(rows)
    layers = list(dict.fromkeys(keys))
    val = {(r["model"], key, r["seed"]): r[mode]["density_ratio"] for r, key in zip(rows, keys)}
    lines = [f"| model | layer | object / background density ({mode}) | Δ vs {models[0].removesuffix('.yaml')} "
             "(paired) | p (paired t) | object tokens | seeds |", "|---|---|---|---|---|---|---|"]

    def ms(xs):
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

    for model in models:
        for layer in layers:
            seeds = sorted(s for (m, lay, s) in val if m == model and lay == layer)
            if not seeds:
                continue
            m, s = ms([val[model, layer, k] for k in seeds])
            diffs = [val[model, layer, k] - val[models[0], layer, k] for k in seeds if (models[0], layer, k) in val]
            delta = pval = "–"
            if model != models[0] and diffs:
                dm, ds = ms(diffs)
                delta = f"{dm:+.2f} ± {ds:.2f} (higher on {sum(d > 0 for d in diffs)} of {len(diffs)})"
                if len(diffs) > 1:
                    pval = "1.00" if ds == 0 and dm == 0 else f"{ttest_1samp(diffs, 0.0).pvalue:.2f}"
            share = statistics.fmean(r["object_share"] for r, key in zip(rows, keys)
                                     if r["model"] == model and key == layer)
            lines.append(f"| {model.removesuffix('.yaml')} | {layer} | {m:.2f} ± {s:.2f} | {delta} | {pval} | "
                         f"{100 * share:.0f} % | {len(seeds)} |")
    return "\n".join(lines) + "\n"

