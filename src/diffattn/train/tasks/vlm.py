"""The ``vlm`` task: a LLaVA-style VLM in LLaVA's two stages, on the offline questions of :mod:`diffattn.data.vqa`
(real Tux Paint stamps).

``vlm`` (Liu et al. 2023 (LLaVA), §4.2): ``task.train: projector`` is stage 1 (the projector alone, on the stamps'
captions: "describe the image." → the caption), ``task.train: all`` is stage 2 (projector + LM on the questions);
the image tower is frozen in both. ``task.base`` names the starting weights: ``{clip: DIR}`` takes the image tower
of a trained diffattn CLIP (``<run>/model``; Hammoud & Ghanem 2025 §5.1 puts DiffCLIP's tower in LLaVA),
``{init: DIR}`` continues from a saved VLM (stage 2 from stage 1's ``<run>/model``).
:func:`diffattn.train.llava.train_llava` runs both stages in one call (the CLIP-vs-DiffCLIP tower comparison built
on it is ``diffattn study llava``, :mod:`diffattn.studies.llava`).

Differential PaliGemma, on the same questions, is :mod:`diffattn.train.tasks.paligemma`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import Dataset

from ...data.vqa import POPE_SPLITS, QUESTION_KINDS, VQADataset, vqa_vocabulary
from ...deprecations import moved_attribute
from ...factory import create_model, from_pretrained
from ...models import paligemma as _pg
from ...models.clip import image_transform
from .base import Task, TaskConfig, check

__all__ = ["VLMTask", "VLMConfig", "QuestionImages", "vlm_vocabulary", "CAPTION_QUESTION",
           "SPLITS_ALL", "DATA_KEYS"]


CAPTION_QUESTION = "describe the image."
#: the ``task.base`` keys that choose the training questions (:class:`~diffattn.data.vqa.VQADataset`'s arguments)
DATA_KEYS = ("kinds", "needle_count", "pope_splits")
SPLITS_ALL = ("train", "val", "test")
_CACHE: dict = {}


def _image_tensor(ds, q: dict, transform) -> torch.Tensor:
    key = (id(ds), tuple(q["images"]), id(transform))
    if key not in _CACHE:
        _CACHE[key] = transform(ds.image(q))
    return _CACHE[key]


class QuestionImages(Dataset):
    """(image tensor, question, answer) triples of a :class:`~diffattn.data.vqa.VQADataset`, images transformed
    once and kept in memory; ``captions=True`` gives stage-1 pairs ("describe the image." → caption) instead."""

    def __init__(self, vqa, transform, captions: bool = False) -> None:
        self.vqa, self.transform = vqa, transform
        if captions:
            self.items = [({"images": [i]}, CAPTION_QUESTION, r["caption"]) for i, r in enumerate(vqa.images.rows)]
        else:
            self.items = [(q, q["question"], q["answer"]) for q in vqa.questions]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        q, question, answer = self.items[i]
        return _image_tensor(self.vqa, q, self.transform), question, answer


def vlm_vocabulary(root=None, seed: int = 0) -> list[str]:
    """The words of every question, answer and caption over all splits (a word list, no image–answer pairing;
    test answers unseen in training are in it but never trained), plus the stage-1 instruction."""

    qs, caps = [], [CAPTION_QUESTION]
    for split in SPLITS_ALL:
        ds = VQADataset(split, QUESTION_KINDS, root=root, seed=seed)
        qs += ds.questions
        caps += ds.images.captions
    return vqa_vocabulary(qs, extra=caps)


def _vqa(cfg, split: str | None = None):
    base = cfg.task.base
    kinds = tuple(base.get("kinds", ("what", "category", "pope", "needle")))
    return VQADataset(split or cfg.data.split, kinds, root=cfg.data.path, seed=cfg.run.seed,
                      needle_count=int(base.get("needle_count", 400)),
                      pope_splits=tuple(base.get("pope_splits", POPE_SPLITS)))


@dataclass
class VLMConfig(TaskConfig):
    """``base``: ``{clip: DIR}`` (a CLIP run's image tower), ``{init: DIR}`` (a saved VLM), and the question keys
    (:data:`DATA_KEYS`); ``train``: ``projector`` (stage 1) or ``all`` (stage 2)."""

    name: str = "vlm"
    base: dict = field(default_factory=dict)
    train: str = "attention"


class VLMTask(Task, name="vlm", Config=VLMConfig):
    """LLaVA stage 1 (``task.train: projector``) or stage 2 (``task.train: all``); module docstring."""

    @classmethod
    def check_config(cls, cfg) -> None:
        check(cfg.task.train in ("projector", "all"), "task.train", cfg.task.train,
              "'projector' (LLaVA stage 1) or 'all' (stage 2: projector + LM)")

    def own_model(self) -> nn.Module:
        base, t = self.cfg.task.base, self.cfg.task
        unknown = sorted(set(base) - {"clip", "init", *DATA_KEYS})
        if unknown:
            raise ValueError(f"unknown config key task.base.{unknown[0]} for task vlm; valid: clip, init, "
                             f"{', '.join(DATA_KEYS)}")
        if base.get("init"):
            model = from_pretrained(base["init"])
        else:
            overrides = dict(self.cfg.model.overrides)
            overrides.setdefault("vocab", vlm_vocabulary(self.cfg.data.path))
            model = create_model(self.cfg.model.name, **overrides)
            if base.get("clip"):
                model.load_vision_tower(base["clip"])
        model.set_stage(1 if t.train == "projector" else 2)
        return model

    def dataset(self, model: nn.Module) -> Dataset:
        """The questions (stage 2) or captions (stage 1), images at the size of the model's tower."""

        return QuestionImages(_vqa(self.cfg), image_transform(model.img_size),
                              captions=self.cfg.task.train == "projector")

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        core = getattr(model, "module", model)
        text = {k: v.to(images.device) for k, v in core.collate(list(questions), list(answers)).items()}
        return model(images, **text)["loss"]


#: names that moved out of this module (old name → the module that defines it now); each still resolves, with the
#: FutureWarning of its row in :data:`diffattn.deprecations.DEPRECATIONS`, naming the new place. Resolved by name so
#: that this recipe module imports neither the evaluation helpers.
MOVED: dict[str, str] = {
    **dict.fromkeys(("word_tokenizer", "paligemma_batch", "paligemma_transform", "PALIGEMMA_SPECIAL"),
                    "diffattn.models.paligemma"),
    **dict.fromkeys(("load_paligemma", "answer_paligemma", "paligemma_image_attention"), "diffattn.eval.paligemma"),
}
#: (the LLaVA comparison, ``llava_compare`` / ``llava_table``, is a study now: :mod:`diffattn.studies.llava`; no alias
#: here, since a recipe module never imports the studies)


def _build_paligemma_deprecated(base: dict, vocab_size: int | None = None) -> nn.Module:
    """The old ``build_paligemma(base, vocab_size)``: ``base`` may hold the question keys (:data:`DATA_KEYS`)."""
    return _pg.build_paligemma(base, vocab_size, extra_keys=DATA_KEYS)


def _moved(name: str) -> object:
    return getattr(importlib.import_module(MOVED[name]), name)


__getattr__ = moved_attribute(__name__, {"build_paligemma": lambda: _build_paligemma_deprecated,
                                         **{name: functools.partial(_moved, name) for name in MOVED}})
