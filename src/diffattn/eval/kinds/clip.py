"""CLIP / DiffCLIP models: zero-shot classification with a prompt ensemble, image–text retrieval, linear probe and
few-shot (Hammoud & Ghanem 2025 §4); MMVP-VLM when a folder is given; the CLS attention inside vs outside the
foreground masks (Tux Paint stamps' alpha channel); attention diagnostics of the image tower.

A model with ``encode_image`` and ``encode_text`` is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...data import get_dataset
from ...diagnostics import capture_attention, foreground_attention, patch_mask
from ...progress import progress as progress_bar
from ..classification import classification_chance, classification_metrics, zero_shot_classifier, zero_shot_logits
from ..mmvp import mmvp_eval
from ..probe import few_shot, linear_probe
from ..retrieval import recall_at_k
from ..sampling import stratified_subset
from .base import EvalContext, EvalKind, attention_diagnostics, image_sample

__all__ = ["CLIP"]

#: the dataset a CLIP model is evaluated on when none is given
DEFAULT_DATASET = "tuxpaint_captions"


def recognises(model: nn.Module, layout: str) -> bool:
    """A CLIP model: ``encode_image`` and ``encode_text``."""
    return hasattr(model, "encode_image") and hasattr(model, "encode_text")


def _features(model, images: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """(N, E) float32 image embeddings on the CPU, computed in batches of 128 on ``device``."""
    device = device if device is not None else images.device
    with torch.no_grad():
        return torch.cat([model.encode_image(images[i:i + 128].to(device)).float().cpu()
                          for i in range(0, len(images), 128)])


def _images(ds, idx: Sequence[int], transform, chans: int = 3) -> torch.Tensor:
    """Images ``idx`` of ``ds`` (a caption set's RGB images, or a classification set's grey ones) through the
    model's eval transform (which gives RGB); for a ``chans == 1`` image tower, the mean of the three channels."""
    load = ds.load_image if hasattr(ds, "load_image") else (lambda i: ds[i][0])
    x = torch.stack([transform(load(int(i))) for i in idx])
    return x.mean(1, keepdim=True) if chans == 1 else x


def _encode_split(model, ds, idx: np.ndarray, chans: int, device: torch.device, bar) -> torch.Tensor:
    """(N, E) embeddings of images ``idx`` of ``ds``, loaded and encoded 128 at a time (the bar counts images)."""
    out = []
    for i in range(0, len(idx), 128):
        out.append(_features(model, _images(ds, idx[i:i + 128], model.eval_transform, chans), device))
        bar.update(len(idx[i:i + 128]))
    return torch.cat(out)


