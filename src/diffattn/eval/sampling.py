"""Seeded stratified samples of a split: the test (and training) images an evaluation protocol caps its sets at."""

from __future__ import annotations

import numpy as np

__all__ = ["stratified_subset"]


def stratified_subset(labels, n: int | None, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded stratified sample of ``n`` rows (all rows when ``n`` is None or covers them): each
    class keeps its share of the rows (largest remainders get the rows rounding leaves), its rows drawn at random,
    so a subset of a test split sorted by class still holds every class."""
    y = np.asarray(labels)
    if n is None or n >= len(y):
        return np.arange(len(y))
    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    share = n * counts / len(y)
    quota = np.floor(share).astype(int)
    left = n - int(quota.sum())
    quota[np.argsort(-(share - quota), kind="stable")[:left]] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(inverse == c))[:q] for c, q in enumerate(quota)]
    return np.sort(np.concatenate(picked))
