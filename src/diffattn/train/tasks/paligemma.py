"""The ``paligemma`` task (Li et al. 2025, §4): a transformers ``PaliGemmaForConditionalGeneration``
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

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ... import adapters as A
from ...checks import is_int
from ...io import atomic_write_dir
from ...lambdas import DEFAULT_LAMBDA_INIT
from ...models import paligemma as _pg
from .base import Task, TaskConfig, check
from .vlm import DATA_KEYS, QuestionImages, _vqa, vlm_vocabulary

__all__ = ["PaliGemmaTask", "PaliGemmaConfig"]


@dataclass
class PaliGemmaConfig(TaskConfig):
    """``base`` (``{type: paligemma, config: {...}}`` or ``{type: paligemma, path: DIR}``, plus the question keys
    of :data:`~diffattn.train.tasks.vlm.DATA_KEYS`), ``method`` (``shared_qk``, ``split_heads`` or ``none``),
    ``lambda_init``, ``anneal_steps``, ``lora_r`` (0: full fine-tuning), ``lora_alpha``, ``lora_targets``."""

    name: str = "paligemma"
    base: dict = field(default_factory=dict)
    method: str = "daa"
    lambda_init: float | str = DEFAULT_LAMBDA_INIT
    anneal_steps: int = 1000
    lora_r: int = 32
    lora_alpha: int = 64
    lora_targets: list = field(default_factory=lambda: ["c_attn", "c_proj", "c_fc"])


def _decoder_only(index: int, name: str) -> bool:
    return "language_model" in name


class PaliGemmaTask(Task, name="paligemma", Config=PaliGemmaConfig, model_name=False, size_keys="task.base.config"):
    """Differential PaliGemma: retrofit the decoder, add LoRA, fine-tune on the questions (module docstring)."""

    @classmethod
    def check_config(cls, cfg) -> None:
        t = cfg.task
        check(t.method in ("shared_qk", "split_heads", "none"), "task.method", t.method,
              "one of ('shared_qk', 'split_heads', 'none')")
        check(isinstance(t.base, dict) and t.base.get("type") == "paligemma", "task.base", t.base,
              "a mapping with type: paligemma and 'config' or 'path'")
        check(is_int(t.lora_r) and t.lora_r >= 0, "task.lora_r", t.lora_r,
              "an integer >= 0 (0: full fine-tuning, no LoRA)")

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

    def own_model(self) -> nn.Module:
        """The base model, its decoder retrofitted (``method``), with LoRA on it; ``lora_r: 0`` trains every weight
        instead (full fine-tuning, as in PaliGemma's own pretraining and transfer stages) and adds no LoRA."""

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

    def dataset(self, model: nn.Module) -> Dataset:
        return QuestionImages(_vqa(self.cfg), _pg.paligemma_transform(self._image_size()))

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        cfg = _pg_core(model).config
        text = _pg.paligemma_batch(self.tokenizer, cfg.image_token_index, _pg.num_image_tokens(cfg),
                                   list(questions), list(answers))
        return model(pixel_values=images, **{k: v.to(images.device) for k, v in text.items()}).loss

    def after_step(self, model: nn.Module) -> None:

        if self.cfg.task.method != "none":
            A.step(model)

    def final_saved(self, directory: Path) -> bool:
        return (Path(directory) / ("model" if self.cfg.task.lora_r == 0 else "lora")).is_dir()

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """``adapter/`` (diffattn adapters, λ and their step; absent for ``method: none``), ``lora/`` (peft) and
        ``tokenizer/`` (the word tokenizer of a config-built model). With ``lora_r: 0`` the whole model goes to
        ``model/`` (``save_pretrained``, a retrofit recorded in its config) with the tokenizer beside it, so that
        ``task.base: {type: paligemma, path: <run>/model}`` starts a next stage from it."""

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
