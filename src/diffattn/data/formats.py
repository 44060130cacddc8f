"""The formats users bring, and the exporter that writes the offline sets in them.

* **webdataset** tar shards in open_clip's key layout (Ilharco et al. 2021, ``open_clip/training/data.py``): one
  sample per key, the image under ``jpg``/``png``/``jpeg``/``webp``, its caption under ``txt``; read with the
  ``webdataset`` library itself (:func:`webdataset_pairs`);
* **CSV** in open_clip's ``--csv-img-key filepath --csv-caption-key title --csv-separator "\\t"`` convention
  (:class:`CsvPairs`);
* **image folders** ``root/<class>/<image>`` as timm and torchvision read them (:func:`image_folder`);
* **token memmaps**: :class:`diffattn.data.TokenMemmap`.

:func:`export_webdataset` writes any built-in set as shards, so the offline demo reads its data through exactly the
loader CC3M or LAION shards go through.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from torch.utils.data import Dataset

from ..io import atomic_write_file

__all__ = ["IMAGE_KEYS", "webdataset_pairs", "CsvPairs", "image_folder", "export_webdataset"]

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


def _png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _samples(ds) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) for each item of a built-in set, in its order."""
    from .corpora import TextDocuments
    from .images import CaptionImages

    if hasattr(ds, "webdataset_samples"):  # question sets (diffattn.data.vqa) write their own fields
        yield from ds.webdataset_samples()
    elif isinstance(ds, CaptionImages):
        for i, row in enumerate(ds.rows):
            meta = {"key": row["key"], "category": ds.categories.index(row["category"]),
                    "category_name": row["category"]}
            yield f"{i:06d}", {"png": (ds.folder / row["image"]).read_bytes(), "txt": row["caption"].encode(),
                               "mask.png": (ds.folder / row["mask"]).read_bytes(),
                               "json": json.dumps(meta, ensure_ascii=False).encode()}
    elif isinstance(ds, TextDocuments):
        for i in range(len(ds)):
            doc = ds[i]
            meta = {k: v for k, v in doc.items() if k not in ("text", "path")}
            yield f"{i:06d}", {"txt": doc["text"].encode(), "json": json.dumps(meta, ensure_ascii=False).encode()}
    else:  # classification: images + labels arrays
        from PIL import Image

        for i in range(len(ds)):
            label = int(ds.labels[i])
            yield f"{i:06d}", {"png": _png_bytes(Image.fromarray(ds.images[i])), "cls": str(label).encode(),
                               "txt": ds.classes[label].encode()}


def _write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    with atomic_write_file(path) as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o444
                tar.addfile(info, io.BytesIO(data))


def export_webdataset(name: str, out: str | os.PathLike, *, split: str = "train", root: str | os.PathLike | None = None,
                      shard_size: int = 1000) -> dict:
    """Write a built-in set as webdataset shards ``<out>/<name>-<split>-NNNNNN.tar`` plus a manifest
    ``<out>/<name>-<split>.json`` (``urls`` brace pattern, ``n_samples``, ``n_shards``, keys per sample).

    Keys per sample: caption sets ``png`` (the image), ``txt`` (caption), ``mask.png`` (foreground mask), ``json``
    (key, category); classification sets ``png``, ``cls`` (label), ``txt`` (class name); text sets ``txt`` and
    ``json``. Images are the prepared PNG bytes, so a reader gets exactly the pixels :func:`get_dataset` gives.
    Each shard is written atomically; returns the manifest.
    """
    from .catalog import get_dataset

    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be a positive int, got {shard_size!r}")
    ds = get_dataset(name, split=split, root=root)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards, batch, n, fields = [], [], 0, []
    for key, sample in _samples(ds):
        fields = list(sample)
        batch.append((key, sample))
        n += 1
        if len(batch) == shard_size:
            shards.append(out / f"{name}-{split}-{len(shards):06d}.tar")
            _write_shard(shards[-1], batch)
            batch = []
    if batch or not shards:
        shards.append(out / f"{name}-{split}-{len(shards):06d}.tar")
        _write_shard(shards[-1], batch)
    last = len(shards) - 1
    pattern = f"{name}-{split}-{{000000..{last:06d}}}.tar" if last else shards[0].name
    manifest = {"dataset": name, "split": split, "n_samples": n, "n_shards": len(shards),
                "urls": str(out / pattern), "keys": fields, "shards": [s.name for s in shards]}
    with atomic_write_file(out / f"{name}-{split}.json", "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
