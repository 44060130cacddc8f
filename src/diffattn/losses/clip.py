"""CLIP's symmetric contrastive loss (Radford et al. 2021, eq. in §2.3; DiffCLIP, Hammoud & Ghanem 2025, §3.3).

    L = ½ (CE(s·I Tᵀ, diag) + CE(s·T Iᵀ, diag)),   I, T: L2-normalised image and text embeddings, s = exp(t)

With several processes, every rank gathers the embeddings of all ranks (global negatives, as open_clip's
``gather_with_grad``) so the loss is the one of the global batch; the gather keeps the gradient of the local part.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["clip_loss", "clip_loss_from_features", "gather_features"]


def clip_loss(logits_per_image: torch.Tensor) -> torch.Tensor:
    """L_CLIP = ½ (L_it + L_ti) with the matching pairs on the diagonal. logits (B, B) → scalar."""
    if logits_per_image.dim() != 2 or logits_per_image.shape[0] != logits_per_image.shape[1]:
        raise ValueError(f"logits_per_image must be square (B, B), got {tuple(logits_per_image.shape)}")
    target = torch.arange(logits_per_image.shape[0], device=logits_per_image.device)
    return 0.5 * (F.cross_entropy(logits_per_image, target) + F.cross_entropy(logits_per_image.t(), target))


def gather_features(features: torch.Tensor) -> torch.Tensor:
    """All ranks' (B, E) features concatenated in rank order, (W·B, E), differentiable (open_clip's
    ``gather_with_grad``): the backward sums every rank's gradient into the owner's slice.

    Without an initialised process group (or with one process) returns ``features`` unchanged. Every rank must
    pass the same local batch size.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return features
    # functional collectives (the API torch.distributed.nn.functional.all_gather is deprecated for): the backward
    # reduce-scatters (sums) the gradient, so each rank receives the gradient of its own slice from every rank
    from torch.distributed import _functional_collectives as fc

    gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
    out = gather(features.contiguous(), 0, dist.group.WORLD)
    return out.wait() if hasattr(out, "wait") else out


def clip_loss_from_features(image_features: torch.Tensor, text_features: torch.Tensor,
                            logit_scale: torch.Tensor | float) -> torch.Tensor:
    """The CLIP loss of this rank's pairs against the **global** batch (open_clip's ``local_loss``).

    image_features, text_features: local (B, E) L2-normalised embeddings; logit_scale: s = exp(t), already clamped.
    Each rank scores its B images against all W·B texts and its B texts against all W·B images. The mean of the
    ranks' losses is the loss of one process holding the whole batch, and because the gather passes gradients
    back to their owners, DDP's gradient average equals that process's gradient exactly.
    """
    if image_features.dim() != 2 or image_features.shape != text_features.shape:
        raise ValueError(f"image_features and text_features must both be (B, E) of one shape, got "
                         f"{tuple(image_features.shape)} and {tuple(text_features.shape)}")
    B = image_features.shape[0]
    all_img, all_txt = gather_features(image_features), gather_features(text_features)  # (W·B, E)
    rank = dist.get_rank() if all_img.shape[0] != B else 0
    target = torch.arange(B, device=image_features.device) + rank * B
    logits_i = logit_scale * image_features @ all_txt.t()  # (B, W·B)
    logits_t = logit_scale * text_features @ all_img.t()  # (B, W·B)
    return 0.5 * (F.cross_entropy(logits_i, target) + F.cross_entropy(logits_t, target))
