"""Tokenizers that travel with a causal LM: GPT-2 BPE through tiktoken, or any Hugging Face tokenizer.

:func:`as_lm_tokenizer` wraps what the user has — ``"gpt2"`` (the exact GPT-2 byte-level BPE of Radford et al. 2019
from the local ``gpt2.tiktoken`` that ``diffattn data prepare gpt2`` installs,
:func:`diffattn.data.tokenizers.gpt2_tokenizer`), a
``tiktoken.Encoding`` or a ``transformers`` tokenizer — in one small interface: ``encode(text) -> list[int]`` (no
special tokens), ``decode(ids) -> str``, ``eot_token_id`` and ``vocab_size``.

``save(folder)`` writes ``diffattn_tokenizer.json`` (the kind, and for tiktoken the name, pattern, special tokens and
the SHA-256 of the ranks file) plus the tokenizer's own files: ``tokenizer.tiktoken`` (tiktoken's ranks format) or
the Hugging Face tokenizer's ``save_pretrained`` output in ``tokenizer/``. :func:`load_lm_tokenizer` reads them back
offline and checks the ranks file's hash, so a changed vocabulary is an error, never a silent re-tokenisation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ..data.tokenizers import gpt2_tokenizer

__all__ = ["LMTokenizer", "TiktokenTokenizer", "HFTokenizer", "as_lm_tokenizer", "load_lm_tokenizer",
           "TOKENIZER_CONFIG"]

TOKENIZER_CONFIG = "diffattn_tokenizer.json"
_RANKS = "tokenizer.tiktoken"
_HF_DIR = "tokenizer"


class LMTokenizer(ABC):
    """The interface :class:`~diffattn.models.CausalLM` uses: text ↔ ids, the end-of-text id, the vocabulary size."""

    kind = "?"
    eot_token_id: int | None
    vocab_size: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        ...

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        ...

    @abstractmethod
    def save(self, folder: str | os.PathLike) -> None:
        ...


class TiktokenTokenizer(LMTokenizer):
    """A ``tiktoken.Encoding`` (GPT-2's by default); ``encode`` skips special tokens (``encode_ordinary``)."""

    kind = "tiktoken"

    def __init__(self, encoding):
        self.encoding = encoding
        self.eot_token_id = encoding.eot_token
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(list(ids))

    def save(self, folder: str | os.PathLike) -> None:
        folder = Path(folder)
        # tiktoken's ranks format (the one load_tiktoken_bpe reads): "base64(token bytes) rank" per line
        ranks = self.encoding._mergeable_ranks  # tiktoken exposes no public accessor for the ranks
        data = "".join(f"{base64.b64encode(tok).decode()} {rank}\n"
                       for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])).encode()
        (folder / _RANKS).write_bytes(data)
        meta = {"kind": self.kind, "name": self.encoding.name, "pattern": self.encoding._pat_str,
                "special_tokens": dict(self.encoding._special_tokens), "n_vocab": self.encoding.n_vocab,
                "sha256": hashlib.sha256(data).hexdigest()}
        (folder / TOKENIZER_CONFIG).write_text(json.dumps(meta, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path, meta: dict) -> TiktokenTokenizer:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        missing = [k for k in ("name", "pattern", "special_tokens", "n_vocab", "sha256") if k not in meta]
        if missing:
            raise ValueError(f"{folder / TOKENIZER_CONFIG} lacks {missing}; was it written by diffattn's save?")
        path = folder / _RANKS
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != meta["sha256"]:
            raise ValueError(f"{path} has SHA-256 {digest}, but {folder / TOKENIZER_CONFIG} says {meta['sha256']}: the "
                             "vocabulary changed since the model was saved")
        ranks = load_tiktoken_bpe(str(path), expected_hash=digest)
        return cls(tiktoken.Encoding(name=meta["name"], pat_str=meta["pattern"], mergeable_ranks=ranks,
                                     special_tokens=meta["special_tokens"], explicit_n_vocab=meta["n_vocab"]))


class HFTokenizer(LMTokenizer):
    """A ``transformers`` tokenizer; ``encode`` adds no special tokens; end of text is its ``eos_token_id``."""

    kind = "huggingface"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eot_token_id = tokenizer.eos_token_id
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def save(self, folder: str | os.PathLike) -> None:
        folder = Path(folder)
        self.tokenizer.save_pretrained(folder / _HF_DIR)
        (folder / TOKENIZER_CONFIG).write_text(json.dumps({"kind": self.kind}), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path, meta: dict) -> HFTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(folder / _HF_DIR, local_files_only=True))


def as_lm_tokenizer(tokenizer: Any) -> LMTokenizer:
    """``"gpt2"`` (local ranks, no network), a ``tiktoken.Encoding``, a ``transformers`` tokenizer or an
    :class:`LMTokenizer` → an :class:`LMTokenizer`; anything else is a TypeError."""
    if isinstance(tokenizer, LMTokenizer):
        return tokenizer
    if tokenizer == "gpt2":
        return TiktokenTokenizer(gpt2_tokenizer())
    if type(tokenizer).__module__.startswith("tiktoken") and hasattr(tokenizer, "encode_ordinary"):
        return TiktokenTokenizer(tokenizer)
    try:
        from transformers import PreTrainedTokenizerBase
    except ImportError:  # transformers is optional
        PreTrainedTokenizerBase = ()
    if PreTrainedTokenizerBase and isinstance(tokenizer, PreTrainedTokenizerBase):
        return HFTokenizer(tokenizer)
    raise TypeError(f"tokenizer must be 'gpt2', a tiktoken.Encoding or a transformers tokenizer, got "
                    f"{type(tokenizer).__name__}")


def load_lm_tokenizer(folder: str | os.PathLike) -> LMTokenizer | None:
    """The tokenizer saved in ``folder`` by :meth:`LMTokenizer.save`, or None if it holds none."""
    folder = Path(folder)
    cfg = folder / TOKENIZER_CONFIG
    if not cfg.is_file():
        return None
    try:
        meta = json.loads(cfg.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg} is not valid JSON: {e}") from e
    kinds = {TiktokenTokenizer.kind: TiktokenTokenizer, HFTokenizer.kind: HFTokenizer}
    if not isinstance(meta, dict) or meta.get("kind") not in kinds:
        raise ValueError(f"{cfg} must be a JSON object whose 'kind' is one of {sorted(kinds)}, got {meta!r:.200}")
    return kinds[meta["kind"]].load(folder, meta)
