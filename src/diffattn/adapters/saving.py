"""Save and load the new weights of a retrofitted model: an adapter directory, written atomically, read strictly.

A directory written by :func:`save_adapter` holds exactly two files:

- ``diffattn_adapter.json``: the :class:`RetrofitConfig` (``method``, ``lambda_init``, ``anneal_steps``,
  ``layers``, ``train`` and ``trainable``, the latter absent in files of earlier versions), the converted modules'
  names (``layer_names``), the number of attention layers the model has (``num_attention_layers``),
  ``format_version`` (1, the layout of this file), ``diffattn_format`` (the meaning of what it holds,
  :mod:`diffattn.formats`; absent in files of diffattn 0.1.0, which are format 0), ``diffattn_version`` and
  ``base_model``;
- ``diffattn_adapter.safetensors``: every adapter tensor (new matrices, λ parameters, ``step`` buffers) and every
  parameter the ``train`` mode makes trainable (and any other that requires grad at save time), under the bare
  model's names (a peft-wrapped model writes the same file).

:func:`save_adapter` writes both into a temporary directory and swaps it into place
(:func:`diffattn.io.atomic_write_dir`): a reader, or a process killed at any point, sees the previous adapter or
the new one, never a mix. :func:`load_adapter` validates the JSON and every tensor (names, shapes, dtypes, finite
values) against the base model before converting it; any failure raises ValueError and leaves the model as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .._version import __version__
from ..formats import FORMAT_KEY, migrate, read_format, wrong_kind
from ..io import atomic_write_dir, recover_dir
from .config import RetrofitConfig
from .core import PLAN_ATTR, RetrofitPlan, _plan, apply_plan, plan_retrofit, retrofit_record
from .naming import canonical_name, key_map, module_map
from .schedule import adapters

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "FORMAT_VERSION", "save_adapter", "load_adapter", "read_adapter"]

CONFIG_FILE = "diffattn_adapter.json"
WEIGHTS_FILE = "diffattn_adapter.safetensors"
FORMAT_VERSION = 1
_META_KEYS = {"layer_names", "num_attention_layers", "format_version", FORMAT_KEY, "diffattn_version", "base_model"}
_CONFIG_KEYS = {"method", "lambda_init", "anneal_steps", "layers", "train"}


def _trainable_names(model: nn.Module, plan: RetrofitPlan) -> set[str]:
    """Names (as ``model.named_parameters()`` gives them) of the non-adapter parameters the train mode trains."""
    names = {id(p): n for n, p in model.named_parameters()}
    mods = [model] if plan.config.train == "all" else plan.trainable_modules()
    return {names[id(p)] for m in mods for p in m.parameters() if id(p) in names}


def _canonical_keys(model: nn.Module) -> dict[str, str]:
    """Tensor name in ``model`` → the bare model's name (identity without peft; peft's own weights left out)."""
    return {k: c for c, k in key_map(model).items()}


def _adapter_state(model: nn.Module, plan: RetrofitPlan) -> dict[str, torch.Tensor]:
    """The tensors an adapter file holds, under the bare model's names (the same file with or without peft)."""
    canon = _canonical_keys(model)
    keys = _trainable_names(model, plan) | {n for n, p in model.named_parameters() if p.requires_grad}
    out = {canon[k] for k in keys if k in canon}
    for name, a in adapters(model):  # canonical names
        out |= {f"{name}.{k}" for k in a.state_dict()}
    return {canon[k]: v.detach().contiguous().clone() for k, v in model.state_dict().items()
            if k in canon and canon[k] in out}


def _bare(model: nn.Module) -> nn.Module:
    """The model inside a peft wrapper (``PeftModel.base_model.model``), or ``model``."""
    root = module_map(model).get("", "")
    return model.get_submodule(root) if root else model


