"""The formats users bring.

* **webdataset** tar shards in open_clip's key layout (Ilharco et al. 2021, ``open_clip/training/data.py``): one
  sample per key, the image under ``jpg``/``png``/``jpeg``/``webp``, its caption under ``txt``; read with the
  ``webdataset`` library itself (:func:`webdataset_pairs`);
* **CSV** in open_clip's ``--csv-img-key filepath --csv-caption-key title --csv-separator "\\t"`` convention
  (:class:`CsvPairs`);
* **image folders** ``root/<class>/<image>`` as timm and torchvision read them (:func:`image_folder`);
* **token memmaps**: :class:`diffattn.data.TokenMemmap`.

:func:`diffattn.data.export.export_webdataset` writes any built-in set as shards in the first of them.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path

from torch.utils.data import Dataset

__all__ = ["IMAGE_KEYS", "webdataset_pairs", "CsvPairs", "image_folder"]

#: open_clip's image extensions in a webdataset sample, in the order it tries them
IMAGE_KEYS = "jpg;png;jpeg;webp"


def _identity(x):
    return x


def webdataset_pairs(urls: str | list[str], transform: Callable | None = None, *, image_key: str = IMAGE_KEYS,
                     caption_key: str = "txt", shuffle: int = 0, seed: int = 0):
    """A ``webdataset.WebDataset`` pipeline yielding ``(image, caption)`` (a PIL image unless ``transform``).

    Args:
        urls: a shard path or URL, a brace pattern (``"shards/train-{000000..000009}.tar"``) or a list of them.
        image_key / caption_key: the sample keys, ``;``-separated alternatives (open_clip's defaults).
        shuffle: sample-shuffle buffer size (0 keeps shard order, deterministic); shards are shuffled with it too.
        seed: seed of both shuffles.
    Shards are split across DataLoader workers and, under ``torch.distributed``, across ranks.
    """
    import webdataset as wds

    if isinstance(urls, (str, os.PathLike)):
        urls = str(urls)
        if "{" not in urls and not Path(urls).exists() and "://" not in urls:
            raise FileNotFoundError(f"webdataset shard {urls!r} not found")
    elif not urls:
        raise ValueError("urls must name at least one shard, got an empty list")
    else:
        urls = [str(u) for u in urls]
    if not isinstance(shuffle, int) or shuffle < 0:
        raise ValueError(f"shuffle must be an int >= 0, got {shuffle!r}")
    ds = wds.WebDataset(urls, shardshuffle=shuffle > 0 and 100, nodesplitter=wds.split_by_node, seed=seed,
                        empty_check=False)
    if shuffle:
        ds = ds.shuffle(shuffle, rng=__import__("random").Random(seed))
    return ds.decode("pil").to_tuple(image_key, caption_key).map_tuple(transform or _identity, _identity)


class CsvPairs(Dataset):
    """``(image, caption)`` pairs listed in a CSV, open_clip's convention: ``img_key`` column (default
    ``filepath``) and ``caption_key`` column (default ``title``), tab-separated by default.

    Relative image paths are resolved against ``image_root`` (default: the CSV file's folder, so a CSV and its
    images move together; open_clip resolves them against the working directory).
    """

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None, *, img_key: str = "filepath",
                 caption_key: str = "title", sep: str = "\t", image_root: str | os.PathLike | None = None) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"CSV file {str(path)!r} not found")
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=sep)
            fields = reader.fieldnames or []
            for arg, key in (("img_key", img_key), ("caption_key", caption_key)):
                if key not in fields:
                    raise ValueError(f"{arg}={key!r} is not a column of {str(path)!r}; its columns are {fields} "
                                     f"(separator {sep!r})")
            rows = [(r[img_key], r[caption_key]) for r in reader]
        base = Path(image_root) if image_root is not None else path.parent
        self.paths = [Path(p) if Path(p).is_absolute() else base / p for p, _ in rows]
        self.captions = [c for _, c in rows]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            image = im.convert("RGB")
        return (self.transform(image) if self.transform else image), self.captions[i]


def image_folder(root: str | os.PathLike, transform: Callable | None = None, **kwargs):
    """``root/<class>/<image>`` as ``(image, class index)``: ``torchvision.datasets.ImageFolder`` (classes in sorted
    folder order, the layout timm's ``create_dataset`` and ``train.py`` read)."""
    from torchvision.datasets import ImageFolder

    if not Path(root).is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} not found")
    return ImageFolder(str(root), transform=transform, **kwargs)
