"""Vision-language recipes: a LLaVA-style VLM in LLaVA's two stages (``vlm``) and Differential PaliGemma with LoRA
(``paligemma``), both on the offline questions of :mod:`diffattn.data.vqa` (real Tux Paint stamps).

``vlm`` (Liu et al. 2023 (LLaVA), §4.2): ``task.train: projector`` is stage 1 (the projector alone, on the stamps'
captions: "describe the image." → the caption), ``task.train: all`` is stage 2 (projector + LM on the questions);
the image tower is frozen in both. ``task.base`` names the starting weights: ``{clip: DIR}`` takes the image tower
of a trained diffattn CLIP (``<run>/model``; Hammoud & Ghanem 2025 §5.1 puts DiffCLIP's tower in LLaVA),
``{init: DIR}`` continues from a saved VLM (stage 2 from stage 1's ``<run>/model``).
:func:`diffattn.train.llava.train_llava` runs both stages in one call (the CLIP-vs-DiffCLIP tower comparison built
on it is ``diffattn study llava``, :mod:`diffattn.studies.llava`).

``paligemma`` (Li et al. 2025, §4): a transformers ``PaliGemmaForConditionalGeneration``
(:func:`diffattn.models.paligemma.build_paligemma`; ``task.base``: ``{type: paligemma, config: {...}}`` builds a
tiny one offline, ``{type: paligemma, path: DIR}`` loads the weights a user has, e.g. google/paligemma-3b-pt-224)
whose Gemma decoder is retrofitted with ``task.method`` (``shared_qk`` or ``split_heads``; ``none`` keeps standard
attention, the LoRA-only baseline) and fine-tuned with peft LoRA (``lora_r`` 32, ``lora_alpha`` 64 on the decoder's
``lora_targets``, q/k/v/o by default) plus λ and the sub-norms, on PaliGemma's prefix-LM inputs
(:func:`diffattn.models.paligemma.paligemma_batch`). Built from a config, its tokenizer is a word-level tokenizer
over the questions' words (:func:`diffattn.models.paligemma.word_tokenizer`), saved beside the adapter;
:func:`diffattn.eval.paligemma.load_paligemma` rebuilds the trained model from the run.
"""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ...io import atomic_write_dir
from ...models import paligemma as _pg
from .base import Task

