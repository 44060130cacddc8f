"""Attention-noise measurements on captured maps: per-branch entropy, answer-span vs context mass (text), CLS or
object-patch mass inside vs outside a foreground mask (images), and attention rollout for signed maps.

Signed maps. A differential map A = w1 ⊙ A1 − λ ⊙ A2 has negative entries and rows that sum to w1 − λ (1 − λ for
Ye et al. 2024 eq. 1; 2g − 1 for the M-DGSA gate), not to 1. Every function here says what it does with signs;
``mode`` chooses among ``"signed"`` (the values as the layer applies them to V: what Ye et al. 2024 Table 3 reports
for the Diff Transformer), ``"relu"`` (max(A, 0): where the layer attends positively), ``"abs"`` (|A|) and
``"share"`` (|A| over its row's Σ|A|: each row sums to 1 for every kind, so a standard and a differential map, whose
signed rows sum to 1 and to 1 − λ, are compared on one scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["MODES", "transform", "branch_entropy", "answer_attention", "patch_mask", "foreground_attention", "rollout"]

MODES = ("signed", "relu", "abs", "share")


def transform(a: torch.Tensor, mode: str) -> torch.Tensor:
    """A as given (``signed``), max(A, 0) (``relu``), |A| (``abs``) or |A| / Σ_k |A_qk| per row (``share``; a row
    that is all zero stays zero)."""
    if mode == "signed":
        return a
    if mode == "relu":
        return a.clamp_min(0)
    if mode == "abs":
        return a.abs()
    if mode == "share":
        m = a.abs()
        total = m.sum(-1, keepdim=True)  # (..., Nq, 1)
        return m / torch.where(total > 0, total, torch.ones_like(total))
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_map(name: str, a) -> torch.Tensor:
    if not isinstance(a, torch.Tensor) or a.dim() != 4 or not a.is_floating_point():
        got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
        raise ValueError(f"{name} must be a float tensor (B, heads, Nq, Nk), got {got}")
    return a


def branch_entropy(a: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """(heads,) mean row entropy H = −Σ_j a_ij log a_ij (nats) of a softmax map (B, heads, Nq, Nk), averaged over
    batch and query rows. Defined for one branch (A1 or A2, rows on the simplex); for a signed combined map use
    ``branch_entropy(transform(A, "abs") / row sums)`` explicitly if you want it."""
    a = _check_map("a", a).double()
    if bool((a < -1e-6).any()):
        raise ValueError("a has negative entries: entropy is defined for one softmax branch (A1 or A2), not for a "
                         "signed differential map")
    h = -(a * (a + eps).log()).sum(dim=-1)  # (B, heads, Nq)
    return h.mean(dim=(0, 2)).float()


def answer_attention(maps: Sequence[torch.Tensor], answer: torch.Tensor, context: torch.Tensor,
                     query: int | Sequence[int] = -1, mode: str = "signed") -> dict[str, float]:
    """Attention mass on the answer span vs the rest of the context (Ye et al. 2024 §3.4, Table 3).

    maps: per layer (B, heads, Nq, Nk); answer, context: (Nk,) or (B, Nk) bool masks of the key positions that
    hold the answer and the whole context (the answer inside it); query: the query row(s) that produce the answer
    (default the last). For each layer, head and example: answer mass = Σ_{k ∈ answer} A_qk, noise mass =
    Σ_{k ∈ context \\ answer} A_qk, after :func:`transform` with ``mode``. Returned values are means over queries,
    examples, heads and layers: ``{"answer", "noise", "ratio"}`` with ratio = answer / noise (inf when noise is 0).
    """
    if not len(maps):
        raise ValueError("maps must hold at least one layer's map")
    ans, noise = [], []
    for i, a in enumerate(maps):
        a = transform(_check_map(f"maps[{i}]", a), mode).double()
        B, _, Nq, Nk = a.shape
        am = answer.to(a.device).bool().expand(B, Nk) if answer.dim() in (1, 2) else None
        cm = context.to(a.device).bool().expand(B, Nk) if context.dim() in (1, 2) else None
        if am is None or cm is None or answer.shape[-1] != Nk or context.shape[-1] != Nk:
            raise ValueError(f"answer and context must be bool masks of shape (Nk,) or (B, Nk) with Nk={Nk}, got "
                             f"{tuple(answer.shape)} and {tuple(context.shape)}")
        if bool((am & ~cm).any()):
            raise ValueError("answer must lie inside context (every answer position also marked in context)")
        if not bool(am.any(dim=-1).all()):
            raise ValueError("answer must mark at least one key position per example")
        q = [query] if isinstance(query, int) else list(query)
        rows = a[:, :, q]  # (B, heads, |q|, Nk)
        ans.append((rows * am[:, None, None]).sum(-1).mean().item())
        noise.append((rows * (cm & ~am)[:, None, None]).sum(-1).mean().item())
    a_mean, n_mean = sum(ans) / len(ans), sum(noise) / len(noise)
    return {"answer": a_mean, "noise": n_mean, "ratio": a_mean / n_mean if n_mean else float("inf")}


def patch_mask(mask: torch.Tensor, grid: tuple[int, int], threshold: float = 0.5) -> torch.Tensor:
    """(B, gh·gw) bool: a patch is foreground when the mean of the pixel mask (B, H, W) over it is ≥ threshold."""
    if mask.dim() == 2:
        mask = mask[None]
    if mask.dim() != 3:
        raise ValueError(f"mask must be (H, W) or (B, H, W), got shape {tuple(mask.shape)}")
    frac = F.adaptive_avg_pool2d(mask[:, None].float(), grid)  # (B, 1, gh, gw)
    return (frac >= threshold).flatten(1)


def foreground_attention(maps: Sequence[torch.Tensor], mask: torch.Tensor, grid: tuple[int, int], *,
                         num_prefix_tokens: int = 1, mode: str = "signed", query: str = "cls",
                         threshold: float = 0.5) -> dict[str, float]:
    """Attention inside vs outside a foreground mask (the image counterpart of :func:`answer_attention`).

    maps: per layer (B, heads, N, N) with ``num_prefix_tokens`` (CLS) before gh·gw patch tokens; mask: the pixel
    foreground mask (B, H, W) (e.g. an alpha channel, or the union of a detector's object boxes), reduced to patches
    by :func:`patch_mask` with ``threshold``. ``query`` picks the attention rows: ``"cls"`` the CLS row (needs a
    prefix token; a ViT's image summary), ``"foreground"`` the rows of the foreground patches themselves, averaged
    over them (for models without a CLS token, e.g. a detector's attention over its feature map: how much an object
    looks at objects). From those rows, after :func:`transform`: inside = Σ over foreground patch keys, outside = Σ
    over background patch keys, and the per-patch densities inside / outside (mass divided by the number of
    patches), averaged over heads, layers and images. ``density_ratio`` > 1 means the queries look at the objects
    more than at the background; a uniform map gives 1.
    """
    if query not in ("cls", "foreground"):
        raise ValueError(f"query must be 'cls' or 'foreground', got {query!r}")
    if query == "cls" and num_prefix_tokens < 1:
        raise ValueError(f"query='cls' needs a CLS token (num_prefix_tokens >= 1), got {num_prefix_tokens}")
    gh, gw = grid
    p = num_prefix_tokens
    fg = patch_mask(mask, grid, threshold)  # (B, P)
    inside, outside, d_in, d_out = [], [], [], []
    for i, a in enumerate(maps):
        a = transform(_check_map(f"maps[{i}]", a), mode).double()
        if a.shape[-1] != p + gh * gw or a.shape[-2] != a.shape[-1]:
            raise ValueError(f"maps[{i}] has shape {tuple(a.shape)}; grid {grid} with {p} prefix tokens needs "
                             f"(B, heads, {p + gh * gw}, {p + gh * gw})")
        f = fg.to(a.device).expand(a.shape[0], -1)
        if not bool(f.any(dim=1).all()) or not bool((~f).any(dim=1).all()):
            raise ValueError("mask must give every image at least one foreground and one background patch")
        if query == "cls":
            m_in = (a[:, :, 0, p:] * f[:, None]).sum(-1)  # (B, heads)
            m_out = (a[:, :, 0, p:] * ~f[:, None]).sum(-1)
        else:
            rows = a[:, :, p:, p:]  # (B, heads, P, P): patch queries × patch keys
            w = f[:, None, :].double() / f.sum(1)[:, None, None]  # (B, 1, P): mean over the foreground queries
            m_in = ((rows * f[:, None, None]).sum(-1) * w).sum(-1)  # (B, heads)
            m_out = ((rows * ~f[:, None, None]).sum(-1) * w).sum(-1)
        inside.append(m_in.mean().item())
        outside.append(m_out.mean().item())
        d_in.append((m_in / f.sum(1, keepdim=True)).mean().item())
        d_out.append((m_out / (~f).sum(1, keepdim=True)).mean().item())
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    out = {"inside": mean(inside), "outside": mean(outside), "density_inside": mean(d_in),
           "density_outside": mean(d_out)}
    out["density_ratio"] = out["density_inside"] / out["density_outside"] if out["density_outside"] else float("inf")
    return out


def rollout(maps: Sequence[torch.Tensor], *, mode: str = "signed", residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020 §3), defined for signed maps.

    For each layer l, with A_l the head-averaged map (B, N, N) after :func:`transform`:

        Â_l = residual · A_l + (1 − residual) · I,   rows divided by Σ_j |Â_l,ij|,   R = Â_L ⋯ Â_2 Â_1

    For a non-negative map (standard attention, A1, A2, or ``mode="relu"`` / ``"abs"``) the L1 row norm equals the
    row sum, so this is exactly Abnar & Zuidema's rollout (0.5A + 0.5I, rows renormalised, product over layers).
    For a signed differential map we divide by the L1 norm instead of the row sum because the signed row sum
    (w1 − λ: 1 − λ, or 2g − 1 for the gate) can be near zero or negative, where dividing by it would blow up or
    flip signs; with L1 rows every factor has ‖Â‖_∞ = 1, so R stays in [−1, 1] and keeps the sign of the flow.
    Returns R (B, N, N); R[:, 0, P:] is the CLS token's rollout over the patches.
    """
    if not len(maps):
        raise ValueError("maps must hold at least one layer's map")
    if not 0.0 < residual <= 1.0:
        raise ValueError(f"residual must be in (0, 1], got {residual}")
    out = None
    for i, a in enumerate(maps):
        a = transform(_check_map(f"maps[{i}]", a), mode).double().mean(dim=1)  # (B, N, N)
        if a.shape[-1] != a.shape[-2]:
            raise ValueError(f"maps[{i}] must be square (self-attention without cache), got {tuple(a.shape)}")
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = residual * a + (1.0 - residual) * eye
        a = a / a.abs().sum(dim=-1, keepdim=True).clamp_min(1e-12)
        out = a if out is None else a @ out
    return out.float()
