"""Argument checks shared by the evaluation modules: every message names the argument, what it got and what it
needs."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shape_of(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def as_tensor(name: str, x, *, dim: int | None = None, floating: bool | None = None) -> torch.Tensor:
    """``x`` as a tensor (numpy arrays and nested lists are converted), checked for rank and dtype kind."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name} must be a tensor or array, got {type(x).__name__}") from e
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D tensor, got shape {tuple(x.shape)}")
    if floating is True and not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    if floating is False and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} holds NaN or infinite values")
    return x


def check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks) if not isinstance(ks, int) else (ks,)
    if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    return ks


def check_int(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value
