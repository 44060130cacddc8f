"""Retrofitted transformers models as ordinary Hugging Face checkpoints.

:func:`diffattn.retrofit` records the retrofit in ``model.config`` under the key ``diffattn_retrofit``, and the
adapter weights are submodules of the model, so ``model.save_pretrained(dir)`` (and every ``Trainer`` checkpoint)
writes a complete checkpoint: ``config.json`` with the record, the safetensors with base and adapter weights.

- :func:`from_pretrained_retrofit` rebuilds the model: the class named by ``config.architectures``, its pretrained
  weights, the retrofit of the record, then the adapter tensors, loaded strictly (every adapter tensor present, no
  other unexpected or missing tensor). No ``trust_remote_code``: the code is this library's.
- A plain ``BertForSequenceClassification.from_pretrained(dir)`` of such a checkpoint cannot run the retrofit: it
  drops the adapter weights (transformers lists them as unexpected keys in its load report). A filter on
  transformers' loading logger (:func:`install_load_warning`) turns that report into a
  :class:`RetrofitCheckpointWarning` that names the call to use, so the user is told loudly instead of getting a
  plain model silently. It is installed by the calls that retrofit or load a transformers model
  (:func:`diffattn.retrofit`, :func:`from_pretrained_retrofit`, the recipes and evaluations that load checkpoints);
  a process that only loads checkpoints with transformers calls it itself. Importing diffattn installs nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..formats import FORMAT_KEY, read_format, saved_kind, wrong_kind
from ..io import check_torch_file, from_hub, load_torch_file, local_path
from .binding import ADAPTER_ATTR
from .config import RetrofitConfig
from .core import HF_CONFIG_KEY, HF_FORMAT_VERSION, apply_plan, plan_retrofit
from .load_warning import RetrofitCheckpointWarning, _loading_retrofit, install_load_warning

__all__ = ["RetrofitCheckpointWarning", "from_pretrained_retrofit", "install_load_warning"]

_RECORD_FIELDS = {"method", "lambda_init", "anneal_steps", "layers", "train", "trainable", "layer_names",
                  "num_attention_layers", "format_version", FORMAT_KEY, "diffattn_version"}


# --------------------------------------------------------------------------------------------- loading


def _read_record(config: Any, path: str) -> dict[str, Any]:
    rec = getattr(config, HF_CONFIG_KEY, None)
    if rec is None:
        raise ValueError(f"{path}: config.json has no {HF_CONFIG_KEY!r} record, so it is not a retrofitted "
                         f"checkpoint; load it with transformers' from_pretrained, or retrofit it with "
                         f"diffattn.retrofit(model, method)")
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: config.json's {HF_CONFIG_KEY!r} must be a JSON object, got {type(rec).__name__}")
    # a newer diffattn format is refused first; older ones mean the same for retrofits (no adapter migration in
    # diffattn.formats: one that needs tensors would have to be applied to the loaded model here)
    read_format(rec, f"{path}: config.json's {HF_CONFIG_KEY!r} record")
    if rec.get("format_version") != HF_FORMAT_VERSION:
        raise ValueError(f"{path}: config.json's {HF_CONFIG_KEY!r} has format_version "
                         f"{rec.get('format_version')!r}; this diffattn reads {HF_FORMAT_VERSION}")
    unknown = sorted(set(rec) - _RECORD_FIELDS)
    missing = sorted({"method", "layers", "layer_names", "num_attention_layers"} - set(rec))
    if unknown or missing:
        raise ValueError(f"{path}: config.json's {HF_CONFIG_KEY!r} record has unknown fields {unknown} / lacks "
                         f"{missing}")
    return rec


def _model_class(config: Any, model_class: type | None, path: str) -> type:
    if model_class is not None:
        if not (isinstance(model_class, type) and hasattr(model_class, "from_pretrained")):
            raise TypeError(f"model_class must be a transformers model class (e.g. BertForSequenceClassification), "
                            f"got {model_class!r}")
        return model_class
    import transformers

    archs = getattr(config, "architectures", None) or []
    if not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"{path}: config.json's 'architectures' must be a list of class names (strings), got "
                         f"{archs!r}")
    for name in archs:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type):
            return cls
    raise ValueError(f"{path}: config.json names architectures {archs!r}, none of which is a transformers class; "
                     f"pass model_class= (e.g. model_class=transformers.BertModel)")


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / f for f in files]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return [directory / name]
    index = directory / "pytorch_model.bin.index.json"
    if index.is_file():
        return [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    raise ValueError(f"{directory}: holds no model.safetensors / pytorch_model.bin (sharded or not)")


def _check_weight_files(directory: Path) -> None:
    """A ValueError naming the weight file that is empty, truncated or not a weights file at all, before
    transformers reads it (its own errors do not say which file, or blame ``weights_only``)."""
    for f in _weight_files(directory):
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt", device="cpu") as fh:
                    fh.keys()
            except Exception as e:  # safetensors' own error types (HeaderTooSmall, …)
                raise ValueError(f"{f} is not a readable safetensors file ({type(e).__name__}: {e})") from None
        else:
            check_torch_file(f)


def _common_suffix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def saved_names(wanted: set[str], saved: set[str]) -> dict[str, str]:
    """Model key → checkpoint key for the adapter tensors ``wanted``. transformers may rename keys when it saves
    (its checkpoint conversion mappings: a PaliGemma's ``model.language_model.*`` is written as
    ``language_model.model.*``) and renames them back when it loads, but the adapter tensors are read here from the
    files. A key not saved under its own name is matched with the saved adapter key that shares its longest dotted
    suffix, when that suffix reaches past the adapter into the attention module's path (``layers.0.self_attn``),
    the best match is unique and no two keys take the same saved key; other keys stay unmatched."""
    out = {k: k for k in wanted if k in saved}
    pool = [s.split(".") for s in saved - set(out.values()) if f".{ADAPTER_ATTR}." in f".{s}"]
    taken: dict[str, str] = {}
    for k in sorted(wanted - saved):
        parts = k.split(".")
        if ADAPTER_ATTR not in parts or not pool:
            continue
        need = len(parts) - parts.index(ADAPTER_ATTR) + 2  # the adapter's names plus two levels of module path
        scores = sorted(((_common_suffix(parts, s), ".".join(s)) for s in pool), reverse=True)
        best, name = scores[0]
        if best >= need and (len(scores) == 1 or scores[1][0] < best) and name not in taken.values():
            taken[k] = name
    return {**out, **taken}


def _read_tensors(directory: Path, wanted: set[str]) -> dict[str, torch.Tensor]:
    """The tensors of ``wanted`` from the checkpoint's weight files (safetensors, or torch with weights_only), by
    model key (:func:`saved_names` undoes transformers' renaming on save)."""
    files = _weight_files(directory)
    keys: dict[Path, set[str]] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt", device="cpu") as fh:
                keys[f] = set(fh.keys())
    loaded: dict[Path, dict[str, torch.Tensor]] = {}
    for f in files:
        if f not in keys:
            loaded[f] = load_torch_file(f)
            keys[f] = set(loaded[f])
    names = saved_names(wanted, set().union(*keys.values()) if keys else set())
    by_saved = {v: k for k, v in names.items()}
    out: dict[str, torch.Tensor] = {}
    for f in files:
        mine = set(by_saved) & keys[f]
        if f in loaded:
            out.update({by_saved[k]: loaded[f][k] for k in mine})
        else:
            from safetensors import safe_open

            with safe_open(str(f), framework="pt", device="cpu") as fh:
                out.update({by_saved[k]: fh.get_tensor(k) for k in mine})
    return out


def _resolve(path: str | os.PathLike, kwargs: dict[str, Any]) -> Path:
    """A local checkpoint folder (a path that looks local is never sent to the hub: :func:`diffattn.io.local_path`),
    or a hub repo id downloaded (or found in the cache, at once when offline: :func:`diffattn.io.from_hub`)."""
    p = local_path(path, "path", "it takes a checkpoint folder (config.json + weights) or a hub repo id")
    if p is None:
        from huggingface_hub import snapshot_download

        p = from_hub(snapshot_download, str(path), "path", revision=kwargs.get("revision"),
                     cache_dir=kwargs.get("cache_dir"), allow_patterns=["*.json", "*.safetensors", "*.bin"])
    if not p.is_dir():
        raise FileNotFoundError(f"path must be a checkpoint folder (config.json + weights) or a hub repo id, got "
                                f"{str(path)!r}, which is not a folder")
    return p


def from_pretrained_retrofit(path: str | os.PathLike, *, model_class: type | None = None,
                             **kwargs: Any) -> nn.Module:
    """Load a checkpoint written by ``save_pretrained`` (or a ``Trainer``) of a retrofitted transformers model.

    Builds ``model_class`` (default: the first of ``config.architectures`` that transformers has) with its
    pretrained weights (``model_class.from_pretrained(path, **kwargs)``: ``dtype``, ``device_map``,
    ``attn_implementation`` … pass through), retrofits it with the config recorded under ``diffattn_retrofit`` and
    loads the adapter tensors (new matrices, λ parameters, schedule steps). Strict: the checkpoint must hold every
    adapter tensor and nothing else the model lacks, and the recorded layers must be the ones the retrofit
    converts; otherwise ValueError. The result computes what the saved model computed (same weights, same step).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder or a hub repo id (str or os.PathLike), got {type(path).__name__}")
    import transformers

    install_load_warning()
    directory = _resolve(path, kwargs)
    kind = saved_kind(directory)
    if kind is not None and "from_pretrained_retrofit" not in kind[1]:  # a diffattn save, a run, an adapter, …
        raise ValueError(wrong_kind(directory, "a transformers checkpoint of a retrofitted model"))
    config = transformers.AutoConfig.from_pretrained(str(directory))
    rec = _read_record(config, str(directory))
    try:
        rconf = RetrofitConfig.from_dict({k: rec[k] for k in ("method", "lambda_init", "anneal_steps", "layers",
                                                               "train", "trainable") if k in rec})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{directory}: config.json's {HF_CONFIG_KEY!r} record is invalid: {e}") from None
    cls = _model_class(config, model_class, str(directory))
    _check_weight_files(directory)
    token = _loading_retrofit.set(True)
    try:
        model, info = cls.from_pretrained(str(directory), output_loading_info=True, **kwargs)
    finally:
        _loading_retrofit.reset(token)
    try:
        plan = plan_retrofit(model, rconf)
    except ValueError as e:
        raise ValueError(f"{directory}: the recorded retrofit does not apply to {cls.__name__}: {e}") from None
    if len(plan.candidates) != rec["num_attention_layers"] or plan.layer_names != rec["layer_names"]:
        raise ValueError(f"{directory}: the checkpoint was saved from a model with {rec['num_attention_layers']} "
                         f"attention layers converting {rec['layer_names']}; {cls.__name__} has "
                         f"{len(plan.candidates)} and would convert {plan.layer_names} (pass model_class=?)")
    apply_plan(model, plan, warn=False)
    adapter_keys = {k for k in model.state_dict() if f".{ADAPTER_ATTR}." in f".{k}"}
    unexpected = set(info.get("unexpected_keys") or ()) - adapter_keys
    missing = sorted(set(info.get("missing_keys") or ()))
    if unexpected or missing:
        raise ValueError(f"{directory}: the checkpoint does not match {cls.__name__} (missing {missing[:8]}, "
                         f"unexpected {sorted(unexpected)[:8]}); pass model_class= with the class it was saved from")
    tensors = _read_tensors(directory, adapter_keys)
    absent = sorted(adapter_keys - set(tensors))
    if absent:
        raise ValueError(f"{directory}: the checkpoint lacks {len(absent)} adapter tensors of the recorded retrofit, "
                         f"e.g. {absent[:4]}: it was not saved from the retrofitted model")
    ref = model.state_dict()
    for k, t in tensors.items():
        if tuple(t.shape) != tuple(ref[k].shape):
            raise ValueError(f"{directory}: adapter tensor {k!r} has shape {tuple(t.shape)}, the model needs "
                             f"{tuple(ref[k].shape)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{directory}: adapter tensor {k!r} holds NaN or infinite values")
    result = model.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    return model
