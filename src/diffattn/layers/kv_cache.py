"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


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
        """Append (B, h, n, d) keys and (B, h', n, dv) values; return everything cached so far."""
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
