"""Key/value caches for incremental decoding: :class:`KVCache` grows by concatenation, :class:`StaticKVCache` writes
into buffers allocated once.

Both store keys after the rotary embedding, in the layer's own head layout, and return what a layer attends over:
every cached position. A layer uses either through ``update(k, v)`` and ``length``.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache", "StaticKVCache", "KV_CACHES"]


class KVCache:
    """Keys and values of one attention layer, appended along the sequence axis.

    Keys are stored after the rotary embedding, in the layer's own head layout: (B, heads, N, d) for keys and
    (B, heads, N, dv) for values, so a differential layer's cache holds 2·Hkv key heads and Hkv value heads of
    width 2d. ``length`` is the number of cached positions, which is also the position of the next token.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, h, n, d) keys and (B, h', n, dv) values; return everything cached so far.

        Each call copies every cached key and value into a new tensor (``torch.cat``), so decoding T tokens copies
        O(T²) values; :class:`StaticKVCache` does not."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            if k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]:
                raise ValueError(f"k of shape {tuple(k.shape)} does not extend the cached keys of shape "
                                 f"{tuple(self.k.shape)} (batch, heads and width must match)")
            self.k = torch.cat([self.k, k], dim=-2)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reset(self) -> None:
        self.k = self.v = None

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class StaticKVCache:
    """Keys and values of one attention layer in buffers of ``max_length`` positions, allocated at the first update.

    ``update`` writes the n new positions in place at ``length`` (no copy of the past, so a decoding step costs the
    same whatever was generated before) and returns views of the buffers' first ``length`` positions:
    (B, h, length, d) keys and (B, h', length, dv) values, the tensors :class:`KVCache` would return. The buffers'
    shapes never change, which is what ``torch.compile`` and CUDA graphs need.

    Args:
        max_length: the most positions the cache holds (prompt plus generated tokens); an update past it raises.
    """

    def __init__(self, max_length: int) -> None:
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        self.max_length = max_length
        self.k: torch.Tensor | None = None  # (B, h, max_length, d)
        self.v: torch.Tensor | None = None  # (B, h', max_length, dv)
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, h, n, d) keys and (B, h', n, dv) values at positions ``length`` … ``length + n − 1``; return
        views of every cached position."""
        n, start = k.shape[-2], self._length
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:-2], self.max_length, k.shape[-1])
            self.v = v.new_zeros(*v.shape[:-2], self.max_length, v.shape[-1])
        elif k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1] or v.shape[:2] != self.v.shape[:2] \
                or v.shape[-1] != self.v.shape[-1]:
            raise ValueError(f"k of shape {tuple(k.shape)} and v of shape {tuple(v.shape)} do not extend the cache "
                             f"of keys {tuple(self.k.shape)} and values {tuple(self.v.shape)} (batch, heads and "
                             f"width must match)")
        if start + n > self.max_length:
            raise ValueError(f"the static KV cache holds max_length={self.max_length} positions; {start} are cached "
                             f"and {n} more do not fit (build it with a larger max_length)")
        self.k[:, :, start:start + n] = k
        self.v[:, :, start:start + n] = v
        self._length = start + n
        return self.k[:, :, :self._length], self.v[:, :, :self._length]

    def reset(self) -> None:
        """Forget the cached positions (the buffers are kept and overwritten)."""
        self._length = 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached positions (e.g. to decode again from the same prompt)."""
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= self._length:
            raise ValueError(f"length must be an integer in [0, {self._length}] (the cached positions), got "
                             f"{length!r}")
        self._length = length

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


#: the caches by the name ``generate(cache=...)`` takes
KV_CACHES = {"dynamic": KVCache, "static": StaticKVCache}
