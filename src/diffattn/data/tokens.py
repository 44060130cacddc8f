"""Token streams on disk: nanoGPT's flat binary of token ids (``uint16`` when the vocabulary fits, else
``uint32``), with a small JSON sidecar ``<file>.json`` (``dtype``, ``n_tokens``, ``tokenizer``, ``vocab_size``)
that diffattn writes and reads when present; a bare nanoGPT ``train.bin`` reads with ``dtype="uint16"``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..io import atomic_write_file
from .tokenizers import TextTokenizer, get_tokenizer

__all__ = ["TOKEN_DTYPES", "TokenMemmap", "write_token_memmap", "tokenize_documents", "read_token_meta"]

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_token_meta(path: str | os.PathLike) -> dict | None:
    """The sidecar metadata of a token file, or None when it has none."""
    side = _sidecar(Path(path))
    if not side.is_file():
        return None
    with open(side, encoding="utf-8") as f:
        return json.load(f)


def tokenize_documents(texts: Iterable[str], tokenizer="gpt2") -> np.ndarray:
    """Concatenate ``encode(text) + [eot]`` over ``texts`` (nanoGPT's ``prepare.py`` layout) → (T,) int64 ids.

    ``tokenizer`` is a name (``"gpt2"``, ``"clip"``) or a :class:`diffattn.data.TextTokenizer`.
    """
    tok = get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if not isinstance(tok, TextTokenizer):
        raise TypeError(f"tokenizer must be a name or a TextTokenizer, got {type(tokenizer).__name__}")
    chunks = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must hold str, got {type(text).__name__}")
        chunks.append(np.asarray(tok.encode(text) + [tok.eot], dtype=np.int64))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


def write_token_memmap(tokens, path: str | os.PathLike, *, dtype: str | None = None, vocab_size: int | None = None,
                       tokenizer: str | None = None) -> Path:
    """Write token ids as a flat little-endian binary (atomically) plus its JSON sidecar.

    Args:
        tokens: 1-D integer ids (array, tensor or list).
        dtype: ``"uint16"`` or ``"uint32"``; default the smallest that holds ``vocab_size`` (or the largest id).
        vocab_size: recorded in the sidecar; every id must be below it.
        tokenizer: recorded in the sidecar (e.g. ``"gpt2"``).
    """
    arr = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"tokens must be a 1-D integer sequence, got shape {arr.shape} dtype {arr.dtype}")
    top = int(arr.max()) if arr.size else 0
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"tokens must be non-negative ids, got minimum {int(arr.min())}")
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(f"tokens must be < vocab_size={vocab_size}, got an id {top}")
    need = vocab_size if vocab_size is not None else top + 1
    if dtype is None:
        dtype = "uint16" if need <= 2**16 else "uint32"
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TOKEN_DTYPES)}, got {dtype!r}")
    if top > np.iinfo(TOKEN_DTYPES[dtype]).max:
        raise ValueError(f"dtype={dtype!r} cannot hold token id {top}; use 'uint32'")
    path = Path(path)
    with atomic_write_file(path) as f:
        f.write(arr.astype(np.dtype(TOKEN_DTYPES[dtype]).newbyteorder("<"), copy=False).tobytes())
    meta = {"dtype": dtype, "n_tokens": int(arr.size), "tokenizer": tokenizer, "vocab_size": vocab_size}
    with atomic_write_file(_sidecar(path), "w") as f:
        json.dump(meta, f, indent=1)
    return path


class TokenMemmap(Dataset):
    """A token file as non-overlapping language-model windows: item ``i`` is ``(x, y)`` with
    ``x = t[i·L : i·L + L]`` and ``y = t[i·L + 1 : i·L + L + 1]`` (int64, shape (L,)), ``L = block_size``.

    :meth:`get_batch` draws random windows as nanoGPT's ``get_batch`` does. ``dtype`` defaults to the sidecar's;
    without a sidecar it must be given (a raw file does not say its width).
    """

    def __init__(self, path: str | os.PathLike, block_size: int, dtype: str | None = None) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"token file {str(path)!r} not found; write one with `diffattn data tokenize`")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        meta = read_token_meta(path)
        if dtype is None:
            if meta is None:
                raise ValueError(f"dtype must be given for {str(path)!r} (no {_sidecar(path).name} sidecar): "
                                 f"one of {sorted(TOKEN_DTYPES)}")
            dtype = meta["dtype"]
        if dtype not in TOKEN_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(TOKEN_DTYPES)}, got {dtype!r}")
        width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
        size = path.stat().st_size
        if size % width:
            raise ValueError(f"{str(path)!r} has {size} bytes, not a multiple of {width} (dtype={dtype!r})")
        if meta is not None and meta.get("n_tokens") not in (None, size // width):
            raise ValueError(f"{str(path)!r} holds {size // width} tokens but its sidecar says {meta['n_tokens']}")
        if size // width < block_size + 1:
            raise ValueError(f"block_size={block_size} needs at least {block_size + 1} tokens, "
                             f"{str(path)!r} has {size // width}")
        self.path, self.block_size, self.dtype, self.meta = path, block_size, dtype, meta
        self.tokens = np.memmap(path, dtype=np.dtype(TOKEN_DTYPES[dtype]).newbyteorder("<"), mode="r")  # (T,)

    def __getstate__(self) -> dict:  # DataLoader workers reopen the map instead of receiving a copy of the tokens
        state = dict(self.__dict__)
        del state["tokens"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.tokens = np.memmap(self.path, dtype=np.dtype(TOKEN_DTYPES[self.dtype]).newbyteorder("<"), mode="r")

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def _window(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = torch.from_numpy(self.tokens[start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} windows")
        return self._window((i % len(self)) * self.block_size)

    def get_batch(self, batch_size: int, generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (batch_size, block_size) int64, from uniformly random start offsets."""
        starts = torch.randint(len(self.tokens) - self.block_size, (batch_size,), generator=generator)
        pairs = [self._window(int(s)) for s in starts]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
