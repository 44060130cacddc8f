"""Image–text retrieval recall@k with several captions per image (Radford et al. 2021 §3.2; Hammoud & Ghanem 2025
§4, MSCOCO / Flickr30k protocol).

Similarities are cosines, s(i, t) = ⟨normalise(u_i), normalise(v_t)⟩. A query counts as a hit at k when **any**
of its correct items is within its top k:

- image → text: image i's correct items are all captions t with ``text_to_image[t] == i``;
- text → image: caption t's one correct item is image ``text_to_image[t]``.

Ties count against the query: the best-scoring correct item c is in the top k when fewer than k *incorrect* items
score greater than or equal to it, #{j incorrect : s_j ≥ s_c} < k. A model that scores everything equal therefore
gets recall@k = 0 whenever there are at least k incorrect items; ties never inflate recall.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._checks import as_tensor, check_ks

__all__ = ["recall_at_k", "hits_at_k"]


def hits_at_k(scores: torch.Tensor, correct: torch.Tensor, k: int) -> torch.Tensor:
    """(Q,) bool: for each query row of ``scores`` (Q, M), whether any item marked in ``correct`` (Q, M) is in the
    top k, ties counting against the query (module docstring)."""
    if bool((~correct.any(dim=1)).any()):
        raise ValueError("every query needs at least one correct item")
    best = scores.masked_fill(~correct, float("-inf")).amax(dim=1, keepdim=True)  # (Q, 1)
    ahead = ((scores >= best) & ~correct).sum(dim=1)  # incorrect items at or above the best correct one
    return ahead < k


@torch.no_grad()
def recall_at_k(image_emb, text_emb, text_to_image, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """``{"image_to_text@k": …, "text_to_image@k": …}`` for each k in ``ks`` (fractions in [0, 1]).

    image_emb: (I, E) image embeddings; text_emb: (T, E) caption embeddings; text_to_image: (T,) the index of the
    image each caption describes (an image may have several captions; every image needs at least one).
    """
    image_emb = as_tensor("image_emb", image_emb, dim=2, floating=True)
    text_emb = as_tensor("text_emb", text_emb, dim=2, floating=True)
    text_to_image = as_tensor("text_to_image", text_to_image, dim=1, floating=False).to(image_emb.device)
    ks = check_ks(ks)
    I, E = image_emb.shape
    T = text_emb.shape[0]
    if text_emb.shape[1] != E:
        raise ValueError(f"text_emb must have E={E} columns like image_emb, got shape {tuple(text_emb.shape)}")
    if text_to_image.shape[0] != T:
        raise ValueError(f"text_to_image must have one entry per caption ({T}), got {text_to_image.shape[0]}")
    if T == 0 or I == 0:
        raise ValueError(f"need at least one image and one caption, got {I} images and {T} captions")
    if text_to_image.min() < 0 or text_to_image.max() >= I:
        raise ValueError(f"text_to_image must index images in [0, {I}), got range "
                         f"[{int(text_to_image.min())}, {int(text_to_image.max())}]")
    missing = sorted(set(range(I)) - set(text_to_image.tolist()))
    if missing:
        raise ValueError(f"every image needs at least one caption in text_to_image; images {missing[:10]} have none")
    sim = F.normalize(image_emb.double(), dim=-1) @ F.normalize(text_emb.double(), dim=-1).t()  # (I, T)
    correct = text_to_image[None, :] == torch.arange(I, device=sim.device)[:, None]  # (I, T)
    out = {}
    for k in ks:
        out[f"image_to_text@{k}"] = hits_at_k(sim, correct, k).double().mean().item()
    for k in ks:
        out[f"text_to_image@{k}"] = hits_at_k(sim.t(), correct.t(), k).double().mean().item()
    return out