def save_adapter(model: nn.Module, directory: str | os.PathLike) -> None:
    """Write the new and trainable weights of a retrofitted ``model`` to ``directory`` (see the module docstring).

    A peft-wrapped model (LoRA on the retrofitted model, ``modules_to_save=["diff_adapter", ...]``) writes the same
    file as the bare model would: the bare model's tensor names, the trained copy of every ``modules_to_save``
    module, and none of peft's own weights (save those with peft's ``model.save_pretrained``).

    The directory is replaced as a whole and atomically; it must not exist, or hold only a previous adapter (any
    other file in it is an error, so that a save never deletes what is not an adapter).
    """
    from safetensors.torch import save_file

    plan = _plan(model)
    directory = Path(directory)
    recover_dir(directory)
    if directory.exists():
        if not directory.is_dir():
            raise ValueError(f"directory must be a directory, got the file {str(directory)!r}")
        other = sorted(p.name for p in directory.iterdir() if p.name not in (CONFIG_FILE, WEIGHTS_FILE))
        if other:
            raise ValueError(f"directory {str(directory)!r} holds files other than an adapter ({other[:5]}); "
                             f"save_adapter replaces the whole directory, so give it an empty or adapter-only one")
    meta = dict(retrofit_record(model, plan), format_version=FORMAT_VERSION, diffattn_version=__version__,
                base_model=type(_bare(model)).__name__)
    state = _adapter_state(model, plan)
    with atomic_write_dir(directory) as tmp:
        save_file(state, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))


# --------------------------------------------------------------------------------------------- loading


