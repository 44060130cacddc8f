"""Losses: the CLIP contrastive loss (with global negatives across processes), LM and classification losses."""

from .clip import clip_loss, clip_loss_from_features, gather_features

__all__ = ["clip_loss", "clip_loss_from_features", "gather_features"]
