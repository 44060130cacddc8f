"""The figures of the DiffCLIP demo (:mod:`.diffclip_demo`): learning curves, λ per layer, and the CLS attention of
the last vision layer of every model over the same test images, the foreground outlined (:func:`attention_maps`,
:func:`plot_attention`). Drawn with :func:`diffattn.diagnostics.plots.pyplot` and saved with
:func:`~diffattn.diagnostics.plots.save_figure`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import get_dataset
from ..diagnostics import capture_attention
from ..diagnostics import plots as diag_plots
from ..layers import ATTENTION_TYPES, attention_class

__all__ = ["kind_title", "is_signed_kind", "plot_learning_curves", "plot_lambdas", "plot_attention", "attention_maps"]


def plot_learning_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    plt = diag_plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, rows in curves.items():
        ax.plot([s for s, _ in rows], [v for _, v in rows], label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("contrastive loss (train batch)")
    ax.legend(fontsize=8)
    ax.set_title("learning curves (same data, seed and budget)")
    return diag_plots.save_figure(fig, path)


def plot_lambdas(lams: dict[str, dict[str, list[float]]], path: Path) -> Path:
    plt = diag_plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, towers in lams.items():
        names = [f"{t} {i}" for t, v in towers.items() for i in range(len(v))]
        vals = [x for v in towers.values() for x in v]
        if vals:
            ax.plot(names, vals, marker="o", label=label)
    ax.set_xlabel("tower and layer")
    ax.set_ylabel("λ (mean over heads)")
    ax.legend(fontsize=8)
    ax.set_title("learned λ per layer (Ye et al. 2024 eq. 2 re-parameterisation)")
    return diag_plots.save_figure(fig, path)


def kind_title(kind: str) -> str:
    """How the attention figure names a layer kind (:attr:`diffattn.diagnostics.LayerMaps.kind`) in a row's
    title, asking the kind's class: "softmax" for standard attention, "<title>: A1 − λA2, signed" for a
    differential kind; another kind ("retrofit") by its name."""
    if kind not in ATTENTION_TYPES:
        return kind
    cls = attention_class(kind)
    return f"{cls.title}: A1 − λA2, signed" if cls.differential else "softmax"


def is_signed_kind(kind: str | None) -> bool:
    """Whether a layer kind's maps are signed (a differential kind, or another captured module, e.g. a retrofit,
    whose map may be): every kind but softmax attention."""
    return kind is not None and not (kind in ATTENTION_TYPES and not attention_class(kind).differential)


def plot_attention(images: torch.Tensor, masks: torch.Tensor, cls_maps: dict[str, torch.Tensor], grid, path: Path,
                    rgb: np.ndarray, kinds: dict[str, str] | None = None) -> Path:
    """Row 0: the images with their foreground outline; one row per model: the last layer's CLS attention (mean over
    heads) over the patch grid, one colour scale per model, stated in the row's title because the rows' ranges
    differ by an order of magnitude (a softmax map reaches 0.3, a differential one ±0.01). A row is titled by its
    layer's kind (``kinds[label]``, :func:`kind_title`), never by its values' sign: a differential map without a
    negative entry is still differential. Its colour scale is diverging and centred on 0 for a map that can be
    signed (any kind but standard softmax) or has negative entries, else from 0. A uniform map says so."""
    plt = diag_plots.pyplot()
    n, rows = len(images), 1 + len(cls_maps)
    fig, axes = plt.subplots(rows, n, figsize=(1.9 * n, 1.9 * rows), squeeze=False)
    H, W = masks.shape[-2:]
    for j in range(n):
        ax = axes[0, j]
        ax.imshow(rgb[j], extent=(0, W, H, 0))
        ax.contour(masks[j].float().numpy(), levels=[0.5], colors="k", linewidths=0.6)
        ax.axis("off")
    axes[0, 0].set_title("image", fontsize=8, loc="left")
    for i, (label, maps) in enumerate(cls_maps.items(), start=1):
        v = float(maps.abs().max()) or 1.0
        kind = (kinds or {}).get(label)
        signed = is_signed_kind(kind) or bool((maps < 0).any())  # diverging, centred on 0; else from 0
        style = dict(cmap="RdBu_r", vmin=-v, vmax=v) if signed else dict(cmap="viridis", vmin=0, vmax=v)
        for j in range(n):
            ax = axes[i, j]
            im = ax.imshow(maps[j].reshape(grid).numpy(), extent=(0, W, H, 0), **style)
            ax.contour(masks[j].float().numpy(), levels=[0.5], colors="k", linewidths=0.6)
            if not signed and diag_plots.is_uniform(maps[j]):
                ax.text(0.5, 0.5, "uniform", transform=ax.transAxes, ha="center", va="center", fontsize=7,
                        color="white", bbox=dict(facecolor="black", alpha=0.6, lw=0))
            ax.set_xticks([])
            ax.set_yticks([])
        name = kind_title(kind) if kind is not None else ("signed" if signed else "non-negative")
        scale = f"±{v:.2g}" if signed else f"0 to {v:.2g}"
        axes[i, 0].set_title(f"{label} ({name}): own colour scale, {scale}", fontsize=8, loc="left")
        axes[i, 0].set_ylabel(f"{label}\npatch row", fontsize=9)
        fig.colorbar(im, ax=list(axes[i]), fraction=0.02)
    for j in range(n):
        axes[-1, j].set_xlabel("patch column", fontsize=8)
    fig.suptitle(f"CLS attention of the last vision layer over the {grid[0]}×{grid[1]} patch grid (mean over "
                 f"heads; black: foreground outline).\nEach row has its own colour scale, stated in its title: "
                 f"compare where a model looks, not colours across rows.", fontsize=9)
    return diag_plots.save_figure(fig, path)


@torch.no_grad()
def attention_maps(models: dict[str, Any], n: int = 6, dataset: str = "tuxpaint_captions"
                    ) -> tuple[torch.Tensor, torch.Tensor, dict, tuple, np.ndarray, dict[str, str]]:
    """The same ``n`` test images of ``dataset`` (an image–caption set with foreground masks: ``tuxpaint_captions``
    or ``emoji``) through every model: last-layer CLS rows (n, P), mean over heads, and each model's last-layer
    kind."""
    data = get_dataset(dataset, split="test")
    first = next(iter(models.values()))
    idx = list(range(0, len(data), max(1, len(data) // n)))[:n]
    images = torch.stack([first.eval_transform(data.load_image(i)) for i in idx])
    masks = torch.stack([data.load_mask(i) for i in idx])
    rgb = np.stack([np.asarray(data.load_image(i)) for i in idx])
    grid = (first.img_size // first.visual.patch_embed.patch_size,) * 2
    out, kinds = {}, {}
    for label, model in models.items():
        with capture_attention(model.visual) as cap:
            model.encode_image(images)
        out[label] = cap.layers[-1].combined.mean(dim=1)[:, 0, 1:]  # (n, P): CLS row over the patches
        kinds[label] = cap.layers[-1].kind
    return images, masks, out, grid, rgb, kinds
