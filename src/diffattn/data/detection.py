"""An offline object-detection set: Tux Paint stamps composited on real photographs, in Ultralytics' YOLO layout.

Each image is a crop of a real photograph (the sample images shipped inside scikit-image, read from its package
folder, never fetched), optionally with Fashion-MNIST tiles pasted as clutter, on which 1–``max_objects`` stamps of
the target classes and up to ``max_distractors`` stamps of other Tux Paint categories are pasted through their alpha
masks at several scales. Stamps never overlap one another, so every box is exact: the tight bounding box of the
stamp's resized alpha mask (alpha ≥ 128), as placed. Distractors get no box.

Written by :func:`export_detection` (``diffattn data export tuxpaint_detect --out DIR``)::

    DIR/data.yaml                 path, train, val, names (what ``YOLO.train(data=...)`` reads)
    DIR/images/{train,val}/*.png
    DIR/labels/{train,val}/*.txt  one line per object: class x_center y_center width height (0–1)
    DIR/manifest.json             the generation settings and counts

Deterministic: image i of a split depends only on (``seed``, split, i). The Tux Paint stamps are GPL-2.0 (Debian
``tuxpaint-stamps-default``, prepared by ``diffattn data prepare``): the generated images are never committed or
redistributed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import atomic_write_dir
from ._common import SETUP_COMMAND, DatasetNotInstalledError, hash_split
from .images import CaptionImages, FashionMNIST

__all__ = ["DETECT_CLASSES", "Stamp", "Placement", "load_stamps", "load_backgrounds", "compose_image",
           "export_detection"]

#: the Tux Paint categories that are detection classes, in class-index order (clothes are left out: the
#: Fashion-MNIST clutter is clothing)
DETECT_CLASSES = ("animals", "food", "vehicles", "household")
#: scikit-image sample photographs used as backgrounds: none shows an animal, food, a vehicle or a household
#: object (the sample set's cat, horse, coffee cup, rocket and motorcycles are left out)
BACKGROUND_FILES = ("astronaut.png", "hubble_deep_field.jpg", "brick.png", "grass.png", "gravel.png", "camera.png",
                    "moon.png", "coins.png", "page.png", "text.png", "retina.jpg", "color.png")


@dataclass(frozen=True)
class Stamp:
    """A stamp cropped to its mask: ``rgb`` (h, w, 3) uint8, ``alpha`` (h, w) bool, its Tux Paint ``category``
    and ``key``."""

    rgb: np.ndarray
    alpha: np.ndarray
    category: str
    key: str


@dataclass(frozen=True)
class Placement:
    """A pasted stamp: class index (``-1`` for a distractor) and its box (x0, y0, x1, y1) in pixels, x1 and y1
    exclusive; ``mask`` is its (H, W) bool footprint in the image."""

    cls: int
    box: tuple[int, int, int, int]
    mask: np.ndarray


def load_stamps(root: str | os.PathLike | None = None, *, per_category: int | None = None) -> list[Stamp]:
    """The prepared Tux Paint stamps (``tuxpaint_captions``), cropped to the bounding box of their alpha masks, in
    the dataset's order; ``per_category`` keeps the first that many of each category (all by default)."""
    ds = CaptionImages("tuxpaint_captions", "all", root=root)
    out: list[Stamp] = []
    taken: dict[str, int] = {}
    for i, row in enumerate(ds.rows):
        if per_category is not None and taken.get(row["category"], 0) >= per_category:
            continue
        taken[row["category"]] = taken.get(row["category"], 0) + 1
        alpha = ds.load_mask(i).numpy()
        ys, xs = np.nonzero(alpha)
        if len(ys) == 0:
            continue
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        rgb = np.asarray(ds.load_image(i))[y0:y1, x0:x1]
        out.append(Stamp(np.ascontiguousarray(rgb), np.ascontiguousarray(alpha[y0:y1, x0:x1]), row["category"],
                         row["key"]))
    return out


def load_backgrounds(*, fashion_mnist_root: str | os.PathLike | None = None) -> tuple[list[np.ndarray],
                                                                                     np.ndarray | None]:
    """(photos, tiles): the scikit-image sample photos as RGB uint8 arrays, and Fashion-MNIST training images
    (N, 28, 28) uint8 for clutter (None when that set is not prepared).

    Raises DatasetNotInstalledError when neither is available."""
    from PIL import Image

    photos = []
    try:
        import skimage

        folder = Path(skimage.__file__).parent / "data"
        for name in BACKGROUND_FILES:
            if (folder / name).is_file():
                with Image.open(folder / name) as im:
                    photos.append(np.asarray(im.convert("RGB")))
    except ImportError:
        pass
    tiles = None
    try:
        tiles = FashionMNIST("train", root=fashion_mnist_root).images[:5000]
    except (FileNotFoundError, AttributeError):
        tiles = None
    if not photos and tiles is None:
        raise DatasetNotInstalledError("the detection set needs real backgrounds: install scikit-image (its sample "
                                       f"photos) or prepare Fashion-MNIST with `{SETUP_COMMAND} fashion_mnist`")
    return photos, tiles


