"""Image classification: ViT / DiffViT / DGViT (and DT / DGT on token ids) with cross-entropy, label smoothing and
timm's Mixup / CutMix (Zhang et al. 2018; Yun et al. 2019), as timm's train script applies them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from .base import Task


def _num_classes(model: nn.Module) -> int:
    n = getattr(model, "num_classes", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"task 'classify' needs a model with num_classes >= 1, got num_classes={n!r}; "
                         f"set model.overrides.num_classes")
    return n


class ClassifyTask(Task):
    name = "classify"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.mixup_fn = None

    def build_model(self) -> nn.Module:
        model = super().build_model()
        t = self.cfg.task
        if t.mixup > 0 or t.cutmix > 0:
            from timm.data import Mixup

            self.mixup_fn = Mixup(mixup_alpha=t.mixup, cutmix_alpha=t.cutmix, label_smoothing=t.label_smoothing,
                                  num_classes=_num_classes(model))
        return model

    def dataset(self) -> Dataset:
        d = self.cfg.data
        if d.name == "digits":
            from ..data import digits_dataset

            return digits_dataset(d.split, d.img_size)
        from ..data import external_dataset

        return external_dataset(self.cfg, "classify")

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        if self.mixup_fn is not None:
            x, y = self.mixup_fn(x, y)  # y: (B, C) soft targets (label smoothing included)
            logits = model(x)
            return torch.sum(-y * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        return F.cross_entropy(model(x).float(), y, label_smoothing=self.cfg.task.label_smoothing)