__all__ = ["VLMTask", "PaliGemmaTask", "QuestionImages", "vlm_vocabulary", "CAPTION_QUESTION",
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
    from ...data.vqa import QUESTION_KINDS, VQADataset, vqa_vocabulary

    qs, caps = [], [CAPTION_QUESTION]
    for split in SPLITS_ALL:
        ds = VQADataset(split, QUESTION_KINDS, root=root, seed=seed)
        qs += ds.questions
        caps += ds.images.captions
    return vqa_vocabulary(qs, extra=caps)


def _vqa(cfg, split: str | None = None):
    from ...data.vqa import POPE_SPLITS, VQADataset

    base = cfg.task.base
    kinds = tuple(base.get("kinds", ("what", "category", "pope", "needle")))
    return VQADataset(split or cfg.data.split, kinds, root=cfg.data.path, seed=cfg.run.seed,
                      needle_count=int(base.get("needle_count", 400)),
                      pope_splits=tuple(base.get("pope_splits", POPE_SPLITS)))


class VLMTask(Task):
    """LLaVA stage 1 (``task.train: projector``) or stage 2 (``task.train: all``); module docstring."""

    name = "vlm"
    options = ("name", "base", "train")

    def build_model(self) -> nn.Module:
        from ...models import create_model, from_pretrained

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

    def dataset(self) -> Dataset:
        from ...models import create_model
        from ...models.clip import image_transform

        if self.cfg.task.base.get("init"):
            img_size = _saved_img_size(self.cfg)
        else:
            with torch.device("meta"):  # the tower's input size from the model config (no weights)
                img_size = create_model(self.cfg.model.name, **{**self.cfg.model.overrides, "vocab": None}).img_size
        return QuestionImages(_vqa(self.cfg), image_transform(img_size), captions=self.cfg.task.train == "projector")

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        core = getattr(model, "module", model)
        text = {k: v.to(images.device) for k, v in core.collate(list(questions), list(answers)).items()}
        return model(images, **text)["loss"]


def _saved_img_size(cfg) -> int:
    with open(Path(cfg.task.base["init"]) / "config.json") as f:
        return int(json.load(f)["vision"].get("img_size", 224))


# --------------------------------------------------------------------------------------------- PaliGemma

def _decoder_only(index: int, name: str) -> bool:
    return "language_model" in name


class PaliGemmaTask(Task):
    """Differential PaliGemma: retrofit the decoder, add LoRA, fine-tune on the questions (module docstring)."""

    name = "paligemma"
    options = ("name", "base", "method", "lambda_init", "anneal_steps", "lora_r", "lora_alpha", "lora_targets")

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            base = self.cfg.task.base
            if base.get("path"):
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(base["path"])
            else:
                self._tokenizer = _pg.word_tokenizer(vlm_vocabulary(self.cfg.data.path))
        return self._tokenizer

    def build_model(self) -> nn.Module:
        """The base model, its decoder retrofitted (``method``), with LoRA on it; ``lora_r: 0`` trains every weight
        instead (full fine-tuning, as in PaliGemma's own pretraining and transfer stages) and adds no LoRA."""
        from ... import adapters as A

        t = self.cfg.task
        model = _pg.build_paligemma(t.base, None if t.base.get("path") else len(self.tokenizer),
                                    extra_keys=DATA_KEYS)
        model.config.use_cache = False
        full = t.lora_r == 0
        if t.method != "none":
            A.retrofit(model, t.method, lambda_init=t.lambda_init, anneal_steps=t.anneal_steps,
                       layers=_decoder_only, train="all" if full else "adapters")
        elif not full:
            model.requires_grad_(False)
        if full:
            return model
        from peft import LoraConfig, get_peft_model

        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        targets = "|".join(t.lora_targets)
        lora = LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, lora_dropout=0.0,
                          target_modules=rf".*language_model.*\.({targets})")
        peft_model = get_peft_model(model, lora)
        for n, p in peft_model.base_model.model.named_parameters():  # peft froze the adapters: unfreeze them
            if n in trainable:
                p.requires_grad_(True)
        return peft_model

    def _image_size(self) -> int:
        base = self.cfg.task.base
        if base.get("path"):
            with open(Path(base["path"]) / "config.json") as f:
                return int(json.load(f)["vision_config"].get("image_size", 224))
        return int(base.get("config", {}).get("vision_config", {}).get("image_size", 224))

    def dataset(self) -> Dataset:
        return QuestionImages(_vqa(self.cfg), _pg.paligemma_transform(self._image_size()))

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        cfg = _pg_core(model).config
        text = _pg.paligemma_batch(self.tokenizer, cfg.image_token_index, _pg.num_image_tokens(cfg),
                                   list(questions), list(answers))
        return model(pixel_values=images, **{k: v.to(images.device) for k, v in text.items()}).loss

    def after_step(self, model: nn.Module) -> None:
        from ... import adapters as A

        if self.cfg.task.method != "none":
            A.step(model)

    def final_saved(self, directory: Path) -> bool:
        return (Path(directory) / ("model" if self.cfg.task.lora_r == 0 else "lora")).is_dir()

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """``adapter/`` (diffattn adapters, λ and their step; absent for ``method: none``), ``lora/`` (peft) and
        ``tokenizer/`` (the word tokenizer of a config-built model). With ``lora_r: 0`` the whole model goes to
        ``model/`` (``save_pretrained``, a retrofit recorded in its config) with the tokenizer beside it, so that
        ``task.base: {type: paligemma, path: <run>/model}`` starts a next stage from it."""
        from ... import adapters as A

        directory = Path(directory)
        with atomic_write_dir(directory / "tokenizer") as tmp:
            self.tokenizer.save_pretrained(tmp)
        if self.cfg.task.lora_r == 0:
            with atomic_write_dir(directory / "model") as tmp:
                model.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
            return directory / "model"
        base = model.base_model.model
        if self.cfg.task.method != "none":
            lora = [p for n, p in base.named_parameters() if "lora_" in n and p.requires_grad]
            for p in lora:
                p.requires_grad_(False)
            try:
                with atomic_write_dir(directory / "adapter") as tmp:
                    A.save_adapter(base, tmp)
            finally:
                for p in lora:
                    p.requires_grad_(True)
        with atomic_write_dir(directory / "lora") as tmp:
            model.save_pretrained(tmp)
        return directory / "lora"


def _pg_core(model):
    """The PaliGemma inside a peft model, or the model itself."""
    from peft import PeftModel

    return model.base_model.model if isinstance(model, PeftModel) else model


#: names that moved out of this module (old name → the module that defines it now); each still resolves, with a
#: DeprecationWarning naming the new place. Resolved by name so that this recipe module imports neither the
#: evaluation helpers.
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


def __getattr__(name: str):
    if name == "build_paligemma":
        warnings.warn("diffattn.train.tasks.vlm.build_paligemma is deprecated; use "
                      "diffattn.models.paligemma.build_paligemma (extra_keys=DATA_KEYS for a task.base)",
                      DeprecationWarning, stacklevel=2)
        return _build_paligemma_deprecated
    if name in MOVED:
        warnings.warn(f"diffattn.train.tasks.vlm.{name} is deprecated; use {MOVED[name]}.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
