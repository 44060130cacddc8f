"""LLaVA's two training stages in one call (Liu et al. 2023, §4.2), for callers without a run directory (the
CLIP-vs-DiffCLIP tower comparison, ``diffattn study llava``). Every optimizer step is taken by
:func:`diffattn.train.step.fit`. A run with checkpoints is the ``vlm`` recipe instead (:mod:`diffattn.train.tasks.vlm`:
stage 2 continues from stage 1's ``<run>/model``)."""

from __future__ import annotations

import torch

from .optim import warmup_cosine
from .step import fit

__all__ = ["train_llava"]


def _llava_batches(model, data, steps: int, batch_size: int, g: torch.Generator):
    """``steps`` batches (images (B, 3, H, W), the collated text) of ``batch_size`` items drawn with ``g``."""
    for _ in range(steps):
        idx = torch.randint(len(data), (batch_size,), generator=g).tolist()
        items = [data[i] for i in idx]
        yield torch.stack([it[0] for it in items]), model.collate([it[1] for it in items], [it[2] for it in items])


def _llava_loss(model, batch) -> torch.Tensor:
    images, text = batch
    return model(images, **text)["loss"]


def train_llava(model, train_set, *, stage1_steps: int, stage2_steps: int, batch_size: int = 32,
                stage1_lr: float = 1e-3, stage2_lr: float = 3e-4, warmup: int = 10, seed: int = 0,
                captions=None, log=None) -> list[float]:
    """LLaVA's two stages in one call (Liu et al. 2023, §4.2): ``stage1_steps`` AdamW steps on the projector with
    ``captions`` (a :class:`diffattn.train.tasks.vlm.QuestionImages` with ``captions=True``; default:
    ``train_set``), then ``stage2_steps``
    on projector + LM with ``train_set``; warm-up then cosine lr per stage, batches drawn with ``seed``. Returns the
    loss of every step. The model is left in eval mode."""
    losses: list[float] = []
    g = torch.Generator().manual_seed(seed)
    for stage, steps, lr, data in ((1, stage1_steps, stage1_lr, captions or train_set),
                                   (2, stage2_steps, stage2_lr, train_set)):
        if steps <= 0:
            continue
        model.set_stage(stage)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s, n=steps: warmup_cosine(s, n, warmup, 0.1))
        losses += fit(model, opt, sched, _llava_batches(model, data, steps, batch_size, g), _llava_loss,
                      params=params, log=log, desc=f"stage {stage} step", total=steps)
    model.eval()
    return losses
