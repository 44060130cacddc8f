"""Pretrained tags: the public checkpoints that ``create_model(name, pretrained=TAG)`` knows, verified by SHA-256.

One literal table, :data:`PRETRAINED`, keyed by ``(model name, tag)``. Each entry says where the file lives (a
Hugging Face hub repo and file name, or a URL), which :mod:`diffattn.convert` loader reads it, and its SHA-256:

- given only where a public source states it (OpenAI publishes each CLIP file's SHA-256 as a path component of its
  download URL, and OpenAI's ``clip`` package checks it);
- otherwise ``None`` ("unknown"): the first time the file is used its hash is **recorded** in
  ``<cache>/diffattn_pretrained_sha256.json`` and every later use is checked against that record, so a file that
  changes under the same name is caught.

``create_model(name, pretrained=...)`` takes

- a tag (``"cc12m"``, ``"openai"``, ``"augreg2_in21k_ft_in1k"``): the file is taken from ``cache_dir`` (or
  ``$DIFFATTN_PRETRAINED``) when it is there, otherwise downloaded with ``huggingface_hub.hf_hub_download`` (or from
  the URL) when a network is reachable;
- a local path (``pretrained="/path/checkpoint_best.pt"`` or ``".../model.safetensors"``), for machines without
  network: the file must match the SHA-256 of one of the model's entries (known or recorded) — or, when the model
  has one entry whose hash is still unknown, it is recorded as that entry's.

A hash mismatch is a ``ValueError`` naming both hashes; nothing is built from a file that fails the check. Files
are read without executing code (:func:`diffattn.convert.read_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..io import atomic_write_file, from_hub, missing_path

__all__ = ["PretrainedTag", "PRETRAINED", "HASH_RECORD", "list_pretrained", "pretrained_tag", "pretrained_cache_dir",
           "file_sha256", "pretrained_file", "split_model_tag", "timm_default_cfgs"]

HASH_RECORD = "diffattn_pretrained_sha256.json"
_DIFFCLIP_HOME = ("the DiffCLIP release (Hammoud & Ghanem 2025) lives on the Hugging Face hub at "
                  "https://huggingface.co/collections/hammh0a/diffclip-67cd8d3b7c6e6ea1cc26cd93 (file "
                  "checkpoint_best.pt; code: https://github.com/hammoudhasan/DiffCLIP)")


@dataclass(frozen=True)
class PretrainedTag:
    """One public checkpoint: where it lives, how it is read and its SHA-256 (None: unknown, recorded on first use)."""

    model: str
    tag: str
    loader: str  # "diffclip" | "diffclip_image_tower" | "openai_clip" | "timm_vit": the diffattn.convert loader
    filename: str
    hf_hub: str | None = None
    url: str | None = None
    sha256: str | None = None
    hash_source: str = "unknown: recorded on first use"
    source: str = ""  # where the release lives, for error messages
    data_cfg: tuple[tuple[str, object], ...] = ()  # the preprocessing the weights expect (mean, std)

    @property
    def key(self) -> str:
        return f"{self.model}.{self.tag}"


_OPENAI_B16 = "5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f"
_OPENAI_MEAN, _OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
_HALF = (("mean", (0.5, 0.5, 0.5)), ("std", (0.5, 0.5, 0.5)))
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DiffCLIP's (SLIP's) normalisation

PRETRAINED: dict[tuple[str, str], PretrainedTag] = {(t.model, t.tag): t for t in (
    # DiffCLIP ViT-B/16 (Hammoud & Ghanem 2025, §4.1), the official release; the hub id and file name are those of
    # the release's own test_models.py (CC12M) and its hub collection (CC3M)
    PretrainedTag("diffclip_vit_b16", "cc12m", "diffclip", "checkpoint_best.pt",
                  hf_hub="hammh0a/DiffCLIP_ViTB16_CC12M", source=_DIFFCLIP_HOME),
    PretrainedTag("diffclip_vit_b16", "cc3m", "diffclip", "checkpoint_best.pt",
                  hf_hub="hammh0a/DiffCLIP_ViTB16_CC3M", source=_DIFFCLIP_HOME),
    # the DiffCLIP release's image tower as a DiffViT-B/16 whose head is the image projection (timm's convention for
    # CLIP image towers, like timm's vit_base_patch16_clip_224.openai): the public differential ViT weights
    PretrainedTag("diff_vit_base_patch16_224", "diffclip_cc12m", "diffclip_image_tower", "checkpoint_best.pt",
                  hf_hub="hammh0a/DiffCLIP_ViTB16_CC12M", source=_DIFFCLIP_HOME,
                  data_cfg=(("mean", _IMAGENET_MEAN), ("std", _IMAGENET_STD))),
    PretrainedTag("diff_vit_base_patch16_224", "diffclip_cc3m", "diffclip_image_tower", "checkpoint_best.pt",
                  hf_hub="hammh0a/DiffCLIP_ViTB16_CC3M", source=_DIFFCLIP_HOME,
                  data_cfg=(("mean", _IMAGENET_MEAN), ("std", _IMAGENET_STD))),
    # OpenAI CLIP ViT-B/16 (Radford et al. 2021): open_clip's "openai" tag; the SHA-256 is the URL's path component
    PretrainedTag("clip_vit_b16", "openai", "openai_clip", "ViT-B-16.pt",
                  url=f"https://openaipublic.azureedge.net/clip/models/{_OPENAI_B16}/ViT-B-16.pt", sha256=_OPENAI_B16,
                  hash_source="OpenAI's download URL (checked by OpenAI's clip package)",
                  source="OpenAI CLIP (https://github.com/openai/CLIP), open_clip's 'openai' tag",
                  data_cfg=(("mean", _OPENAI_MEAN), ("std", _OPENAI_STD))),
    # timm ViTs (Steiner et al. 2022, "How to train your ViT"): timm's hub files, standard attention, the start of a
    # retrofit or of DiffViT fine-tuning
    PretrainedTag("vit_base_patch16_224", "augreg2_in21k_ft_in1k", "timm_vit", "model.safetensors",
                  hf_hub="timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", source="timm (Apache-2.0)",
                  data_cfg=_HALF),
    PretrainedTag("vit_small_patch16_224", "augreg_in21k_ft_in1k", "timm_vit", "model.safetensors",
                  hf_hub="timm/vit_small_patch16_224.augreg_in21k_ft_in1k", source="timm (Apache-2.0)",
                  data_cfg=_HALF),
    PretrainedTag("vit_tiny_patch16_224", "augreg_in21k_ft_in1k", "timm_vit", "model.safetensors",
                  hf_hub="timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", source="timm (Apache-2.0)",
                  data_cfg=_HALF),
)}


def list_pretrained(name: str | None = None, as_str: bool = False) -> list[tuple[str, str]] | list[str]:
    """Sorted ``(model, tag)`` pairs of :data:`PRETRAINED` (those of model ``name`` when given), as open_clip's
    ``list_pretrained()``; ``as_str=True`` gives ``"model:tag"`` strings instead (open_clip's ``as_str``).

    ``create_model(model, pretrained=tag)`` (or ``create_model("model.tag")``) loads each one;
    ``diffattn.list_models(pretrained=True)`` lists the same checkpoints as ``"model.tag"`` (timm's form)."""
    if not isinstance(as_str, bool):
        raise TypeError(f"as_str must be a bool, got {type(as_str).__name__}")
    pairs = sorted(k for k in PRETRAINED if name is None or k[0] == name)
    return [f"{m}:{t}" for m, t in pairs] if as_str else pairs


def split_model_tag(name: str) -> tuple[str, str | None]:
    """``"model.tag"`` → ``("model", "tag")`` when ``(model, tag)`` is in :data:`PRETRAINED`, else ``(name, None)``
    (timm's naming of a pretrained checkpoint, what ``diffattn.list_models(pretrained=True)`` returns)."""
    base, sep, tag = str(name).partition(".")
    if sep and (base, tag) in PRETRAINED:
        return base, tag
    return name, None


def timm_default_cfgs(configs: dict[str, dict]) -> dict[str, object]:
    """timm's ``default_cfgs`` for diffattn's vision models registered with timm: for each ``name`` of ``configs``
    (the vision config table) with pretrained tags, one ``timm.models.DefaultCfg`` under ``name`` and under
    ``diffattn_<name>``, one ``PretrainedCfg`` per tag (hub id or URL, file, input size, mean/std). timm's
    ``register_model`` reads them, so ``timm.list_models(pattern, pretrained=True)`` and ``timm.list_pretrained()``
    report the tags, and ``timm.create_model("<name>.<tag>", pretrained=True)`` loads that checkpoint through
    :func:`diffattn.factory.load_pretrained`. Empty without timm."""
    try:
        from collections import deque

        from timm.models import DefaultCfg, PretrainedCfg
    except ImportError:  # timm is optional
        return {}
    out: dict[str, object] = {}
    for name, cfg in configs.items():
        entries = [PRETRAINED[k] for k in list_pretrained(name)]
        if not entries:
            continue
        size, chans = cfg.get("img_size", 224), cfg.get("in_chans", 3)
        cfgs = {}
        for e in entries:
            data = dict(e.data_cfg)
            cfgs[e.tag] = PretrainedCfg(
                url=e.url or "", hf_hub_id=e.hf_hub, hf_hub_filename=e.filename, input_size=(chans, size, size),
                interpolation="bicubic", crop_pct=0.9 if size >= 224 else 1.0,
                mean=tuple(data.get("mean", (0.485, 0.456, 0.406))), std=tuple(data.get("std", (0.229, 0.224, 0.225))),
                num_classes=cfg.get("num_classes", 1000), first_conv="patch_embed.proj", classifier="head",
                description=f"diffattn pretrained tag {e.key}: {e.source}")
        default = DefaultCfg(tags=deque(e.tag for e in entries), cfgs=cfgs)
        out[name] = out[f"diffattn_{name}"] = default
    return out


def pretrained_tag(name: str, tag: str) -> PretrainedTag:
    """The entry for ``(name, tag)``, or a ValueError listing the tags of ``name``."""
    if (name, tag) not in PRETRAINED:
        tags = [t for _, t in list_pretrained(name)]
        known = f"its tags are {tags}" if tags else "it has no pretrained tags"
        raise ValueError(f"pretrained={tag!r} is neither a tag of {name!r} ({known}) nor an existing file; "
                         f"diffattn.models.list_pretrained() lists every tag")
    return PRETRAINED[(name, tag)]


def pretrained_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$DIFFATTN_PRETRAINED``, else ``~/.cache/diffattn/pretrained``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("DIFFATTN_PRETRAINED")
    return Path(env) if env else Path.home() / ".cache" / "diffattn" / "pretrained"


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _records(cache: Path) -> dict[str, str]:
    path = cache / HASH_RECORD
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); delete it to record the hashes again") from e
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"{path} must map '<model>.<tag>' to a SHA-256 string; delete it to record them again")
    return data


