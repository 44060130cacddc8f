"""Plots (matplotlib, Agg backend, PNG): maps A1, A2 and their difference, λ / gate per layer, corruption curves
and needle-retrieval grids. Every function writes one PNG atomically and returns its path.

What every figure says on itself: each panel's colour scale in its title (A1 and A2 share one, so they compare;
a signed map has its own, centred on 0), the axes (query / key token, CLS marked; patch row / column), what
rollout is (a subtitle), a map whose rows are uniform (entropy log N: it attends to nothing in particular), whole
numbers on layer and severity axes, and legend entries only for what is drawn."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..io import atomic_write_file

__all__ = ["plot_maps", "plot_lambdas", "plot_corruption_curves", "plot_needle_grid", "plot_cls_maps", "is_uniform",
           "ROLLOUT_NOTE", "pyplot", "save_figure"]


def pyplot():
    """matplotlib's ``pyplot`` on the non-interactive Agg backend (the ``plots`` extra); what every figure of the
    library and the studies draws with."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> Path:
    """Write ``fig`` to the PNG file ``path`` atomically (110 dpi, tight box) and close it; returns the path."""
    plt = pyplot()
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


def _scale(a: torch.Tensor, signed: bool) -> tuple[float, float, str]:
    """(vmin, vmax, the scale as the title states it) of a map: ±max|a| for a signed map, else 0 to its maximum."""
    v = float(a.abs().max()) or 1.0
    return (-v, v, f"scale ±{v:.2g}") if signed else (0.0, v, f"scale 0 to {v:.2g}")


def is_uniform(a: torch.Tensor, tol: float = 1e-3) -> bool:
    """Whether every row of the non-negative map ``a`` (…, N) is uniform: its entropy is log N within ``tol`` (a
    map that attends to nothing in particular, as a freshly initialised layer's)."""
    a = torch.as_tensor(a).detach().double()
    if a.shape[-1] < 2 or bool((a < 0).any()):
        return False
    p = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    h = -(p * p.clamp_min(1e-300).log()).sum(dim=-1)
    return bool((h >= math.log(a.shape[-1]) * (1 - tol)).all())


def _say_uniform(ax, n: int) -> None:
    ax.text(0.5, 0.5, f"uniform: every key gets 1/{n}\n(entropy = log {n})", transform=ax.transAxes, ha="center",
            va="center", fontsize=8, color="white", bbox=dict(facecolor="black", alpha=0.6, lw=0))


def plot_maps(first, second, combined, path, *, title: str = "", tokens: Sequence[str] | None = None,
              cls: bool = False) -> Path:
    """Heat maps of A1, A2 and the combined map side by side (each averaged over batch and heads). A1 and A2 share
    one colour scale from 0 (one colour bar); the combined map, signed, has a diverging scale centred on 0. Each
    panel's title states its scale; a uniform A1 or A2 says so on its panel. ``tokens`` label the key axis,
    ``cls=True`` marks token 0 as the CLS token. ``second=None`` plots A1 and the combined map."""
    plt = pyplot()
    softmax = [("A1", _as_2d("first", first))] if first is not None else []
    if second is not None:
        softmax.append(("A2", _as_2d("second", second)))
    c = _as_2d("combined", combined)
    signed = bool((c < 0).any())
    panels = softmax + [("A1 − λA2" if second is not None else "combined", c)]
    vmax = max((float(a.max()) for _, a in softmax), default=0.0) or 1.0
    # constrained layout places every colour bar beside its own panel, clear of the next panel's labels
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), squeeze=False, layout="constrained")
    axis = "token (0 = CLS)" if cls else "token"
    for i, (ax, (name, a)) in enumerate(zip(axes[0], panels)):
        if i < len(softmax):
            im = ax.imshow(a.numpy(), cmap="viridis", vmin=0, vmax=vmax)
            label = f"scale 0 to {vmax:.2g}" + (", shared with A2" if name == "A1" and len(softmax) > 1 else
                                                 ", shared with A1" if name == "A2" else "")
            if is_uniform(a):
                _say_uniform(ax, a.shape[-1])
        else:
            lo, hi, label = _scale(a, signed)
            im = ax.imshow(a.numpy(), cmap="RdBu_r" if signed else "viridis", vmin=lo, vmax=hi)
        ax.set_title(f"{name}\n{label}", fontsize=9)
        ax.set_xlabel(f"key {axis}")
        ax.set_ylabel(f"query {axis}")
        if tokens is not None and len(tokens) == a.shape[-1] <= 40:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
        if i != 0 or len(softmax) < 2:  # A1 and A2 share A2's colour bar
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle(title)
    return save_figure(fig, path)


