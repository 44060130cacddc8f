"""Reading checkpoint files without executing code: safetensors, ``torch.load(weights_only=True)``, TorchScript.

:func:`read_checkpoint` gives the tensors of

- a ``.safetensors`` file;
- a ``.pt``/``.pth``/``.bin`` pickle, read with ``torch.load(weights_only=True)`` (plus ``argparse.Namespace``, which
  SLIP-style checkpoints store under ``args``): PyTorch's restricted unpickler, which rebuilds tensors and
  containers only;
- a TorchScript archive (``torch.jit.save``; OpenAI's released CLIP ``.pt`` files are these), read by
  :func:`read_torchscript`: the archive's ``data.pkl`` is unpickled by a restricted unpickler that rebuilds tensors,
  ``OrderedDict``s and inert attribute holders for the scripted classes, so no code in the archive runs (its
  TorchScript ``code/`` is never read, let alone compiled).
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import pickle
import zipfile
from collections.abc import Mapping

import torch
import torch.nn as nn

from ..io import load_torch_file

__all__ = ["read_checkpoint", "read_torchscript", "state_dict_of"]

# the legacy typed storages TorchScript archives name, and the dtypes they hold
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors (name → tensor) of a checkpoint file; nothing in the file is executed (module docstring).

    A SLIP-style dict (``{"state_dict": ..., "args": Namespace, "epoch": ...}``) gives its ``state_dict``; a
    ``{"model": ...}`` dict its ``model``; a DataParallel ``module.`` prefix is removed.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"path must be an existing checkpoint file, got {path!r}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            obj = load_file(path)
        except Exception as e:  # safetensors raises its own error types for truncated or empty files
            raise ValueError(f"checkpoint {path!r} is not a readable safetensors file: {e}") from e
    elif _is_torchscript(path):
        obj = read_torchscript(path)
    else:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = load_torch_file(path)
    return state_dict_of(obj, f"checkpoint {path!r}")


def state_dict_of(obj, what: str) -> dict[str, torch.Tensor]:
    """The state dict held by ``obj``: a module, a mapping of tensors, or a dict with ``state_dict``/``model``."""
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{what} must hold a state dict (name → tensor), got {type(obj).__name__}")
    if not obj:
        raise ValueError(f"{what} holds an empty state dict (no tensors)")
    sd = dict(obj)
    if all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def source_state_dict(src, what: str) -> dict[str, torch.Tensor]:
    """A path is read with :func:`read_checkpoint`; a module, dict or state dict goes through :func:`state_dict_of`."""
    if isinstance(src, (str, os.PathLike)):
        return read_checkpoint(src)
    return state_dict_of(src, what)


# ------------------------------------------------------------------------------------------- TorchScript


def _is_torchscript(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return any(n.endswith("/constants.pkl") for n in names) and any(n.endswith("/data.pkl") for n in names)


class ScriptObject:
    """An inert stand-in for a scripted class (``__torch__.…``) in a TorchScript pickle: it only stores the
    attributes the pickle gives it, so that the module tree can be walked for tensors."""

    qualname = "?"

    def __setstate__(self, state) -> None:
        self.__dict__["_state"] = state


def _rebuild_tensor(storage: torch.Tensor, offset: int, size, stride, requires_grad=False, hooks=None,
                    metadata=None) -> torch.Tensor:
    if not size:
        return storage[offset].clone()
    return torch.as_strided(storage, tuple(size), tuple(stride), offset).clone()


_JIT_LIST_BUILDERS = ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist",
                      "build_genericlist")


def _restore_type_tag(value, type_str=None):
    return value


def _rebuild_parameter(data: torch.Tensor, requires_grad=False, hooks=None) -> torch.Tensor:
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only tensor rebuilders, storage types and ``OrderedDict``; scripted classes become
    :class:`ScriptObject` subclasses; every other global is refused (pickle.UnpicklingError)."""

    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self._zf, self._prefix, self._classes = zf, prefix, {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if module == "torch.jit._pickle" and name in _JIT_LIST_BUILDERS:  # TorchScript's typed list tags
            return list
        if module == "torch.jit._pickle" and name == "restore_type_tag":
            return _restore_type_tag
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module.startswith("__torch__"):
            key = f"{module}.{name}"
            if key not in self._classes:
                self._classes[key] = type(name, (ScriptObject,), {"qualname": key})
            return self._classes[key]
        raise pickle.UnpicklingError(f"TorchScript archive refers to {module}.{name}, which is not a tensor or "
                                     "container; diffattn reads tensors only and does not execute archive code")

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r} in TorchScript archive")
        _, dtype, key, _location, numel = pid[:5]
        if not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"unexpected storage type {dtype!r} in TorchScript archive")
        raw = self._zf.read(f"{self._prefix}data/{key}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) < numel * itemsize:
            raise pickle.UnpicklingError(f"TorchScript archive storage {key!r} holds {len(raw)} bytes, needs "
                                         f"{numel * itemsize}")
        return torch.frombuffer(bytearray(raw[: numel * itemsize]), dtype=dtype) if numel else \
            torch.empty(0, dtype=dtype)


def read_torchscript(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a TorchScript archive as a state dict (attribute paths, e.g. ``visual.conv1.weight``),
    without executing anything in it (module docstring). Tensor attributes of scripted modules are collected
    recursively; ints, strings and methods are skipped."""
    path = os.fspath(path)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        data_pkl = next((n for n in names if n.endswith("/data.pkl") and n.count("/") == 1), None)
        if data_pkl is None:
            raise ValueError(f"{path!r} is not a TorchScript archive (no <name>/data.pkl)")
        prefix = data_pkl[: -len("data.pkl")]
        try:
            root = _RestrictedUnpickler(zf.read(data_pkl), zf, prefix).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"cannot read the tensors of TorchScript archive {path!r}: {e}") from e
    out: dict[str, torch.Tensor] = {}
    _collect(root, "", out, set())
    if not out:
        raise ValueError(f"TorchScript archive {path!r} holds no tensors")
    return out


def _collect(obj, prefix: str, out: dict, seen: set) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out[prefix.rstrip(".")] = obj
    elif isinstance(obj, ScriptObject):
        _collect(obj.__dict__.get("_state"), prefix, out, seen)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(k, str) and k != "training":
                _collect(v, f"{prefix}{k}.", out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _collect(v, f"{prefix}{i}.", out, seen)
