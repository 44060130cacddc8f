"""The exporter that writes the built-in offline sets as webdataset shards (:mod:`diffattn.data.formats`), so the
offline demo reads its data through exactly the loader CC3M or LAION shards go through.

It reads a set through :func:`diffattn.data.catalog.get_dataset`, which itself dispatches to the user formats, so it
lives above both of them.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ..io import atomic_write_file
from .catalog import get_dataset
from .corpora import TextDocuments
from .images import CaptionImages

__all__ = ["export_webdataset"]


def _png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _samples(ds) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) for each item of a built-in set, in its order."""
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