#: the subtitle of a figure with a rollout panel
ROLLOUT_NOTE = ("rollout: attention flow through every layer, R = Â_L ⋯ Â_1 with Â = 0.5·A + 0.5·I, rows L1-normalised "
                "(Abnar & Zuidema 2020); signed for differential maps")


def plot_cls_maps(maps: Mapping[str, torch.Tensor], grid: tuple[int, int], path, *, image=None,
                  num_prefix_tokens: int = 1, title: str = "") -> Path:
    """The CLS row of each map (name → (…, N, N)) over the gh × gw patch grid, beside the image when given
    (C, H, W) or (H, W, C). Every panel has its own colour scale, stated in its title; signed maps use a
    diverging scale centred on 0. A map named ``rollout`` adds a subtitle saying what rollout is; a uniform CLS
    row says so on its panel."""
    plt = pyplot()
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
        signed = bool((row < 0).any())
        lo, hi, label = _scale(row, signed)
        im = ax.imshow(row.numpy(), cmap="RdBu_r" if signed else "viridis", vmin=lo, vmax=hi)
        if not signed and is_uniform(row.flatten()):
            _say_uniform(ax, row.numel())
        ax.set_title(f"CLS → patches: {name}\n{label}", fontsize=9)
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    rollout = any("rollout" in name for name in maps)
    fig.suptitle(title + (f"\n{ROLLOUT_NOTE}" if rollout else ""), fontsize=9 if rollout else None)
    return save_figure(fig, path)


def plot_lambdas(values: Sequence, path, *, label: str = "λ", title: str = "", baseline: float | None = None,
                 reference: tuple[float, str] | None = None) -> Path:
    """λ (or the mean gate) per layer: ``values[l]`` is a scalar or a tensor of per-head (or per-token) values;
    plots the mean per layer with the min–max range over heads/tokens (no band, and no legend entry for one, where
    every layer has a single value).

    The y axis never uses an offset (matplotlib's "+1.0986" above the axis, which makes a 0.0002 difference fill
    the plot): ticks are the values themselves. ``baseline`` (e.g. 0) is kept inside the y range, so the spread is
    drawn against it; ``reference`` = (value, name) is drawn as a dashed line (e.g. the uniform map's value) and
    kept inside the range too."""
    plt = pyplot()
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
    spread = any(h > lo_ for lo_, h in zip(lo, hi))  # one λ per layer: no band to draw or name
    ax.plot(layers, mean, marker="o", label=f"mean {label}" if spread else f"{label} per layer")
    if spread:
        ax.fill_between(layers, lo, hi, alpha=0.25, label="min–max over heads / tokens")
    if reference is not None:
        ax.axhline(reference[0], color="grey", ls="--", lw=1, label=reference[1])
    if baseline is not None or reference is not None:
        keep = [x for x in (baseline, None if reference is None else reference[0]) if x is not None]
        lo_y, hi_y = min(lo + keep), max(hi + keep)
        pad = 0.05 * (hi_y - lo_y) or 0.05 * (abs(hi_y) or 1.0)
        ax.set_ylim(lo_y - pad, hi_y + pad)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_xlabel("layer")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_corruption_curves(table: Mapping[str, Mapping[int, float]], path, *, clean: float | None = None,
                           title: str = "accuracy under corruption") -> Path:
    """Accuracy vs severity, one line per corruption (``table[corruption][severity] = accuracy``); the severity
    axis shows exactly the severities measured."""
    plt = pyplot()
    if not table:
        raise ValueError("table must hold at least one corruption")
    fig, ax = plt.subplots(figsize=(6, 4))
    severities = sorted({int(s) for row in table.values() for s in row})
    for name, row in table.items():
        sev = sorted(row, key=int)
        ax.plot([int(s) for s in sev], [row[s] for s in sev], marker="o", label=name)
    ax.set_xticks(severities)  # severities are whole levels (1–5), not a continuum
    if clean is not None:
        ax.axhline(clean, color="k", ls="--", lw=1, label="clean")
    ax.set_xlabel("severity")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=6, ncol=2)
    ax.set_title(title)
    return save_figure(fig, path)


def plot_needle_grid(grid: Mapping[int, Mapping[float, float]], path, *, title: str = "needle retrieval") -> Path:
    """Accuracy heat map: rows = needle depth (fraction of the context), columns = context length in tokens
    (``grid[length][depth] = accuracy``)."""
    plt = pyplot()
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
    return save_figure(fig, path)
