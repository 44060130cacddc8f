"""What every dataset reader shares: where the prepared data lives, the error for missing data, the hash split."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["SETUP_COMMAND", "SPLITS", "DatasetNotInstalledError", "default_root", "data_root", "user_cache_dir",
           "source_checkout", "dataset_dir", "hash_split", "check_split"]

#: The command that fetches and prepares the offline datasets (:mod:`diffattn.app.prepare`; ``make data`` in a
#: source checkout runs it).
SETUP_COMMAND = "diffattn data prepare"
#: The split names every built-in dataset accepts; ``"all"`` is the whole set in its fixed order.
SPLITS = ("train", "val", "test", "all")
#: Fractions of the hash split (train, val, test); see :func:`hash_split`.
HASH_FRACTIONS = (0.8, 0.1, 0.1)


#: dataset folder → the ``diffattn data prepare`` name that makes it
_PREPARE_NAME = {"spam_assassin": "spamassassin"}


class DatasetNotInstalledError(FileNotFoundError):
    """A built-in dataset's prepared files are missing; the message names the setup command."""


def source_checkout() -> Path | None:
    """The source checkout this package is imported from (``<checkout>/src/diffattn``), or None for an installed
    copy (a wheel in site-packages)."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent.parent
    if package.parent.name != "src" or not (checkout / "pyproject.toml").is_file():
        return None
    try:
        return checkout if 'name = "diffattn"' in (checkout / "pyproject.toml").read_text(encoding="utf-8") else None
    except OSError:
        return None


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/diffattn``, else ``~/.cache/diffattn`` (the XDG Base Directory Specification: a relative
    ``XDG_CACHE_HOME`` is ignored)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "diffattn"


def data_root() -> tuple[Path, str]:
    """The data directory and why it was chosen, the same from any working directory:

    1. ``$DIFFATTN_DATA`` when set (``"DIFFATTN_DATA"``);
    2. the source checkout's ``data/`` when diffattn is imported from a checkout that has one (``"checkout"``),
       so a checkout prepared with ``make data`` keeps using it;
    3. the user cache, ``$XDG_CACHE_HOME/diffattn`` or ``~/.cache/diffattn`` (``"user cache"``).
    """
    env = os.environ.get("DIFFATTN_DATA", "")
    if env:
        return Path(env).expanduser(), "DIFFATTN_DATA"
    checkout = source_checkout()
    if checkout is not None and (checkout / "data").is_dir():
        return checkout / "data", "checkout"
    return user_cache_dir(), "user cache"


def default_root() -> Path:
    """The folder that holds the prepared datasets (:func:`data_root` says how it is chosen)."""
    return data_root()[0]


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
            f"`{SETUP_COMMAND} {_PREPARE_NAME.get(name, name)}` (`make data` in a source checkout), or pass root= "
            f"(or set DIFFATTN_DATA to) the folder that holds the prepared data.")
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
