"""Classification with cross-entropy and label smoothing: images for ViT / DiffViT / DGViT, with timm's Mixup /
CutMix (Zhang et al. 2018; Yun et al. 2019) as timm's train script applies them; texts for the Transformer / DT /
DGT text classifiers (M-DGSA 2025, §5.2), as word ids of a vocabulary built from the training split and a padding
mask (App. B.3, Table 5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ...models import TextClassifier
from ..data import (
    ImageLabels,
    digits_dataset,
    external_dataset,
    image_transform,
    text_classification_dataset,
    train_split_stats,
)
from .base import Task, TaskConfig, check, check_images, check_labels, save_model

#: The vocabulary file saved next to a text classifier's weights (``Vocabulary.load`` reads it).
VOCAB_NAME = "vocab.json"


def _num_classes(model: nn.Module) -> int:
    n = getattr(model, "num_classes", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"task 'classify' needs a model with num_classes >= 1, got num_classes={n!r}; "
                         f"set model.overrides.num_classes")
    return n


@dataclass
class ClassifyConfig(TaskConfig):
    """``label_smoothing``; ``mixup`` / ``cutmix``: timm's α (0 turns them off; images only)."""

    name: str = "classify"
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0


class ClassifyTask(Task, name="classify", Config=ClassifyConfig, metrics=("top1", "loss"),
                   data_kinds=("classification", "text"), data_formats=("digits", "imagefolder")):

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.mixup_fn = None
        self.vocab = None  # the text classifier's Vocabulary, once dataset() has built it

    @classmethod
    def check_config(cls, cfg) -> None:
        t = cfg.task
        check(0 <= t.label_smoothing < 1, "task.label_smoothing", t.label_smoothing, "in [0, 1)")
        check(t.mixup >= 0 and t.cutmix >= 0, "task.mixup/task.cutmix", (t.mixup, t.cutmix), ">= 0")

    def dataset(self, model: nn.Module) -> Dataset:
        d = self.cfg.data
        if isinstance(model, TextClassifier):
            return self._text_dataset(model)
        if d.name == "digits":
            return digits_dataset(d.split, d.img_size)

        base = external_dataset(self.cfg)
        pe = model.patch_embed
        size = d.img_size or pe.img_size
        return ImageLabels(base, image_transform(size, pe.proj.in_channels, *train_split_stats(base, self.cfg)))

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        """The images and labels against the model; then timm's Mixup / CutMix for the model's classes, which
        :meth:`loss` applies (``task.mixup`` / ``task.cutmix`` > 0; images only)."""
        t = self.cfg.task
        if t.mixup > 0 or t.cutmix > 0:
            if isinstance(model, TextClassifier):
                raise ValueError(f"task.mixup / task.cutmix mix images; model {self.cfg.model.name!r} is a text "
                                 f"classifier, got mixup={t.mixup}, cutmix={t.cutmix}; set both to 0")
            from timm.data import Mixup

            self.mixup_fn = Mixup(mixup_alpha=t.mixup, cutmix_alpha=t.cutmix, label_smoothing=t.label_smoothing,
                                  num_classes=_num_classes(model))
        if self.vocab is not None or not len(dataset):  # text: checked while the dataset is built
            return
        check_images(dataset[0][0], model, self.cfg.data.name)
        tensors = getattr(dataset, "tensors", None)
        labels = tensors[1] if tensors is not None else getattr(getattr(dataset, "base", None), "labels", None)
        check_labels(labels, getattr(model, "num_classes", None), self.cfg.data.name)

    def _text_dataset(self, model) -> Dataset:
        """(ids, mask, label) of ``data.name`` at ``data.block_size`` tokens, vocabulary of ``model.vocab_size``."""

        d = self.cfg.data
        if d.block_size > model.max_len:
            raise ValueError(f"data.block_size must be at most the model's max_len = {model.max_len} "
                             f"({self.cfg.model.name}), got {d.block_size}")
        ds, self.vocab = text_classification_dataset(d.name, d.split, root=d.path, vocab_size=model.vocab_size,
                                                     block_size=d.block_size)
        labels = ds.tensors[2]
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < model.num_classes:
            raise ValueError(f"data.name {d.name!r} has labels in [{int(labels.min())}, {int(labels.max())}], "
                             f"the model has num_classes={model.num_classes}; set model.overrides.num_classes")
        return ds

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        if len(batch) == 3:  # text: ids (B, L), padding mask (B, L), labels (B,)
            ids, mask, y = batch
            return F.cross_entropy(model(ids, mask).float(), y, label_smoothing=self.cfg.task.label_smoothing)
        x, y = batch
        if self.mixup_fn is not None:
            x, y = self.mixup_fn(x, y)  # y: (B, C) soft targets (label smoothing included)
            logits = model(x)
            return torch.sum(-y * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        return F.cross_entropy(model(x).float(), y, label_smoothing=self.cfg.task.label_smoothing)

    def val_sums(self, model: nn.Module, batch, n: int) -> dict[str, float]:
        """Cross-entropy (no label smoothing, no mixing) and correct top-1 predictions."""
        if len(batch) == 3:
            ids, mask, y = batch
            logits = model(ids, mask).float()
        else:
            x, y = batch
            logits = model(x).float()
        return {"loss": float(F.cross_entropy(logits, y, reduction="sum")),
                "top1": float((logits.argmax(-1) == y).sum())}

    def write_model(self, model: nn.Module, folder: Path) -> None:
        """``save_pretrained``; a text classifier's vocabulary goes with it as ``vocab.json``
        (``Vocabulary.load``)."""
        save_model(model, folder, self.model_card())
        if self.vocab is not None:
            self.vocab.save(Path(folder) / VOCAB_NAME)
