"""Retrofit fine-tuning: turn a pretrained transformers model's attention differential and fine-tune it.

The λ schedule λ(t) of DAA/DEX (DAA (2025), eq. 3) advances once per optimizer step (:meth:`after_step`).
``task.train`` picks what trains: ``attention`` (the converted attention modules, rest frozen: DAA (2025), App. E.1),
``adapters`` (only the new weights and λ) or ``all``. ``task.lora`` adds peft LoRA (r 32, α 64 on the attention
and MLP projections, as Differential PaliGemma fine-tunes: Li et al. 2025, §4) on top of the adapters, which
then train with it. Only the adapters are saved (``adapter/``, plus ``lora/`` with LoRA); reload them with
:func:`load_retrofit`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ...io import atomic_write_dir
from .base import Task, check_tokens
from .lm import lm_dataset, lm_loss, token_windows

__all__ = ["RetrofitTask", "build_base_model", "load_retrofit"]

_BASES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}


def build_base_model(base: dict) -> nn.Module:
    """A transformers causal LM: ``{type, config: {...}}`` builds it from a config (random weights, offline);
    ``{type, path}`` loads pretrained weights a user has on disk."""
    import transformers

    kind = base.get("type")
    if kind not in _BASES:
        raise ValueError(f"task.base.type must be one of {sorted(_BASES)}, got {kind!r}")
    unknown = sorted(set(base) - {"type", "config", "path"})
    if unknown:
        raise ValueError(f"unknown config keys task.base.{unknown[0]}; valid: type, config, path")
    cfg_cls, model_cls = (getattr(transformers, n) for n in _BASES[kind])
    if base.get("path"):
        if not Path(base["path"]).is_dir():
            raise ValueError(f"task.base.path {base['path']!r} is not a directory holding a {kind} checkpoint")
        return model_cls.from_pretrained(base["path"])
    torch.manual_seed(0)  # the "pretrained" stand-in must be the same model in every process and every run
    return model_cls(cfg_cls(**base.get("config", {})))


def _lora_config(t):
    from peft import LoraConfig

    return LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, target_modules=list(t.lora_targets), lora_dropout=0.0)


class RetrofitTask(Task):
    name = "retrofit"

    def build_model(self) -> nn.Module:
        from ... import adapters as A

        t = self.cfg.task
        model = build_base_model(t.base)
        model.config.use_cache = False
        A.retrofit(model, t.method, lambda_init=t.lambda_init, anneal_steps=t.anneal_steps,
                   train="adapters" if t.lora else t.train)
        if not t.lora:
            return model
        from peft import get_peft_model

        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        peft_model = get_peft_model(model, _lora_config(t))
        for n, p in peft_model.base_model.model.named_parameters():  # peft froze the adapters: unfreeze them
            if n in trainable:
                p.requires_grad_(True)
        return peft_model

    def dataset(self) -> Dataset:
        return lm_dataset(self.cfg)

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        check_tokens(token_windows(dataset), model, "task.base.config.vocab_size")

    def final_saved(self, directory: Path) -> bool:
        d = Path(directory)
        return (d / "adapter").is_dir() and (not self.cfg.task.lora or (d / "lora").is_dir())

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return lm_loss(model(input_ids=x).logits, y)

    def after_step(self, model: nn.Module) -> None:
        from ... import adapters as A

        A.step(model)

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """``adapter/`` (diffattn adapters, λ and their schedule step) and, with LoRA, ``lora/`` (peft)."""
        from ... import adapters as A

        target = Path(directory) / "adapter"
        base = model.base_model.model if self.cfg.task.lora else model
        lora = [p for n, p in base.named_parameters() if "lora_" in n and p.requires_grad]
        for p in lora:  # the LoRA weights go to lora/ (peft's format), not into the diffattn adapter file
            p.requires_grad_(False)
        try:
            with atomic_write_dir(target) as tmp:
                A.save_adapter(base, tmp)
        finally:
            for p in lora:
                p.requires_grad_(True)
        if self.cfg.task.lora:
            with atomic_write_dir(Path(directory) / "lora") as tmp:
                model.save_pretrained(tmp)
        return target


def load_retrofit(base_model: nn.Module, run_model_dir: str | Path) -> nn.Module:
    """Rebuild a trained retrofit from the pretrained ``base_model`` and a run's saved ``adapter/`` (+ ``lora/``)."""
    from ... import adapters as A

    run_model_dir = Path(run_model_dir)
    model = A.load_adapter(base_model, run_model_dir / "adapter")
    if (run_model_dir / "lora").is_dir():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, run_model_dir / "lora")
    return model
