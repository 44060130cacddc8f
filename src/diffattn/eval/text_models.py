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
from ..errors import UsageError, one_line
from ..factory import RETROFIT_RUN, find_saved_model, is_retrofit_run, load_retrofit_run, load_run, run_source
from ..io import from_hub, local_path

__all__ = ["Tokenizer", "get_text_tokenizer", "recorded_tokenizer", "find_saved_model", "load_language_model",
           "lm_logits", "RETROFIT_RUN", "is_retrofit_run", "load_retrofit_run"]


@dataclass
class Tokenizer:
    """``encode(str) -> list[int]`` (no special tokens), ``decode(list[int]) -> str``, the end-of-text id; ``hf``:
    the ``transformers`` tokenizer behind it (None for ``bytes`` and ``gpt2``)."""

    name: str
    encode: Any
    decode: Any
    eot: int | None
    hf: Any = None

    def pieces(self, ids: list[int]) -> list[str]:
        """Each id as text: the tokenizer's own token strings (``transformers``), else each id decoded alone."""
        if self.hf is not None:
            return self.hf.convert_ids_to_tokens(list(ids))
        return [self.decode([i]) for i in ids]


def _bytes_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", lambda s: list(s.encode("utf-8")),
                     lambda ids: bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace"),
                     None)


#: the files of a tokenizer fetched from the Hugging Face Hub (no code: nothing is run from the repo)
_TOKENIZER_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken"]


def _hf_tokenizer(spec: str) -> Tokenizer:
    """A ``transformers`` tokenizer from a local folder (never sent to the Hub: :func:`diffattn.io.local_path`) or a
    Hub id (its tokenizer files, offline from the cache at once: :func:`diffattn.io.from_hub`); any failure is one
    :class:`~diffattn.errors.UsageError` line naming ``spec``."""
    needs = "it takes bytes, gpt2, a tokenizer folder or a Hugging Face Hub id"
    folder = local_path(spec, "tokenizer", needs)
    if folder is None:
        from huggingface_hub import snapshot_download

        folder = from_hub(snapshot_download, spec, "tokenizer", allow_patterns=_TOKENIZER_FILES)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' many error types: one line naming the folder
        raise UsageError(f"tokenizer {spec!r} could not be loaded from {str(folder)!r} ({type(e).__name__}: "
                         f"{one_line(e).split('; ')[0]}); {needs}") from None
    return Tokenizer(str(spec), lambda s: tok.encode(s, add_special_tokens=False), tok.decode, tok.eos_token_id,
                     hf=tok)


def get_text_tokenizer(spec: str | None = None, *, model_dir: str | Path | None = None,
                       vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer named by ``spec`` (module docstring), or the default for ``model_dir`` / ``vocab_size``.
    ``bytes`` and ``gpt2`` never touch the network; a failure is one line naming the tokenizer."""
    if spec is None and model_dir is not None:
        spec = recorded_tokenizer(Path(model_dir))
    if spec is None:
        spec = "gpt2" if (vocab_size or 0) >= 50257 else "bytes"
    if spec == "bytes":
        if vocab_size is not None and vocab_size < 256:
            raise UsageError(f"tokenizer 'bytes' needs vocab_size >= 256, the model has {vocab_size}")
        return _bytes_tokenizer()
    if spec == "gpt2":
        enc = gpt2_tokenizer()
        return Tokenizer("gpt2", enc.encode_ordinary, enc.decode, GPT2_EOT)
    return _hf_tokenizer(str(spec))


def recorded_tokenizer(path: str | Path) -> str | None:
    """The tokenizer a model or run folder records, for every command that reads it (``eval``, ``inspect``,
    ``lm-eval``): its run's ``config.yaml`` (``bytes`` for the byte-level ``text`` / ``sklearn_text`` data, else the
    key ``tokenizer``, top level or under ``data``; the folder or up to two folders above it), else the folder
    itself when it holds a ``transformers`` tokenizer; None when it records none."""
    return _tokenizer_from_run(Path(path).expanduser())


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
    if any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return str(path)
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

        _, folder = run_source(pretrained, "pretrained")  # any folder load_run takes, released ones included
        model = load_run(folder)
        config = getattr(model, "config", None)
        vocab = getattr(model, "vocab_size", None) or getattr(config, "vocab_size", None)
        tok = get_text_tokenizer(tokenizer, model_dir=folder if tokenizer is None else None, vocab_size=vocab)
        max_len = int(getattr(model, "max_seq_len", None) or getattr(config, "max_position_embeddings", None) or 2048)
    else:
        from transformers import AutoModelForCausalLM

        folder = local_path(base, "base", "it takes a Hugging Face causal LM folder or Hub id")
        if folder is None:
            from huggingface_hub import snapshot_download

            folder = from_hub(snapshot_download, str(base), "base", allow_patterns=["*.json", "*.safetensors",
                                                                                  *_TOKENIZER_FILES])
        install_load_warning()
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        if adapter is not None:
            model = load_adapter(model, adapter)
        tok = get_text_tokenizer(tokenizer if tokenizer is not None else str(folder),
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