def _background(rng: np.random.Generator, size: int, photos: list[np.ndarray],
                tiles: np.ndarray | None) -> np.ndarray:
    """A size × size RGB background: a random crop of a photo (or a mid-grey canvas without photos), with 0–4
    Fashion-MNIST tiles blended in as clutter."""
    from PIL import Image

    if photos:
        photo = photos[rng.integers(len(photos))]
        h, w = photo.shape[:2]
        side = int(rng.integers(max(16, min(h, w) // 3), min(h, w) + 1))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = Image.fromarray(photo[y:y + side, x:x + side]).resize((size, size), Image.BILINEAR)
        img = np.asarray(crop).astype(np.float32)
    else:
        img = np.full((size, size, 3), 128.0, dtype=np.float32)
    if tiles is not None:
        for _ in range(int(rng.integers(0, 5))):
            t = tiles[rng.integers(len(tiles))]
            s = int(rng.integers(size // 8, size // 3 + 1))
            tile = np.asarray(Image.fromarray(t).resize((s, s), Image.BILINEAR)).astype(np.float32)
            y, x = int(rng.integers(0, size - s + 1)), int(rng.integers(0, size - s + 1))
            a = (tile / 255.0)[..., None] * 0.7
            img[y:y + s, x:x + s] = img[y:y + s, x:x + s] * (1 - a) + tile[..., None] * a
    return img


def _resize_stamp(stamp: Stamp, long_side: int) -> tuple[np.ndarray, np.ndarray]:
    """Resize a stamp so its longer side is ``long_side``: colour and alpha together as RGBA (Pillow resamples RGBA
    with premultiplied alpha, so no background colour bleeds into the edges); the new mask is alpha ≥ 128."""
    from PIL import Image

    h, w = stamp.alpha.shape
    f = long_side / max(h, w)
    size = (max(1, round(w * f)), max(1, round(h * f)))
    rgba = np.concatenate([stamp.rgb, stamp.alpha[..., None].astype(np.uint8) * 255], axis=-1)
    out = np.asarray(Image.fromarray(rgba, "RGBA").resize(size, Image.BILINEAR))
    return out[..., :3], out[..., 3] >= 128


def compose_image(rng: np.random.Generator, background: np.ndarray, objects: list[tuple[Stamp, int]],
                  distractors: list[Stamp], *, scale: tuple[float, float] = (0.15, 0.5),
                  tries: int = 50) -> tuple[np.ndarray, list[Placement]]:
    """Paste ``objects`` (stamp, class index) and ``distractors`` onto ``background`` (S, S, 3) float or uint8.

    Each stamp is resized so its longer side is a uniform fraction in ``scale`` of S, placed at a uniform position
    where its box does not meet a box already placed (``tries`` attempts, then it is dropped), and pasted where its
    resized alpha mask is set (alpha ≥ 128; no blending, so the mask is exactly the footprint). Returns the uint8
    image and the placements (distractors with class -1), in pasting order.
    """
    img = np.array(background, dtype=np.float32)
    S = img.shape[0]
    if img.ndim != 3 or img.shape[1] != S or img.shape[2] != 3:
        raise ValueError(f"background must be a square RGB array (S, S, 3), got shape {img.shape}")
    lo, hi = scale
    if not 0 < lo <= hi <= 1:
        raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi <= 1, got {scale!r}")
    placed: list[Placement] = []
    for stamp, cls in [*objects, *((d, -1) for d in distractors)]:
        rgb, alpha = _resize_stamp(stamp, max(4, int(round(rng.uniform(lo, hi) * S))))
        ys, xs = np.nonzero(alpha)
        if len(ys) == 0:
            continue
        h, w = alpha.shape
        for _ in range(tries):
            y, x = int(rng.integers(0, S - h + 1)), int(rng.integers(0, S - w + 1))
            box = (x + int(xs.min()), y + int(ys.min()), x + int(xs.max()) + 1, y + int(ys.max()) + 1)
            if all(box[2] <= p.box[0] or p.box[2] <= box[0] or box[3] <= p.box[1] or p.box[3] <= box[1]
                   for p in placed):
                break
        else:
            continue
        mask = np.zeros((S, S), dtype=bool)
        mask[y:y + h, x:x + w] = alpha
        img[mask] = rgb[alpha]
        placed.append(Placement(cls, box, mask))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), placed


def _yolo_lines(placed: list[Placement], size: int) -> list[str]:
    lines = []
    for p in placed:
        if p.cls < 0:
            continue
        x0, y0, x1, y1 = p.box
        lines.append(f"{p.cls} {(x0 + x1) / 2 / size:.6f} {(y0 + y1) / 2 / size:.6f} {(x1 - x0) / size:.6f} "
                     f"{(y1 - y0) / size:.6f}")
    return lines


def export_detection(out: str | os.PathLike, *, root: str | os.PathLike | None = None, n_train: int = 400,
                     n_val: int = 100, imgsz: int = 160, seed: int = 0, classes: tuple[str, ...] = DETECT_CLASSES,
                     max_objects: int = 3, max_distractors: int = 2, scale: tuple[float, float] = (0.15, 0.5),
                     disjoint_stamps: bool = False, stamps_per_category: int | None = None) -> dict:
    """Write the detection set to ``out`` (module docstring for the layout; the folder is replaced atomically).

    Args:
        out: the dataset folder (``data.yaml`` inside names it by its absolute path).
        root: the prepared data folder holding ``tuxpaint_captions`` (default ``$DIFFATTN_DATA`` or ``./data``).
        n_train, n_val: images per split. imgsz: their side in pixels.
        seed: the generation seed. classes: Tux Paint categories that are classes (the others are distractors).
        max_objects: 1 to this many objects per image; max_distractors: 0 to this many distractor stamps.
        scale: the range of a stamp's longer side as a fraction of ``imgsz``.
        disjoint_stamps: val images use only stamps whose caption falls in the dataset's val/test hash split and
            train images only the train split (new object instances at validation); by default both splits draw
            from every stamp, and validation measures new compositions of known stamps.
        stamps_per_category: use only the first that many stamps of each category (small test sets).

    Returns the manifest (also written as ``manifest.json``).
    """
    for name, v, lo in (("n_train", n_train, 1), ("n_val", n_val, 1), ("imgsz", imgsz, 32), ("max_objects",
                        max_objects, 1), ("max_distractors", max_distractors, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    stamps = load_stamps(root, per_category=stamps_per_category)
    known = sorted({s.category for s in stamps})
    bad = [c for c in classes if c not in known]
    if not classes or bad:
        raise ValueError(f"classes must be Tux Paint categories {known}, got {list(classes)}")
    photos, tiles = load_backgrounds(fashion_mnist_root=root)
    groups = _groups(root) if disjoint_stamps else {}

    def pools(split: str):
        use = stamps if not disjoint_stamps else [
            s for s in stamps if (hash_split(groups[s.key]) == "train") == (split == "train")]
        by_class = [[s for s in use if s.category == c] for c in classes]
        empty = [c for c, p in zip(classes, by_class) if not p]
        if empty:
            raise ValueError(f"no stamp of class {empty} in the {split} split; use disjoint_stamps=False")
        return by_class, [s for s in use if s.category not in classes]

    out = Path(out).resolve()
    counts = {}
    with atomic_write_dir(out) as tmp:
        for split, n, split_id in (("train", n_train, 0), ("val", n_val, 1)):
            by_class, others = pools(split)
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "labels" / split).mkdir(parents=True)
            n_obj = 0
            for i in range(n):
                rng = np.random.default_rng([seed, split_id, i])
                bg = _background(rng, imgsz, photos, tiles)
                objs = []
                for _ in range(int(rng.integers(1, max_objects + 1))):
                    c = int(rng.integers(len(classes)))
                    objs.append((by_class[c][rng.integers(len(by_class[c]))], c))
                dis = [others[rng.integers(len(others))] for _ in range(int(rng.integers(0, max_distractors + 1)))]
                image, placed = compose_image(rng, bg, objs, dis if others else [], scale=scale)
                _save_png(image, tmp / "images" / split / f"{i:05d}.png")
                lines = _yolo_lines(placed, imgsz)
                n_obj += len(lines)
                (tmp / "labels" / split / f"{i:05d}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
            counts[split] = {"images": n, "objects": n_obj}
        names = {i: c for i, c in enumerate(classes)}
        (tmp / "data.yaml").write_text(_data_yaml(out, names))
        manifest = {"kind": "tuxpaint_detect", "classes": list(classes), "imgsz": imgsz, "seed": seed,
                    "max_objects": max_objects, "max_distractors": max_distractors, "scale": list(scale),
                    "disjoint_stamps": disjoint_stamps, "stamps_per_category": stamps_per_category,
                    "backgrounds": {"photos": len(photos), "fashion_mnist_tiles": tiles is not None},
                    "counts": counts, "license": "images contain GPL-2.0 Tux Paint stamps: do not redistribute"}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _groups(root) -> dict[str, str]:
    return {r["key"]: r["group"] for r in CaptionImages("tuxpaint_captions", "all", root=root).rows}


def _save_png(image: np.ndarray, path: Path) -> None:
    from PIL import Image

    Image.fromarray(image).save(path, format="PNG")


def _data_yaml(out: Path, names: dict[int, str]) -> str:
    lines = ["# Ultralytics dataset YAML written by diffattn (tuxpaint_detect); local files only, no download key",
             f"path: {json.dumps(str(out))}", "train: images/train", "val: images/val", "names:"]
    lines += [f"  {i}: {c}" for i, c in names.items()]
    return "\n".join(lines) + "\n"