def run(ctx: EvalContext) -> dict:
    """The CLIP suite on ``ctx.dataset`` (default :data:`DEFAULT_DATASET`): a caption set gives zero-shot,
    retrieval, linear probe, few-shot and the foreground attention; a classification set all but retrieval and
    the foreground attention (recorded under ``skipped``)."""
    model, p, out, seed, progress, device = ctx.model, ctx.protocol, ctx.out, ctx.seed, ctx.progress, ctx.device
    dataset = ctx.dataset or DEFAULT_DATASET
    tr, te = get_dataset(dataset, split="train"), get_dataset(dataset, split="test")
    idx_te = stratified_subset(te.labels, p["max_images"], seed)
    idx_tr = stratified_subset(tr.labels, p["max_train_images"], seed)
    n_te = len(idx_te)
    captioned = hasattr(te, "captions")  # a caption set; else a classification set (no retrieval, no masks)
    chans = model.visual.patch_embed.proj.in_channels
    y_te, y_tr = torch.as_tensor(np.asarray(te.labels)[idx_te]), torch.as_tensor(np.asarray(tr.labels)[idx_tr])
    with progress_bar(total=n_te + len(idx_tr), desc="features", unit="image", disable=not progress,
                      leave=False) as bar:
        f_te = _encode_split(model, te, idx_te, chans, device, bar)
        f_tr = _encode_split(model, tr, idx_tr, chans, device, bar)
    imgs_te = _images(te, idx_te[:8], model.eval_transform, chans)  # the diagnostics' batch
    classes = [c.replace("_", " ") for c in te.categories] if captioned else list(te.prompt_names)
    # one class count for every row: the classes of the test set's label space, whichever a subset holds
    res: dict[str, Any] = {"dataset": dataset, "images": n_te, "train_images": len(idx_tr),
                           "num_classes": len(classes), "skipped": {}}
    if not captioned:
        res["preprocessing"] = "grey images through the model's eval transform (not inverted)"
    with progress_bar(classes, desc="zero-shot", unit="class name", disable=not progress, leave=False) as bar:
        w = torch.cat([zero_shot_classifier(model, [c]).float().cpu() for c in bar])
    res["zero_shot"] = classification_metrics(zero_shot_logits(f_te, w), y_te, num_classes=len(classes))
    res["chance"] = classification_chance("zero_shot", res["zero_shot"], len(classes))
    if captioned:
        captions = [te.captions[int(i)] for i in idx_te]
        with torch.no_grad():
            t_emb = torch.cat([model.encode_text(model.tokenizer(captions[i:i + 256]).to(device)).float().cpu()
                               for i in range(0, n_te, 256)])
        res["retrieval"] = recall_at_k(f_te, t_emb, torch.arange(n_te))
        for key in res["retrieval"]:  # one correct item among n_te: a random ranking puts it in the top k with k/n
            res["chance"][f"retrieval.{key}"] = min(int(key.rsplit("@", 1)[1]), n_te) / n_te
    else:
        res["skipped"]["retrieval"] = f"{dataset} has no captions"
    try:
        res["linear_probe"] = {k: v for k, v in linear_probe(f_tr, y_tr, f_te, y_te, seed=seed,
                                                                max_iter=p["probe_max_iter"],
                                                                fine_steps=p["probe_fine_steps"],
                                                                progress=progress).items()
                               if k != "sweep"}
    except ValueError as e:
        res["skipped"]["linear_probe"] = str(e)
    if "linear_probe" in res:
        res["chance"].update({f"linear_probe.{k}": 1 / len(classes) for k in ("accuracy", "mean_per_class_recall")})
    try:
        res["few_shot"] = few_shot(F.normalize(f_te, dim=-1), y_te, episodes=p["episodes"], seed=seed,
                                   progress=progress)
        res["chance"]["few_shot.mean"] = 1 / res["few_shot"]["way"]  # an episode's N classes
    except ValueError as e:
        res["skipped"]["few_shot"] = str(e)
    if ctx.mmvp:
        res["mmvp"] = mmvp_eval(model, ctx.mmvp, progress=progress)
    grid = (model.img_size // model.visual.patch_embed.patch_size,) * 2
    if hasattr(te, "load_mask"):  # CLS attention inside vs outside the foreground masks, last layer and all layers
        # the first 16 images of the sample whose mask leaves a foreground and a background patch on the grid
        keep = [int(i) for i in idx_te
                if 0 < int(patch_mask(te.load_mask(int(i))[None], grid).sum()) < grid[0] * grid[1]]
        keep = keep[:16] or [int(i) for i in idx_te[:16]]
        masks = torch.stack([te.load_mask(i) for i in keep])
        with torch.no_grad(), capture_attention(model.visual) as cap:
            model.encode_image(_images(te, keep, model.eval_transform, chans).to(device))
        maps = [m.combined for m in cap.layers]
        try:  # a coarse patch grid can leave an image without a background (or foreground) patch
            res["foreground_attention"] = {mode: foreground_attention(maps, masks, grid, mode=mode)
                                           for mode in ("signed", "relu")}
        except ValueError as e:
            res["skipped"]["foreground_attention"] = f"{e} (patch grid {grid[0]}×{grid[1]})"
    else:
        res["skipped"]["foreground_attention"] = f"{dataset} has no foreground masks"
    diag, _ = attention_diagnostics(model.visual, model.encode_image, imgs_te[:8], out, "vision", grid=grid,
                                    device=device, who=f"{ctx.who} on {dataset}")
    res["diagnostics"] = diag
    res["plots"] = diag.pop("plots")
    return res


#: the CLIP model kind (registered by :mod:`diffattn.eval.kinds`)
CLIP = EvalKind(
    name="clip", label="CLIP model", suite="clip",
    groups=("zero_shot", "retrieval", "linear_probe", "few_shot", "foreground_attention"),
    datasets=("tuxpaint_captions", "emoji", "fashion_mnist", "digits"), recognises=recognises, run=run,
    sample=image_sample)
