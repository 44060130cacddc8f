"""Causal language modelling on a token stream (nanoGPT's memmap of token ids): next-token cross-entropy
(Ye et al. 2024, Differential Transformer §3 trains the same objective)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ..data import TokenWindows, byte_tokens, external_dataset, sklearn_text_tokens, text_windows
from .base import Task, TaskConfig, check_tokens


def lm_dataset(cfg) -> Dataset:
    """Token windows from ``data.name``: ``tokens`` (memmap at ``data.path``), ``text`` (a UTF-8 file at
    ``data.path``, byte-level), ``sklearn_text`` (bundled prose, byte-level) or a ``diffattn.data`` token set."""
    d = cfg.data
    if d.name == "tokens":
        if not d.path:
            raise ValueError("data.path must name a token memmap file for data.name 'tokens', got None")
        return TokenWindows.from_file(d.path, d.block_size, d.dtype)
    if d.name == "text":
        from pathlib import Path

        if not d.path or not Path(d.path).is_file():
            raise ValueError(f"data.path must name a UTF-8 text file for data.name 'text', got {d.path!r}")
        return TokenWindows(byte_tokens(Path(d.path).read_text(encoding="utf-8")), d.block_size)
    if d.name == "sklearn_text":
        return TokenWindows(sklearn_text_tokens(), d.block_size)

    return text_windows(external_dataset(cfg), cfg.data)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits (B, N, V), targets (B, N)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def token_windows(dataset):
    """The :class:`~diffattn.train.data.TokenWindows` behind an LM training set."""
    return getattr(dataset, "windows", dataset)


def lm_val_metrics(totals: dict[str, float], count: int) -> dict[str, float]:
    """Mean next-token loss over the validation windows and its perplexity."""
    import math

    loss = totals["loss"] / count
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0))}


@dataclass
class LMConfig(TaskConfig):
    """Language modelling reads no options besides its name."""

    name: str = "lm"


class LMTask(Task, name="lm", Config=LMConfig, metrics=("loss", "ppl"), data_kinds=("text",),
             data_formats=("tokens", "text", "sklearn_text"), pretrained=True):

    def dataset(self, model: nn.Module) -> Dataset:
        return lm_dataset(self.cfg)

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        # a released checkpoint's vocabulary is its own: model.overrides takes only the attention backend then
        key = None if self.cfg.model.pretrained else "model.overrides.vocab_size"
        check_tokens(token_windows(dataset), model, key)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch  # (B, N), (B, N)
        return lm_loss(model(x), y)

    def val_metrics(self, totals: dict[str, float], count: int) -> dict[str, float]:
        return lm_val_metrics(totals, count)