def _fail(path: Path, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


def read_adapter(directory: str | os.PathLike) -> tuple[RetrofitConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Read and check an adapter directory without a model: (config, metadata, tensors on the CPU).

    Raises ValueError naming the file and the problem: a missing file, malformed JSON, a missing or mistyped field,
    an unknown ``format_version``, a safetensors file that cannot be parsed; a
    :class:`~diffattn.formats.FormatVersionError` for a newer diffattn format. A file of an older format is
    migrated (:func:`diffattn.formats.migrate`): the metadata and tensors returned mean what they meant when saved.
    """
    directory = Path(directory)
    recover_dir(directory)
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ValueError(wrong_kind(directory, "an adapter folder written by save_adapter")
                         or f"directory must hold {CONFIG_FILE} written by save_adapter, got {str(directory)!r}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _fail(path, f"is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _fail(path, f"must hold a JSON object, got {type(meta).__name__}")
    source = read_format(meta, str(path))  # before the fields: a newer format may hold fields this code lacks
    if meta.get("format_version") != FORMAT_VERSION or isinstance(meta.get("format_version"), bool):
        raise _fail(path, f"has format_version {meta.get('format_version')!r}; this diffattn reads {FORMAT_VERSION}")
    missing = sorted((_CONFIG_KEYS | {"layer_names", "num_attention_layers"}) - set(meta))
    if missing:
        raise _fail(path, f"lacks the fields {missing}")
    unknown = sorted(set(meta) - _CONFIG_KEYS - {"trainable"} - _META_KEYS)
    if unknown:
        raise _fail(path, f"has unknown fields {unknown}")
    config = _config(meta, path)
    layers, names, n = config.layers, meta["layer_names"], meta["num_attention_layers"]
    if not isinstance(layers, list):
        raise _fail(path, f"layers must be a list of layer indices, got {layers!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise _fail(path, f"num_attention_layers must be a positive int, got {n!r}")
    if any(not 0 <= i < n for i in layers) or layers != sorted(layers):
        raise _fail(path, f"layers must be sorted indices in [0, {n}), got {layers!r}")
    if not isinstance(names, list) or len(names) != len(layers) or not all(isinstance(s, str) for s in names):
        raise _fail(path, f"layer_names must be {len(layers)} module names (one per layer), got {names!r}")
    wpath = directory / WEIGHTS_FILE
    if not wpath.is_file():
        raise _fail(directory, f"lacks {WEIGHTS_FILE}")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(wpath), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise _fail(wpath, f"is not a readable safetensors file ({e})") from None
    migrated, tensors = migrate("adapter", meta, tensors, source=source, what=str(directory))
    if migrated != meta:
        meta, config = migrated, _config(migrated, path)
    return config, meta, tensors


def _config(meta: dict[str, Any], path: Path) -> RetrofitConfig:
    try:
        return RetrofitConfig.from_dict({k: meta[k] for k in _CONFIG_KEYS | ({"trainable"} & set(meta))})
    except (TypeError, ValueError) as e:
        raise _fail(path, str(e)) from None


def _expected(model: nn.Module, plan: RetrofitPlan) -> tuple[dict[str, torch.Tensor], set[str]]:
    """(every tensor name the adapter must hold → a tensor of its shape and dtype, the required names), under the
    bare model's names."""
    want: dict[str, torch.Tensor] = {}
    for name, a in zip(_layer_names(model, plan), plan.adapters, strict=True):  # plan adapters: meta device
        for k, t in a.state_dict().items():
            want[f"{name}.diff_adapter.{k}"] = t
    canon = _canonical_keys(model)
    required = set(want) | {canon[k] for k in _trainable_names(model, plan) if k in canon}
    for k, t in model.state_dict().items():  # any other base tensor may be saved (it required grad at save time)
        if k in canon:
            want.setdefault(canon[k], t)
    return want, required


def _check_tensors(wpath: Path, tensors: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                   required: set[str]) -> None:
    missing = sorted(required - set(tensors))
    unexpected = sorted(set(tensors) - set(want))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:8]}{' …' if len(missing) > 8 else ''} ({len(missing)})")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected[:8]}{' …' if len(unexpected) > 8 else ''} "
                         f"({len(unexpected)}): the base model has no such parameters")
        raise _fail(wpath, "does not match the base model: " + "; ".join(parts))
    for k, t in tensors.items():
        ref = want[k]
        if tuple(t.shape) != tuple(ref.shape):
            raise _fail(wpath, f"tensor {k!r} has shape {tuple(t.shape)}, the model needs {tuple(ref.shape)}")
        if t.is_floating_point() != ref.is_floating_point() or (not t.is_floating_point() and t.dtype != ref.dtype):
            raise _fail(wpath, f"tensor {k!r} has dtype {t.dtype}, the model needs {ref.dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise _fail(wpath, f"tensor {k!r} holds NaN or infinite values")
        if k.endswith(".step") and int(t.min()) < 0:
            raise _fail(wpath, f"tensor {k!r} (the schedule step) is negative: {int(t.min())}")


def load_adapter(base_model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Retrofit ``base_model`` (same architecture and base weights as the saved one) as recorded in ``directory``
    and load the saved weights; returns the model, which then computes exactly what the saved model computed.

    ``base_model`` may be wrapped by peft (e.g. ``get_peft_model(base, LoraConfig(...))``): the adapter, saved under
    the bare model's names, goes into the wrapped modules, and peft's own weights keep their ``requires_grad``.

    Everything is checked before the model is touched: the JSON (fields, types, format version), the match between
    the recorded layers and the model's attention modules, and every tensor (no missing, no unexpected, shapes,
    dtypes, finite values). Any failure raises ValueError naming the problem and leaves ``base_model`` unchanged,
    so a corrected retry works. Floating tensors are cast to the model's dtype.
    """
    directory = Path(directory)
    config, meta, tensors = read_adapter(directory)
    if not isinstance(base_model, nn.Module):
        raise TypeError(f"base_model must be a torch.nn.Module, got {type(base_model).__name__}")
    if getattr(base_model, PLAN_ATTR, None) is not None or adapters(base_model):
        raise ValueError("base_model is already retrofitted; load the adapter into a fresh base model")
    try:
        dry = plan_retrofit(base_model, config, device="meta")
    except ValueError as e:
        raise _fail(directory / CONFIG_FILE, f"cannot be applied to this base model: {e}") from None
    names = _layer_names(base_model, dry)
    if len(dry.candidates) != meta["num_attention_layers"] or names != meta["layer_names"]:
        raise ValueError(f"base_model does not match the saved adapter: it was saved from a model with "
                         f"{meta['num_attention_layers']} attention layers converting {meta['layer_names']}, this "
                         f"model has {len(dry.candidates)} and would convert {names}")
    want, required = _expected(base_model, dry)
    _check_tensors(directory / WEIGHTS_FILE, tensors, want, required)
    apply_plan(base_model, plan_retrofit(base_model, config), warn=False)
    kmap = key_map(base_model)  # bare-model name → name in base_model (peft-wrapped or not)
    result = base_model.load_state_dict({kmap[k]: t for k, t in tensors.items()}, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # checked above
    return base_model


def _layer_names(model: nn.Module, plan: RetrofitPlan) -> list[str]:
    """The converted modules' names in the bare model (without peft's prefix)."""
    return [canonical_name(model, n) or n for n in plan.layer_names]