def _record(cache: Path, entry: PretrainedTag, digest: str) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    data = _records(cache)
    data[entry.key] = digest
    with atomic_write_file(cache / HASH_RECORD, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)


def _expected(entry: PretrainedTag, cache: Path) -> tuple[str | None, str]:
    if entry.sha256 is not None:
        return entry.sha256, entry.hash_source
    recorded = _records(cache).get(entry.key)
    return recorded, f"recorded on first use in {cache / HASH_RECORD}"


def _verify(path: Path, entry: PretrainedTag, cache: Path) -> None:
    digest = file_sha256(path)
    want, origin = _expected(entry, cache)
    if want is None:
        _record(cache, entry, digest)
    elif digest != want:
        raise ValueError(f"pretrained file {path} has SHA-256 {digest}, but {entry.key} must have {want} ({origin}); "
                         f"the file is corrupt, truncated or a different checkpoint. Source: {entry.source}")


def _fetch(entry: PretrainedTag, cache: Path) -> Path:
    """The entry's file: ``cache/<filename>`` if present, else a download (hub or URL) into ``cache``."""
    local = cache / entry.filename
    if local.is_file():
        return local
    try:
        if entry.hf_hub is not None:
            from huggingface_hub import hf_hub_download

            return from_hub(lambda repo, **kw: hf_hub_download(repo, entry.filename, **kw), entry.hf_hub,
                            f"pretrained {entry.key}", cache_dir=cache / "hub")
        from torch.hub import download_url_to_file

        cache.mkdir(parents=True, exist_ok=True)
        download_url_to_file(entry.url, str(local), hash_prefix=entry.sha256, progress=False)
        return local
    except Exception as e:  # network, authentication, missing repo: all mean "get the file another way"
        where = f"https://huggingface.co/{entry.hf_hub} ({entry.filename})" if entry.hf_hub else entry.url
        raise FileNotFoundError(
            f"cannot get {entry.key} from {where} ({type(e).__name__}: {e}). Without a network, download the file "
            f"elsewhere and pass pretrained='/path/{entry.filename}' or put it in {cache} (cache_dir=). "
            f"Source: {entry.source}") from e


