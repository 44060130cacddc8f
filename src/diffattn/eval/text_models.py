"""Loading language models and their tokenizers for evaluation: the library's causal LMs saved with
``save_pretrained`` (a folder or a training run directory) and Hugging Face causal LMs, optionally with a saved
:func:`diffattn.save_adapter` retrofit.

Tokenizers (``tokenizer=``):

- ``"gpt2"``: GPT-2's byte-level BPE through :func:`diffattn.data.gpt2_tokenizer` (ranks installed by
  ``diffattn data prepare``);
- ``"bytes"``: UTF-8 bytes as ids 0–255 (always available; any model with ``vocab_size >= 256``);
- a folder or name a ``transformers.AutoTokenizer`` can load offline.

When none is given: the run's ``config.yaml`` (``bytes`` for the byte-level ``text`` / ``sklearn_text`` data, else
the key ``tokenizer``, top level or under ``data``), then the Hugging
Face tokenizer saved beside the model, then ``"gpt2"`` for a vocabulary of at least 50,257 ids, else ``"bytes"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..adapters import load_adapter
from ..adapters.hf import install_load_warning
from ..data import GPT2_EOT, gpt2_tokenizer
from ..factory import RETROFIT_RUN, find_saved_model, from_pretrained, is_retrofit_run, load_retrofit_run

__all__ = ["Tokenizer", "get_text_tokenizer", "find_saved_model", "load_language_model", "lm_logits", "RETROFIT_RUN",
           "is_retrofit_run", "load_retrofit_run"]



@dataclass
class Tokenizer:
    """``encode(str) -> list[int]`` (no special tokens), ``decode(list[int]) -> str``, the end-of-text id."""

    name: str
    encode: Any
    decode: Any
    eot: int | None


def _bytes_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", lambda s: list(s.encode("utf-8")),
                     lambda ids: bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace"),
                     None)


def get_text_tokenizer(spec: str | None = None, *, model_dir: str | Path | None = None,
                       vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer named by ``spec`` (module docstring), or the default for ``model_dir`` / ``vocab_size``."""
    if spec is None and model_dir is not None:
        spec = _tokenizer_from_run(Path(model_dir))
    if spec is None:
        spec = "gpt2" if (vocab_size or 0) >= 50257 else "bytes"
    if spec == "bytes":
        if vocab_size is not None and vocab_size < 256:
            raise ValueError(f"tokenizer 'bytes' needs vocab_size >= 256, the model has {vocab_size}")
        return _bytes_tokenizer()
    if spec == "gpt2":
        enc = gpt2_tokenizer()
        return Tokenizer("gpt2", enc.encode_ordinary, enc.decode, GPT2_EOT)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(spec))
    return Tokenizer(str(spec), lambda s: tok.encode(s, add_special_tokens=False), tok.decode, tok.eos_token_id)


def _tokenizer_from_run(path: Path) -> str | None:
    for d in (path, *path.parents[:2]):
        cfg = d / "config.yaml"
        if cfg.is_file():
            import yaml

            data = yaml.safe_load(cfg.read_text()) or {}
            section = data.get("data") if isinstance(data.get("data"), dict) else {}
            if section.get("name") in ("text", "sklearn_text"):  # the training recipes' byte-level text sets
                return "bytes"
            tok = data.get("tokenizer") or section.get("tokenizer")
            if isinstance(tok, str):
                return tok
    for d in (path,):
        if (d / "tokenizer.json").is_file() or (d / "tokenizer_config.json").is_file():
            return str(d)
    return None


def load_language_model(pretrained: str | Path | None = None, *, base: str | None = None,
                        adapter: str | Path | None = None, tokenizer: str | None = None,
                        device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> tuple[nn.Module, Tokenizer, int]:
    """(model in eval mode, tokenizer, max context length).

    Either ``pretrained`` (a diffattn saved model or run directory) or ``base`` (a Hugging Face causal LM folder
    or name, loaded offline) with optional ``adapter`` (a folder written by :func:`diffattn.save_adapter`).
    """
    if (pretrained is None) == (base is None):
        raise ValueError(f"give exactly one of pretrained (a diffattn model/run dir) or base (a Hugging Face model), "
                         f"got pretrained={pretrained!r}, base={base!r}")
    if pretrained is not None:
        if adapter is not None:
            raise ValueError("adapter goes with base (a Hugging Face model), not with pretrained")

        folder = find_saved_model(pretrained)
        model = from_pretrained(folder)
        vocab = getattr(model, "vocab_size", None)
        tok = get_text_tokenizer(tokenizer, model_dir=folder if tokenizer is None else None, vocab_size=vocab)
        max_len = int(getattr(model, "max_seq_len", 2048))
    else:
        from transformers import AutoModelForCausalLM


        install_load_warning()
        model = AutoModelForCausalLM.from_pretrained(base)
        if adapter is not None:
            model = load_adapter(model, adapter)
        tok = get_text_tokenizer(tokenizer if tokenizer is not None else str(base),
                                 vocab_size=model.config.vocab_size)
        max_len = int(getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions",
                                                                                         2048))
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model.eval(), tok, max_len


def lm_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(B, N) ids → (B, N, V) float32 logits for a diffattn ``CausalLM`` or a Hugging Face causal LM."""
    out = model(ids)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return logits.float()
