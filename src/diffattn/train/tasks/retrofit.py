"""Retrofit fine-tuning: turn a pretrained transformers model's attention differential and fine-tune it.

The λ schedule λ(t) of DAA/DEX (DAA (2025), eq. 3) advances once per optimizer step (:meth:`after_step`).
``task.train`` picks what trains: ``attention`` (the converted attention modules, rest frozen: DAA (2025), App. E.1),
``adapters`` (only the new weights and λ) or ``all``. ``task.lora`` adds peft LoRA (r 32, α 64 on the attention
and MLP projections, as Differential PaliGemma fine-tunes: Li et al. 2025, §4) on top of the adapters, which
then train with it. Only the adapters are saved (``adapter/``, plus ``lora/`` with LoRA).

The run can be rebuilt from its directory alone: ``retrofit.json`` names the base, and a base built from a config
(random weights standing in for a pretrained model) is saved as it was before training in ``base/``
(``save_pretrained``), so neither the RNG nor the transformers version that made it matters. Reload a run with
:func:`load_retrofit_run` (``diffattn eval RUN_DIR`` does), or an adapter onto a base you hold with
:func:`load_retrofit`.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ... import adapters as A
from ...adapters.hf import install_load_warning
from ...checks import is_int
from ...errors import UsageError
from ...eval.text_models import RETROFIT_RUN, load_retrofit_run
from ...io import atomic_write_dir, atomic_write_file
from ...lambdas import DEFAULT_LAMBDA_INIT
from .base import Task, TaskConfig, check, check_tokens
from .lm import lm_dataset, lm_loss, lm_val_metrics, token_windows

__all__ = ["RetrofitTask", "build_base_model", "check_base_config", "load_retrofit", "load_retrofit_run"]

_BASES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}


#: names one base spells one way and another base another way, besides what their config classes' own
#: ``attribute_map`` says (GPT-2's ``n_embd`` is ``hidden_size`` elsewhere, …)
_SYNONYMS = {"n_inner": "intermediate_size", "intermediate_size": "n_inner"}


def _config_keys(cfg_cls) -> tuple[list[str], set[str]]:
    """(the arguments ``cfg_cls`` declares itself, every key it takes: those, its ``attribute_map`` aliases and
    the arguments every transformers config takes)."""
    import inspect

    import transformers

    def args(cls):
        return [n for n, p in inspect.signature(cls.__init__).parameters.items()
                if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]

    common = set(args(transformers.PretrainedConfig))
    common |= {k for k in vars(transformers.PretrainedConfig()) if not k.startswith("_")}
    own = [n for n in args(cfg_cls) if n not in common]
    return own, {*own, *common, *getattr(cfg_cls, "attribute_map", {})}


def check_base_config(kind: str, config: dict) -> None:
    """Every key of ``task.base.config`` is an argument of the base's config class. transformers' configs keep
    unknown keywords as attributes and build their defaults instead (GPT-2's ``n_layer`` given to ``LlamaConfig``
    leaves its 32 layers of width 4096: a 7B model), so an unknown key is a :class:`~diffattn.errors.UsageError`
    naming it and the class's spelling of it, or the class's arguments."""
    import transformers

    if not isinstance(config, dict):
        raise UsageError(f"task.base.config must be a mapping of {_BASES[kind][0]} arguments, got "
                         f"{type(config).__name__}")
    cfg_cls = getattr(transformers, _BASES[kind][0])
    own, accepted = _config_keys(cfg_cls)
    unknown = [k for k in config if k not in accepted]
    if not unknown:
        return
    aliases = dict(_SYNONYMS)
    for other, _ in _BASES.values():  # {GPT-2's n_embd: hidden_size, …}: how the other bases spell a key
        aliases.update({v: k for k, v in getattr(getattr(transformers, other), "attribute_map", {}).items()})
        aliases.update(getattr(getattr(transformers, other), "attribute_map", {}))
    renames = {k: aliases[k] for k in unknown if aliases.get(k) in accepted}
    told = ", ".join(f"{k} → {v}" for k, v in renames.items())
    rest = [k for k in unknown if k not in renames]
    verb = "keys {} are not arguments" if len(unknown) > 1 else "key {} is not an argument"
    msg = f"task.base.config {verb.format(', '.join(unknown))} of {cfg_cls.__name__} (task.base.type {kind!r})"
    if told:
        msg += f"; {kind} spells them: {told}"
    if rest:
        msg += f"; {cfg_cls.__name__} takes {', '.join(own)}"
    raise UsageError(msg)


def _base_classes(base: dict):
    """(config class, model class) of ``base``, after checking its keys."""
    import transformers

    kind = base.get("type")
    if kind not in _BASES:
        raise ValueError(f"task.base.type must be one of {sorted(_BASES)}, got {kind!r}")
    unknown = sorted(set(base) - {"type", "config", "path"})
    if unknown:
        raise ValueError(f"unknown config keys task.base.{unknown[0]}; valid: type, config, path")
    if not base.get("path"):
        check_base_config(kind, base.get("config", {}))
    return tuple(getattr(transformers, n) for n in _BASES[kind])


def build_base_model(base: dict) -> nn.Module:
    """A transformers causal LM: ``{type, config: {...}}`` builds it from a config (random weights, offline);
    ``{type, path}`` loads pretrained weights a user has on disk. Under ``torch.device("meta")`` a base with a
    ``path`` is built from its ``config.json`` alone (shapes, no weights read)."""
    cfg_cls, model_cls = _base_classes(base)
    kind = base["type"]
    if base.get("path"):
        if not Path(base["path"]).is_dir():
            raise ValueError(f"task.base.path {base['path']!r} is not a directory holding a {kind} checkpoint")
        if torch.empty(0).device.type == "meta":  # the size check of diffattn.train.build.check_fits
            return model_cls(cfg_cls.from_pretrained(base["path"]))

        install_load_warning()  # a retrofitted checkpoint given as the base is reported, not silently stripped
        return model_cls.from_pretrained(base["path"])
    torch.manual_seed(0)  # the "pretrained" stand-in must be the same model in every process and every run
    return model_cls(cfg_cls(**base.get("config", {})))


def _lora_config(t):
    from peft import LoraConfig

    return LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, target_modules=list(t.lora_targets), lora_dropout=0.0)


def _check_lora_targets(model: nn.Module, t) -> None:
    """``task.lora_targets`` name at least one linear layer of the base (peft's own error names neither the key nor
    the layers there are)."""
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                     if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"} - {"lm_head"})
    if not set(t.lora_targets) & set(linear):
        raise UsageError(f"task.lora_targets {list(t.lora_targets)} name no layer of the {t.base['type']} base; its "
                         f"linear layers are {', '.join(linear)}")


@dataclass
class RetrofitConfig(TaskConfig):
    """``base`` (a transformers model: ``{type: gpt2, config: {...}}`` built from its config, or ``{type: gpt2,
    path: DIR}`` for pretrained weights a user has), ``method``, ``lambda_init``, ``anneal_steps``, ``train``
    (``attention`` | ``adapters`` | ``all``), ``lora`` with ``lora_r`` / ``lora_alpha`` / ``lora_targets``."""

    name: str = "retrofit"
    base: dict = field(default_factory=dict)
    method: str = "daa"
    lambda_init: float | str = DEFAULT_LAMBDA_INIT
    anneal_steps: int = 1000
    train: str = "attention"
    lora: bool = False
    lora_r: int = 32
    lora_alpha: int = 64
    lora_targets: list = field(default_factory=lambda: ["c_attn", "c_proj", "c_fc"])


class RetrofitTask(Task, name="retrofit", Config=RetrofitConfig, metrics=("loss", "ppl"), data_kinds=("text",),
                   data_formats=("tokens", "text", "sklearn_text"), model_name=False, size_keys="task.base.config"):

    @classmethod
    def check_config(cls, cfg) -> None:
        t = cfg.task
        check(t.train in ("attention", "adapters", "all"), "task.train", t.train,
              "one of ('attention', 'adapters', 'all')")
        check(isinstance(t.base, dict) and "type" in t.base, "task.base", t.base,
              "a mapping with 'type' (e.g. gpt2) and 'config' or 'path'")
        check(is_int(t.anneal_steps) and t.anneal_steps >= 1, "task.anneal_steps", t.anneal_steps,
              "an integer >= 1")

    def own_model(self) -> nn.Module:
        t = self.cfg.task
        model = build_base_model(t.base)
        # the initial weights of a base built from a config, saved into the run by save_initial (on rank 0)
        keep = not t.base.get("path") and os.environ.get("RANK", "0") in ("", "0")
        self._initial_base = copy.deepcopy(model) if keep else None
        model.config.use_cache = False
        A.retrofit(model, t.method, lambda_init=t.lambda_init, anneal_steps=t.anneal_steps,
                   train="adapters" if t.lora else t.train)
        if not t.lora:
            return model
        _check_lora_targets(model, t)
        from peft import get_peft_model

        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        peft_model = get_peft_model(model, _lora_config(t))
        for n, p in peft_model.base_model.model.named_parameters():  # peft froze the adapters: unfreeze them
            if n in trainable:
                p.requires_grad_(True)
        return peft_model

    def extra_host_bytes(self, model: nn.Module) -> int:
        """Bytes the run holds besides ``model``: the copy of a base built from a config, kept for ``base/``
        (read after :meth:`own_model`, also on the ``meta`` device)."""
        base = getattr(self, "_initial_base", None)
        return 0 if base is None else sum(p.numel() * p.element_size() for p in base.parameters())

    def dataset(self, model: nn.Module) -> Dataset:
        return lm_dataset(self.cfg)

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        check_tokens(token_windows(dataset), model, "task.base.config.vocab_size")

    def save_initial(self, model: nn.Module, directory: Path) -> None:
        """``retrofit.json`` (what :func:`load_retrofit_run` needs) and, for a base built from a config, ``base/``:
        its weights before training (kept when the run is resumed)."""
        directory = Path(directory)
        base = self.cfg.task.base
        if self._initial_base is not None and not (directory / "base" / "config.json").is_file():
            with atomic_write_dir(directory / "base") as tmp:
                self._initial_base.save_pretrained(tmp)
        self._initial_base = None
        record = {"format_version": 1, "base_type": base["type"],
                  "base": "base" if not base.get("path") else str(Path(base["path"]).resolve()),
                  "adapter": "adapter", "lora": "lora" if self.cfg.task.lora else None}
        with atomic_write_file(directory / RETROFIT_RUN, "w") as f:
            json.dump(record, f, indent=1)

    def val_metrics(self, totals: dict[str, float], count: int) -> dict[str, float]:
        return lm_val_metrics(totals, count)

    def write_model(self, model: nn.Module, folder: Path) -> None:
        """``adapter/``, ``lora/`` (with LoRA) and a ``retrofit.json`` whose base is the run's (``best/`` is
        reloaded with :func:`load_retrofit_run` like the run)."""
        folder = Path(folder)
        self._write_adapters(model, folder / "adapter", folder / "lora")
        run = folder.parent
        record = json.loads((run / RETROFIT_RUN).read_text()) if (run / RETROFIT_RUN).is_file() else {}
        base = record.get("base", "base")
        record.update(base=base if Path(base).is_absolute() else str((run / base).resolve()))
        (folder / RETROFIT_RUN).write_text(json.dumps(record, indent=1))

    def _write_adapters(self, model: nn.Module, adapter: Path, lora: Path) -> None:
        bare = model.base_model.model if self.cfg.task.lora else model
        params = [p for n, p in bare.named_parameters() if "lora_" in n and p.requires_grad]
        for p in params:  # the LoRA weights go to lora/ (peft's format), not into the diffattn adapter file
            p.requires_grad_(False)
        try:
            with atomic_write_dir(adapter) as tmp:
                A.save_adapter(bare, tmp)
        finally:
            for p in params:
                p.requires_grad_(True)
        if self.cfg.task.lora:
            with atomic_write_dir(lora) as tmp:
                model.save_pretrained(tmp)

    def final_saved(self, directory: Path) -> bool:
        d = Path(directory)
        return (d / "adapter").is_dir() and (not self.cfg.task.lora or (d / "lora").is_dir())

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return lm_loss(model(input_ids=x).logits, y)

    def after_step(self, model: nn.Module) -> None:
        A.step(model)

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """``adapter/`` (diffattn adapters, λ and their schedule step) and, with LoRA, ``lora/`` (peft)."""
        directory = Path(directory)
        self._write_adapters(model, directory / "adapter", directory / "lora")
        return directory / "adapter"


def load_retrofit(base_model: nn.Module, run_model_dir: str | Path) -> nn.Module:
    """Rebuild a trained retrofit from the pretrained ``base_model`` and a run's saved ``adapter/`` (+ ``lora/``)."""

    run_model_dir = Path(run_model_dir)
    model = A.load_adapter(base_model, run_model_dir / "adapter")
    if (run_model_dir / "lora").is_dir():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, run_model_dir / "lora")
    return model