def _entry_for_file(name: str, path: Path, cache: Path) -> PretrainedTag:
    entries = [PRETRAINED[k] for k in list_pretrained(name)]
    if not entries:
        raise ValueError(f"pretrained={str(path)!r}: {name!r} has no pretrained tags, so diffattn does not know how to "
                         f"read that file; load a save_pretrained folder with diffattn.models.from_pretrained or use "
                         f"a diffattn.convert loader")
    digest = file_sha256(path)
    for e in entries:
        if _expected(e, cache)[0] == digest:
            return e
    open_entries = [e for e in entries if _expected(e, cache)[0] is None]
    if len(entries) == 1 and open_entries:
        return entries[0]
    known = ", ".join(f"{e.key}: {_expected(e, cache)[0] or 'unknown'}" for e in entries)
    files = sorted({e.filename for e in entries})
    raise ValueError(f"pretrained file {path} has SHA-256 {digest}, which matches no checkpoint of {name!r} ({known}); "
                     f"to record a file whose hash is unknown, put it in a folder under its release name {files} and "
                     f"pass pretrained='<tag>', cache_dir=<that folder>")


def pretrained_file(name: str, pretrained: str | os.PathLike,
                    cache_dir: str | os.PathLike | None = None) -> tuple[PretrainedTag, Path]:
    """The entry and the hash-verified file of tag or file ``pretrained`` of model ``name`` (module docstring):
    what :func:`diffattn.factory.load_pretrained` reads with the entry's :mod:`diffattn.convert` loader."""
    cache = pretrained_cache_dir(cache_dir)
    path = Path(pretrained).expanduser()
    text = os.fspath(pretrained)
    if isinstance(pretrained, os.PathLike) or path.is_file() or "/" in text or os.sep in text or \
            text.startswith((".", "~")):  # a file: never a download
        if not path.exists():
            raise missing_path(pretrained, "pretrained", f"it takes a checkpoint file or a tag of {name!r}: "
                               f"{[t for _, t in list_pretrained(name)]}")
        if not path.is_file():
            raise FileNotFoundError(f"pretrained={text!r} is a folder, not a checkpoint file; a folder written by "
                                    f"save_pretrained (or a run) loads with diffattn.from_pretrained(path)")
        entry = _entry_for_file(name, path, cache)
    else:
        entry = pretrained_tag(name, str(pretrained))
        path = _fetch(entry, cache)
    _verify(path, entry, cache)
    return entry, path
