"""Save and load for every diffattn model, through huggingface_hub's ``PyTorchModelHubMixin``.

``model.save_pretrained(dir)`` writes ``model.safetensors`` and ``config.json`` (the constructor's arguments plus
``architecture``, the class name); ``diffattn.models.from_pretrained(dir_or_repo_id)`` reads the class from the
config, so no model name is needed. A hub repo id works wherever a hub is reachable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.nn as nn
from huggingface_hub import PyTorchModelHubMixin, hf_hub_download

__all__ = ["DiffattnModel", "from_pretrained", "model_class"]

_CLASSES: dict[str, type[DiffattnModel]] = {}


class DiffattnModel(nn.Module, PyTorchModelHubMixin, library_name="diffattn",
                    tags=["diffattn", "differential-attention"]):
    """Base class of saveable models. Subclasses take only JSON-serialisable constructor arguments."""

    model_name: str | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    def save_pretrained(self, save_directory: str | Path, *, config: dict | None = None, **kwargs):
        cfg = dict(self._hub_mixin_config or {}) if config is None else dict(config)
        cfg["architecture"] = type(self).__name__
        if self.model_name is not None:
            cfg["model_name"] = self.model_name
        return super().save_pretrained(save_directory, config=cfg, **kwargs)


def model_class(name: str) -> type[DiffattnModel]:
    from . import _load_all  # noqa: F401

    if name not in _CLASSES:
        raise ValueError(f"unknown architecture {name!r} in config.json; known: {sorted(_CLASSES)}")
    return _CLASSES[name]


def from_pretrained(path_or_repo_id: str | Path, **kwargs) -> DiffattnModel:
    """Load a model saved with ``save_pretrained`` from a folder or a hub repo id; the config names the class."""
    path = str(path_or_repo_id)
    if os.path.isdir(path):
        cfg_file = os.path.join(path, "config.json")
        if not os.path.exists(cfg_file):
            raise FileNotFoundError(f"{path} has no config.json; was it written by save_pretrained?")
    else:
        cfg_file = hf_hub_download(path, "config.json", **{k: v for k, v in kwargs.items()
                                                           if k in ("revision", "cache_dir", "token",
                                                                    "local_files_only")})
    with open(cfg_file, encoding="utf-8") as f:
        cfg = json.load(f)
    if "architecture" not in cfg:
        raise ValueError(f"{cfg_file} has no 'architecture' entry; it was not written by diffattn")
    model = model_class(cfg["architecture"]).from_pretrained(path, **kwargs)
    model.model_name = cfg.get("model_name")
    return model
