"""Tokenizers: exact GPT-2 byte-level BPE through ``tiktoken`` with the shipped ranks, and CLIP's BPE through
open_clip.

GPT-2 (Radford et al. 2019) ranks come from ``gpt2.tiktoken`` (the 50,256 merges OpenAI ships inside the
``openai-whisper`` source distribution), which ``diffattn data prepare gpt2`` extracts into
``<data root>/tokenizers/``; tiktoken turns them into the exact GPT-2 ids (``"Hello world"`` → ``[15496, 995]``;
``<|endoftext|>`` = 50256). The CLIP tokenizer (Radford et al. 2021) is open_clip's ``SimpleTokenizer``, whose
vocabulary ships with open_clip.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._common import SETUP_COMMAND, DatasetNotInstalledError, default_root

__all__ = ["GPT2_EOT", "GPT2_TIKTOKEN_SHA256", "gpt2_tokenizer", "clip_tokenizer", "TextTokenizer", "get_tokenizer",
           "TOKENIZERS", "split_words"]

GPT2_EOT = 50256
#: sha256 of ``whisper/assets/gpt2.tiktoken`` (openai-whisper 20250625); tiktoken checks it on load.
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
#: GPT-2's pre-tokenisation pattern (tiktoken's r50k/gpt2 pattern).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _gpt2_ranks_path(path: str | os.PathLike | None) -> Path:
    if path is not None:
        return Path(path)
    return default_root() / "tokenizers" / "gpt2.tiktoken"


@functools.lru_cache(maxsize=4)
def _gpt2(path: str):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(path, expected_hash=GPT2_TIKTOKEN_SHA256)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_EOT + 1)


def gpt2_tokenizer(path: str | os.PathLike | None = None):
    """The GPT-2 ``tiktoken.Encoding`` built from the shipped ranks (``<data root>/tokenizers/gpt2.tiktoken``
    unless ``path`` is given); no network access.

    Raises:
        DatasetNotInstalledError: the ranks file is missing; the message names the setup command.
    """
    p = _gpt2_ranks_path(path)
    if not p.is_file():
        raise DatasetNotInstalledError(
            f"GPT-2 BPE ranks not found at {str(p)!r}. `{SETUP_COMMAND} gpt2` extracts them from the openai-whisper "
            f"sdist (pip download --no-deps --no-binary :all: openai-whisper), or pass path= a gpt2.tiktoken file.")
    return _gpt2(str(p.resolve()))


def clip_tokenizer(context_length: int = 77):
    """open_clip's CLIP BPE tokenizer: ``tok(texts)`` → (B, context_length) int64 ids, ``<start_of_text>`` …
    ``<end_of_text>``, zero-padded (Radford et al. 2021, §2.4)."""
    if not isinstance(context_length, int) or context_length < 2:
        raise ValueError(f"context_length must be an int >= 2, got {context_length!r}")
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=context_length)


@dataclass(frozen=True)
class TextTokenizer:
    """A tokenizer for token streams: ``encode(text) -> list[int]`` without special tokens, plus the id that ends
    each document in a stream and the vocabulary size (which picks the memmap dtype)."""

    name: str
    encode: Callable[[str], list[int]]
    eot: int
    vocab_size: int


def _gpt2_text(path=None) -> TextTokenizer:
    enc = gpt2_tokenizer(path)
    return TextTokenizer("gpt2", enc.encode_ordinary, GPT2_EOT, enc.n_vocab)


def _clip_text(path=None) -> TextTokenizer:
    tok = clip_tokenizer()
    return TextTokenizer("clip", tok.encode, tok.eot_token_id, tok.vocab_size)


TOKENIZERS: dict[str, Callable[..., TextTokenizer]] = {"gpt2": _gpt2_text, "clip": _clip_text}


def get_tokenizer(name: str = "gpt2") -> TextTokenizer:
    """``"gpt2"`` or ``"clip"`` as a :class:`TextTokenizer`."""
    if name not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {sorted(TOKENIZERS)}, got {name!r}")
    return TOKENIZERS[name]()


_QUOTES = re.compile(r"[\"\u201c\u201d\u2018\u2019']")
_SPLIT = re.compile(r"[a-z0-9\u00c0-\u024f]+(?:-[a-z0-9\u00c0-\u024f]+)*|\?")


def split_words(text: str) -> list[str]:
    """The word tokens of ``text``, the vocabulary of the VLM's word tokenizer (:mod:`diffattn.models.vlm`) and of
    the question sets (:mod:`diffattn.data.vqa`): lower-cased words (letters, digits, inner hyphens; quotes dropped)
    and "?" marks, in order ("A “Sierra-Beauty” apple?" → ["a", "sierra-beauty", "apple", "?"])."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _SPLIT.findall(_QUOTES.sub("", text.lower()))
