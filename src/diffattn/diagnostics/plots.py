"""Plots (matplotlib, Agg backend, PNG): maps A1, A2 and their difference, λ / gate per layer, corruption curves
and needle-retrieval grids. Every function writes one PNG atomically and returns its path."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..io import atomic_write_file

__all__ = ["plot_maps", "plot_lambdas", "plot_corruption_curves", "plot_needle_grid", "plot_cls_maps"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    plt = _plt()
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path must end in .png, got {str(path)!r}")
    with atomic_write_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _as_2d(name: str, a) -> torch.Tensor:
    a = torch.as_tensor(a).detach().float().cpu()
    while a.dim() > 2:
        a = a.mean(dim=0)  # average batch and heads
    if a.dim() != 2:
        raise ValueError(f"{name} must be a map of at least 2 dims (…, Nq, Nk), got shape {tuple(a.shape)}")
    return a


def plot_maps(first, second, combined, path, *, title: str = "", tokens: Sequence[str] | None = None) -> Path:
    """Heat maps of A1, A2 and the combined map side by side (each averaged over batch and heads). The combined
    map uses a diverging colour scale centred on 0 (it is signed). ``second=None`` plots A1 and the combined map."""
    plt = _plt()
    panels = [("A1", _as_2d("first", first), "viridis")] if first is not None else []
    if second is not None:
        panels.append(("A2", _as_2d("second", second), "viridis"))
    c = _as_2d("combined", combined)
    panels.append(("A1 − λA2" if second is not None else "combined", c, "RdBu_r"))
    # constrained layout places every colour bar beside its own panel, clear of the next panel's labels
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6), squeeze=False, layout="constrained")
    for ax, (name, a, cmap) in zip(axes[0], panels):
        if cmap == "RdBu_r":
            v = float(a.abs().max()) or 1.0
            im = ax.imshow(a.numpy(), cmap=cmap, vmin=-v, vmax=v)
        else:
            im = ax.imshow(a.numpy(), cmap=cmap, vmin=0)
        ax.set_title(name)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        if tokens is not None and len(tokens) == a.shape[-1] <= 40:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle(title)
    return _save(fig, path)


def plot_cls_maps(maps: Mapping[str, torch.Tensor], grid: tuple[int, int], path, *, image=None,
                  num_prefix_tokens: int = 1, title: str = "") -> Path:
    """The CLS row of each map (name → (…, N, N)) over the gh × gw patch grid, beside the image when given
    (C, H, W) or (H, W, C). Signed maps use a diverging scale centred on 0."""
    plt = _plt()
    n = len(maps) + (image is not None)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.2), squeeze=False, layout="constrained")
    ax_iter = iter(axes[0])
    if image is not None:
        img = torch.as_tensor(image).detach().float().cpu()
        if img.dim() == 3 and img.shape[0] in (1, 3):
            img = img.permute(1, 2, 0)
        img = (img - img.min()) / (img.max() - img.min() + 1e-12)
        ax = next(ax_iter)
        ax.imshow(img.squeeze(-1).numpy(), cmap="gray" if img.shape[-1] == 1 else None)
        ax.set_title("image")
        ax.axis("off")
    for name, a in maps.items():
        row = _as_2d(name, a)[0, num_prefix_tokens:].reshape(grid)
        ax = next(ax_iter)
        if bool((row < 0).any()):
            v = float(row.abs().max()) or 1.0
            im = ax.imshow(row.numpy(), cmap="RdBu_r", vmin=-v, vmax=v)
        else:
            im = ax.imshow(row.numpy(), cmap="viridis")
        ax.set_title(name)
        ax.axis("off")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle(title)
    return _save(fig, path)


def plot_lambdas(values: Sequence, path, *, label: str = "λ", title: str = "") -> Path:
    """λ (or the mean gate) per layer: ``values[l]`` is a scalar or a tensor of per-head (or per-token) values;
    plots the mean per layer with the min–max range over heads/tokens."""
    plt = _plt()
    if not len(values):
        raise ValueError("values must hold one entry per layer, got none")
    v = [torch.as_tensor(x).detach().float().flatten() for x in values]
    mean = [float(x.mean()) for x in v]
    lo = [float(x.min()) for x in v]
    hi = [float(x.max()) for x in v]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    layers = list(range(len(v)))
    ax.plot(layers, mean, marker="o", label=f"mean {label}")
    ax.fill_between(layers, lo, hi, alpha=0.25, label="min–max over heads")
    ax.set_xlabel("layer")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def plot_corruption_curves(table: Mapping[str, Mapping[int, float]], path, *, clean: float | None = None,
                           title: str = "accuracy under corruption") -> Path:
    """Accuracy vs severity, one line per corruption (``table[corruption][severity] = accuracy``)."""
    plt = _plt()
    if not table:
        raise ValueError("table must hold at least one corruption")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in table.items():
        sev = sorted(row)
        ax.plot(sev, [row[s] for s in sev], marker="o", label=name)
    if clean is not None:
        ax.axhline(clean, color="k", ls="--", lw=1, label="clean")
    ax.set_xlabel("severity")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=6, ncol=2)
    ax.set_title(title)
    return _save(fig, path)


def plot_needle_grid(grid: Mapping[int, Mapping[float, float]], path, *, title: str = "needle retrieval") -> Path:
    """Accuracy heat map: rows = needle depth (fraction of the context), columns = context length in tokens
    (``grid[length][depth] = accuracy``)."""
    plt = _plt()
    lengths = sorted(grid)
    depths = sorted({d for row in grid.values() for d in row})
    data = torch.tensor([[grid[n].get(d, math.nan) for n in lengths] for d in depths])
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(lengths), 1.2 + 0.5 * len(depths)))
    im = ax.imshow(data.numpy(), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not math.isnan(float(data[i, j])):
                ax.text(j, i, f"{float(data[i, j]):.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(title)
    return _save(fig, path)
