"""Real offline image sets: Fashion-MNIST, scikit-learn's digits, and the two image–caption sets (Tux Paint stamps,
Noto emoji), all read from what ``diffattn data prepare`` prepared.

Classification sets return ``(image, label)`` like torchvision (a PIL image unless ``transform`` is given) and
expose the whole set as arrays (``images``, ``labels``) for vectorised use. Caption sets return a dict sample
``{"image", "caption", "category", "mask", "key"}``: ``mask`` is the foreground mask from the source image's alpha
channel (``alpha >= 128``), a bool tensor of the prepared image's size, untouched by ``transform``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ._common import check_split, dataset_dir, hash_split
from .text import stratified_split

__all__ = ["FashionMNIST", "Digits", "CaptionImages", "FASHION_MNIST_CLASSES", "read_idx"]

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An (uncompressed) IDX file as a read-only memory map: magic ``0x0000 <dtype> <ndim>``, ``ndim`` big-endian
    uint32 sizes, then the data (LeCun et al., the MNIST file format)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\x00\x00" or head[2] not in _IDX_DTYPES:
            raise ValueError(f"{str(path)!r} is not an IDX file (magic {head.hex()!r})")
        ndim = head[3]
        shape = tuple(int(x) for x in np.frombuffer(f.read(4 * ndim), dtype=">u4"))
    return np.memmap(path, dtype=_IDX_DTYPES[head[2]], mode="r", offset=4 + 4 * ndim, shape=shape)


def _to_pil(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(array))


class FashionMNIST(Dataset):
    """Fashion-MNIST (Xiao et al. 2017): 28×28 grey Zalando product photos, 10 classes, MIT licence.

    Splits: ``test`` is the official 10,000-image test set; the official 60,000 training images are split by a
    fixed permutation (``numpy.random.default_rng(0).permutation(60000)``): its first 5,000 are ``val``, the other
    55,000 ``train``; ``trainval`` is all 60,000 in file order, ``all`` the 70,000 (training then test).
    """

    splits = ("train", "val", "test", "trainval", "all")
    classes = FASHION_MNIST_CLASSES
    #: the class names a zero-shot prompt says ("a photo of a {}.")
    prompt_names = ("t-shirt", "trousers", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                    "ankle boot")
    n_val = 5000

    def __init__(self, split: str = "train", root: str | os.PathLike | None = None,
                 transform: Callable | None = None) -> None:
        self.split = check_split(split, self.splits)
        self.transform = transform
        folder = dataset_dir(root, "fashion_mnist")
        parts = []
        if split in ("train", "val", "trainval", "all"):
            parts.append(("train", read_idx(folder / "train-images-idx3-ubyte"),
                          read_idx(folder / "train-labels-idx1-ubyte")))
        if split in ("test", "all"):
            parts.append(("test", read_idx(folder / "t10k-images-idx3-ubyte"),
                          read_idx(folder / "t10k-labels-idx1-ubyte")))
        if split in ("train", "val"):
            _, images, labels = parts[0]
            perm = np.random.default_rng(0).permutation(len(labels))
            idx = np.sort(perm[:self.n_val] if split == "val" else perm[self.n_val:])
            self.images, self.labels = images[idx], labels[idx].astype(np.int64)
        elif len(parts) == 1:
            idx = np.arange(len(parts[0][2]))
            self.images, self.labels = parts[0][1], parts[0][2].astype(np.int64)
        else:
            idx = np.arange(sum(len(p[2]) for p in parts))
            self.images = np.concatenate([p[1] for p in parts])
            self.labels = np.concatenate([p[2] for p in parts]).astype(np.int64)
        self.indices = idx  # (N,) positions in the source files (training file, then test file for "all")
        # images (N, 28, 28) uint8, labels (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = _to_pil(self.images[i])
        return (self.transform(image) if self.transform else image), int(self.labels[i])


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - scikit-learn is in the data extra
        raise ImportError("the digits dataset needs scikit-learn: pip install 'diffattn[data]'") from e
    data = load_digits()
    images = np.rint(data.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    images.flags.writeable = False
    labels = data.target.astype(np.int64)
    labels.flags.writeable = False
    return images, labels


class Digits(Dataset):
    """scikit-learn's handwritten digits (UCI "Optical Recognition of Handwritten Digits"): 1,797 real 8×8 scans,
    grey levels 0–16 (scaled to 0–255 here), 10 classes, bundled with scikit-learn (BSD-3).

    Splits: stratified and fixed (:func:`diffattn.data.stratified_split` with seed 0): 20 % ``test``, then 12.5 %
    of the rest ``val``, the remaining 70 % ``train``; ``all`` keeps scikit-learn's order.
    """

    splits = ("train", "val", "test", "all")
    classes = tuple(str(d) for d in range(10))
    #: the class names a zero-shot prompt says (as the captions of ``diffattn train``'s digit pairs name them)
    prompt_names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

    def __init__(self, split: str = "train", root: str | os.PathLike | None = None,
                 transform: Callable | None = None) -> None:
        self.split = check_split(split, self.splits)
        self.transform = transform
        images, labels = _digits_arrays()
        idx = np.arange(len(labels))
        if split != "all":
            rest, test = stratified_split(idx.tolist(), labels.tolist(), test_fraction=0.2, seed=0)
            train, val = stratified_split(rest, labels[rest].tolist(), test_fraction=0.125, seed=0)
            idx = np.sort(np.asarray({"train": train, "val": val, "test": test}[split]))
        self.indices = idx  # (N,) positions in scikit-learn's order
        self.images, self.labels = images[idx], labels[idx]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = _to_pil(self.images[i])
        return (self.transform(image) if self.transform else image), int(self.labels[i])


class CaptionImages(Dataset):
    """An image–caption set prepared by ``diffattn data prepare``: ``<root>/<name>/index.jsonl`` (one line per image:
    ``key``, ``image``, ``mask``, ``caption``, ``category``) and the PNGs it names.

    Splits: by :func:`diffattn.data.hash_split` of each image's ``group`` (the normalised caption for Tux Paint,
    so images sharing a caption stay together; the emoji's base name for the emoji set, so skin-tone or style
    variants stay together): about 80 / 10 / 10 % train / val / test, stable when items are added.
    ``categories`` lists the category names; a sample's ``category`` is its index into that list.
    """

    splits = ("train", "val", "test", "all")

    def __init__(self, name: str, split: str = "train", root: str | os.PathLike | None = None,
                 transform: Callable | None = None) -> None:
        self.name = name
        self.split = check_split(split, self.splits)
        self.transform = transform
        self.folder = dataset_dir(root, name)
        with open(self.folder / "index.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        self.categories = tuple(sorted({r["category"] for r in rows}))
        self.rows = [r for r in rows if split == "all" or hash_split(r["group"]) == split]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def captions(self) -> list[str]:
        return [r["caption"] for r in self.rows]

    @property
    def keys(self) -> list[str]:
        return [r["key"] for r in self.rows]

    @property
    def labels(self) -> np.ndarray:
        """(N,) int64 category index of every sample."""
        index = {c: i for i, c in enumerate(self.categories)}
        return np.array([index[r["category"]] for r in self.rows], dtype=np.int64)

    def load_image(self, i: int):
        """The prepared RGB image (composited on white) as a PIL image."""
        from PIL import Image

        with Image.open(self.folder / self.rows[i]["image"]) as im:
            return im.convert("RGB")

    def load_mask(self, i: int) -> torch.Tensor:
        """(H, W) bool foreground mask: the source alpha channel ≥ 128."""
        from PIL import Image

        with Image.open(self.folder / self.rows[i]["mask"]) as im:
            return torch.from_numpy(np.asarray(im.convert("L")) >= 128)

    def __getitem__(self, i: int) -> dict:
        image = self.load_image(i)
        row = self.rows[i]
        return {"image": self.transform(image) if self.transform else image, "caption": row["caption"],
                "category": self.categories.index(row["category"]), "mask": self.load_mask(i), "key": row["key"]}
