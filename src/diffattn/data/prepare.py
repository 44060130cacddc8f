"""Prepare the installed raw data into ``data/`` (run by ``scripts/fetch_data.sh``; never commit the output).

    python -m diffattn.data.prepare fashion_mnist tuxpaint_captions emoji --root data

* ``fashion_mnist``: the Debian ``dataset-fashion-mnist`` IDX files, decompressed so they can be memory-mapped.
* ``tuxpaint_captions``: every Tux Paint stamp (Debian ``tuxpaint-stamps-default``, GPL-2) that has an English
  description: the PNG (or the SVG through ``rsvg-convert``) fitted into a square canvas, composited on white, its
  alpha channel kept as the foreground mask; caption = the description's first line, category = top-level folder.
* ``emoji``: the single-code-point, fully-qualified emoji of ``emoji-test.txt`` (Debian ``unicode-data``) rendered
  with Noto Color Emoji (Debian ``fonts-noto-color-emoji``, OFL-1.1); caption = the CLDR short name, category =
  the emoji group.

Each output folder is written atomically (:func:`diffattn.io.atomic_write_dir`) and ends with a ``.prepared``
stamp, so a reader sees a complete set or none.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..io import atomic_write_dir

__all__ = ["prepare_fashion_mnist", "prepare_tuxpaint", "prepare_emoji", "PREPARERS"]

FASHION_MNIST_SRC = Path("/usr/share/datasets/fashion-mnist")
TUXPAINT_SRC = Path("/usr/share/tuxpaint/stamps")
EMOJI_FONT = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
EMOJI_TEST = Path("/usr/share/unicode/emoji/emoji-test.txt")
FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte")
TUXPAINT_SIZE = 224
EMOJI_SIZE = 128


def _need(path: Path, package: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} not found: install the Debian package {package} "
                                f"(as root: apt-get install {package}), then run `make data` again")


def _stamp(folder: Path, text: str) -> None:
    (folder / ".prepared").write_text(text + "\n")


def prepare_fashion_mnist(out: Path, src: Path = FASHION_MNIST_SRC) -> int:
    for name in FASHION_FILES:
        _need(src / f"{name}.gz", "dataset-fashion-mnist")
    with atomic_write_dir(out) as tmp:
        for name in FASHION_FILES:
            with gzip.open(src / f"{name}.gz", "rb") as fin, open(tmp / name, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        _stamp(tmp, f"fashion_mnist from {src}: 60000 train + 10000 test")
    return 70000


def _fit_on_canvas(rgba, size: int, margin: int):
    """(RGB on white, alpha) of ``rgba`` scaled to fit ``size - 2*margin`` and centred on a ``size``² canvas."""
    from PIL import Image

    box = rgba.getbbox() or (0, 0, *rgba.size)
    rgba = rgba.crop(box)
    scale = (size - 2 * margin) / max(rgba.size)
    w, h = max(1, round(rgba.width * scale)), max(1, round(rgba.height * scale))
    rgba = rgba.resize((w, h), Image.Resampling.LANCZOS)
    canvas = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    canvas.paste(rgba, ((size - w) // 2, (size - h) // 2))
    white = Image.new("RGBA", (size, size), (255, 255, 255, 255))
    return Image.alpha_composite(white, canvas).convert("RGB"), canvas.getchannel("A")


def _english_caption(txt: Path) -> str:
    first = txt.read_text(encoding="utf-8", errors="replace").splitlines()
    return " ".join(first[0].split()) if first else ""


def prepare_tuxpaint(out: Path, src: Path = TUXPAINT_SRC, size: int = TUXPAINT_SIZE) -> int:
    from PIL import Image

    _need(src, "tuxpaint-stamps-default")
    rsvg = shutil.which("rsvg-convert")
    rows, skipped = [], []
    with atomic_write_dir(out) as tmp, tempfile.TemporaryDirectory() as scratch:
        (tmp / "images").mkdir()
        (tmp / "masks").mkdir()
        for txt in sorted(src.rglob("*.txt")):
            caption = _english_caption(txt)
            png, svg = txt.with_suffix(".png"), txt.with_suffix(".svg")
            if not caption or not (png.exists() or svg.exists()):
                skipped.append(str(txt.relative_to(src)))
                continue
            if png.exists():
                source = png
            elif rsvg:
                source = Path(scratch) / "stamp.png"
                subprocess.run([rsvg, "-w", str(2 * size), "-h", str(2 * size), "-a", str(svg), "-o", str(source)],
                               check=True, capture_output=True)
            else:
                skipped.append(str(svg.relative_to(src)) + " (rsvg-convert missing: apt-get install librsvg2-bin)")
                continue
            with Image.open(source) as im:
                rgb, alpha = _fit_on_canvas(im.convert("RGBA"), size, margin=size // 32)
            key = str(txt.relative_to(src).with_suffix(""))
            stem = f"{len(rows):04d}"
            rgb.save(tmp / "images" / f"{stem}.png", optimize=False)
            alpha.save(tmp / "masks" / f"{stem}.png")
            rows.append({"key": key, "image": f"images/{stem}.png", "mask": f"masks/{stem}.png", "caption": caption,
                         "category": key.split("/")[0], "group": caption.lower().rstrip("."),
                         "source": str(source.relative_to(src)) if source.is_relative_to(src) else str(svg.name)})
        with open(tmp / "index.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (tmp / "SOURCE").write_text(
            f"Rendered from {src} (Debian tuxpaint-stamps-default, GPL-2 or later; see "
            "/usr/share/doc/tuxpaint-stamps-default/copyright). Do not redistribute without the licence.\n"
            + "".join(f"skipped: {s}\n" for s in skipped))
        _stamp(tmp, f"tuxpaint_captions: {len(rows)} images at {size}x{size}")
    return len(rows)


def _emoji_entries(path: Path) -> list[tuple[str, str, str]]:
    """(emoji, CLDR name, group) for each fully-qualified single-code-point emoji in ``emoji-test.txt``."""
    out, group = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# group:"):
            group = line.split(":", 1)[1].strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        codes, rest = line.split(";", 1)
        status, _, comment = rest.partition("#")
        if status.strip() != "fully-qualified":
            continue
        cps = codes.split()
        if len([c for c in cps if c != "FE0F"]) != 1:
            continue
        # comment: " 😀 E1.0 grinning face"
        name = comment.strip().split(" ", 2)[2]
        out.append(("".join(chr(int(c, 16)) for c in cps), name, group))
    return out


def prepare_emoji(out: Path, font: Path = EMOJI_FONT, table: Path = EMOJI_TEST, size: int = EMOJI_SIZE) -> int:
    from PIL import Image, ImageDraw, ImageFont

    _need(font, "fonts-noto-color-emoji")
    _need(table, "unicode-data")
    face = ImageFont.truetype(str(font), 109, layout_engine=ImageFont.Layout.BASIC)  # the font's one bitmap size
    rows, skipped = [], []
    with atomic_write_dir(out) as tmp:
        (tmp / "images").mkdir()
        (tmp / "masks").mkdir()
        for char, name, group in _emoji_entries(table):
            im = Image.new("RGBA", (160, 160), (0, 0, 0, 0))
            ImageDraw.Draw(im).text((8, 8), char, font=face, embedded_color=True)
            if im.getbbox() is None:
                skipped.append(name)
                continue
            rgb, alpha = _fit_on_canvas(im, size, margin=size // 16)
            stem = f"{len(rows):04d}"
            rgb.save(tmp / "images" / f"{stem}.png")
            alpha.save(tmp / "masks" / f"{stem}.png")
            code = "-".join(f"{ord(c):04X}" for c in char)
            rows.append({"key": code, "image": f"images/{stem}.png", "mask": f"masks/{stem}.png", "caption": name,
                         "category": group, "group": name.split(":")[0].strip(), "emoji": char})
        with open(tmp / "index.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (tmp / "SOURCE").write_text(f"Rendered from {font} (Noto Color Emoji, SIL OFL-1.1) with names and groups "
                                    f"from {table} (Unicode licence).\n" + "".join(f"skipped: {s}\n" for s in skipped))
        _stamp(tmp, f"emoji: {len(rows)} images at {size}x{size}")
    return len(rows)


PREPARERS = {"fashion_mnist": prepare_fashion_mnist, "tuxpaint_captions": prepare_tuxpaint, "emoji": prepare_emoji}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffattn.data.prepare", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="+", choices=sorted(PREPARERS))
    p.add_argument("--root", default=os.environ.get("DIFFATTN_DATA", "data"))
    p.add_argument("--force", action="store_true", help="prepare again even if a complete copy is there")
    args = p.parse_args(argv)
    status = 0
    for name in args.names:
        out = Path(args.root) / name
        if (out / ".prepared").is_file() and not args.force:
            print(f"{name}: already prepared in {out}")
            continue
        try:
            n = PREPARERS[name](out)
        except (FileNotFoundError, OSError, subprocess.CalledProcessError) as e:
            print(f"{name}: not prepared: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {n} items -> {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
