"""CLIP / DiffCLIP contrastive training (Radford et al. 2021, §2.3; Hammoud & Ghanem 2025, DiffCLIP §3.3).

Each rank scores its pairs against the embeddings of **all** ranks (global negatives, all-gather with gradient),
so the loss and its gradient are those of one process holding the whole micro-batch. The temperature t is
learnable and exp(t) is clamped at 100 (after every step t is clamped to [0, log 100]).

With ``run.accum_steps`` > 1 the negatives of a step are those of one micro-batch across ranks, as in open_clip
without its feature cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from ...eval.retrieval import recall_at_k
from ...losses import clip_loss, clip_loss_from_features
from ...models.clip import image_transform
from ..data import ImageCaptions, digit_caption_dataset, external_dataset
from .base import Task, TaskConfig, check_images, eval_batches


@dataclass
class ClipConfig(TaskConfig):
    """CLIP reads no options besides its name."""

    name: str = "clip"


class ClipTask(Task, name="clip", Config=ClipConfig, metrics=("r@1", "i2t@1", "t2i@1", "loss"),
               data_kinds=("captions",), data_formats=("digits", "csv", "webdataset")):

    def dataset(self, model: nn.Module) -> Dataset:
        """Image–caption pairs: the tokenizer, image size and channels are the model's."""
        d = self.cfg.data
        if d.name == "digits":
            in_chans = model.visual.patch_embed.proj.in_channels
            return digit_caption_dataset(model.tokenizer, d.split, model.img_size, in_chans)

        # the model's own preprocessing (ImageNet mean/std), the one `diffattn eval` applies
        size = d.img_size or model.visual.patch_embed.img_size
        return ImageCaptions(external_dataset(self.cfg), image_transform(size), model.tokenizer)

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        if len(dataset):
            check_images(dataset[0][0], model.visual, self.cfg.data.name)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, tokens = batch
        out = model(images, tokens)
        return clip_loss_from_features(out["image_embed"].float(), out["text_embed"].float(),
                                       out["logit_scale"].float())

    @torch.no_grad()
    def validate(self, model: nn.Module, dataset: Dataset, device: torch.device,
                 amp_dtype: torch.dtype | None = None) -> dict[str, float]:
        """The contrastive loss of the whole validation set as one batch and image↔text recall@1 (each image's
        own caption among all captions, and back; ties count against), no gathering across processes."""

        images, texts = [], []
        scale = None
        for (x, tokens), _ in eval_batches(dataset, self.cfg.eval.batch_size, device):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(x, tokens)
            images.append(out["image_embed"].float())
            texts.append(out["text_embed"].float())
            scale = out["logit_scale"].float()
        img, txt = torch.cat(images), torch.cat(texts)
        loss = float(clip_loss(scale * img @ txt.t()))
        rec = recall_at_k(img, txt, torch.arange(len(img), device=img.device), ks=(1,))
        i2t, t2i = float(rec["image_to_text@1"]), float(rec["text_to_image@1"])
        return {"r@1": (i2t + t2i) / 2, "i2t@1": i2t, "t2i@1": t2i, "loss": loss}

    def after_step(self, model: nn.Module) -> None:
        model.clamp_logit_scale_()
