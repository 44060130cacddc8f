"""What every dataset reader shares: where the prepared data lives, the error for missing data, the hash split."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["SETUP_COMMAND", "SPLITS", "DatasetNotInstalledError", "default_root", "dataset_dir", "hash_split",
           "check_split"]

#: The command that installs and prepares every offline dataset (it runs ``scripts/fetch_data.sh``).
SETUP_COMMAND = "make data"
#: The split names every built-in dataset accepts; ``"all"`` is the whole set in its fixed order.
SPLITS = ("train", "val", "test", "all")
#: Fractions of the hash split (train, val, test); see :func:`hash_split`.
HASH_FRACTIONS = (0.8, 0.1, 0.1)


class DatasetNotInstalledError(FileNotFoundError):
    """A built-in dataset's prepared files are missing; the message names the setup command."""


def default_root() -> Path:
    """The folder that holds the prepared datasets: ``$DIFFATTN_DATA`` if set, else ``./data``."""
    return Path(os.environ.get("DIFFATTN_DATA", "data"))


def dataset_dir(root: str | os.PathLike | None, name: str, stamp: str = ".prepared") -> Path:
    """``<root>/<name>``, checked to hold the ``stamp`` file the setup writes last (so half-written data is missing).

    Raises:
        DatasetNotInstalledError: the folder or its stamp is missing; the message says how to install it.
    """
    base = default_root() if root is None else Path(root)
    path = base / name
    if not (path / stamp).is_file():
        raise DatasetNotInstalledError(
            f"dataset {name!r} is not installed: {str(path / stamp)!r} not found. Install and prepare it with "
            f"`{SETUP_COMMAND}` (runs scripts/fetch_data.sh) from the repository root, or pass root= (or set "
            f"DIFFATTN_DATA to) the folder that holds the prepared data.")
    return path


def check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> str:
    if split not in allowed:
        raise ValueError(f"split must be one of {allowed}, got {split!r}")
    return split


def hash_split(key: str) -> str:
    """The split of an item from its stable key alone: ``u = sha256(key)[:8] / 2**64``; train if u < 0.8, val if
    u < 0.9, else test. Adding or removing other items never moves an item, and every item sharing a key (all the
    captions of one image, all images of one caption) lands on the same side."""
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    if u < HASH_FRACTIONS[0]:
        return "train"
    return "val" if u < HASH_FRACTIONS[0] + HASH_FRACTIONS[1] else "test"
