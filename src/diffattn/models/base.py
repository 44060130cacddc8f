"""Save and load for every diffattn model, through huggingface_hub's ``PyTorchModelHubMixin``, strictly and atomically.

``model.save_pretrained(dir)`` writes ``model.safetensors`` and ``config.json`` (the constructor's arguments plus
``architecture``, the class name, ``model_name``, and the format: ``diffattn_format`` and ``diffattn_version``,
:mod:`diffattn.formats`) into a temporary directory beside ``dir`` and swaps it into
place with :func:`diffattn.io.atomic_write_dir`: a process killed at any point leaves either the previous checkpoint
or the new one, never a mix. ``diffattn.models.from_pretrained(dir_or_repo_id)`` reads the class from the config, so
no model name is needed; ``SomeModel.from_pretrained(dir)`` works too. Both load strictly:

- ``config.json`` must name a diffattn architecture and hold only its constructor's arguments; sizes are checked
  against :data:`diffattn.models.config.SIZE_BOUNDS` before anything is allocated;
- a config of a newer diffattn format than this code reads is a :class:`~diffattn.formats.FormatVersionError`; one
  of an older format (no ``diffattn_format``: diffattn 0.1.0) is migrated to the current meaning with a
  :class:`~diffattn.formats.FormatMigrationWarning` where a saved setting changed meaning, so the model computes
  what the saved one computed;
- ``model.safetensors`` must hold exactly the model's tensors with the model's shapes: missing, unexpected and
  mismatched keys are all named in one ``ValueError``, raised before any model is returned. Weights are read with
  safetensors only (no pickle).

A hub repo id works wherever a hub is reachable; a path that looks local (:func:`diffattn.io.looks_local`) is never
sent to the hub. A loaded model is in eval mode, as transformers returns it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn as nn
from huggingface_hub import PyTorchModelHubMixin

from .._version import __version__
from ..formats import (
    FORMAT,
    FORMAT_KEY,
    SERVE_MODEL_TYPE,
    VERSION_KEY,
    is_diffattn_config,
    migrate,
    read_format,
    wrong_kind,
)
from ..io import atomic_write_dir, from_hub, local_path, recover_dir
from ..layers.blocks import AttentionSpec

__all__ = ["DiffattnModel", "from_pretrained", "model_class", "load_state_dict_exact", "check_state_dict",
           "WEIGHTS_NAME",
           "CONFIG_NAME"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# written by save_pretrained beside the constructor's arguments
_META_KEYS = ("architecture", "model_name", FORMAT_KEY, VERSION_KEY, "model_type", "architectures")
_CLASSES: dict[str, type[DiffattnModel]] = {}
#: the attention layer classes a model card names
_ATTENTION_CLASSES = ("Attention", "DiffAttention", "GatedDiffAttention", "DiffAttentionV2", "GroupedDiffAttention")


def _names(keys, limit: int = 10) -> str:
    keys = sorted(keys)
    return f"{keys[:limit]}" + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def check_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], what: str) -> None:
    """ValueError naming every missing, unexpected and mis-shaped key unless ``state_dict`` holds exactly the tensors
    of ``model`` (which may live on the meta device). Tied parameters (one tensor under two names, e.g.
    ``lm_head.weight`` = ``tok_embed.weight``) need only one of their names."""
    expected = model.state_dict(keep_vars=True)  # the Parameter objects themselves: a tie is one object
    groups: dict[int, list[str]] = {}
    for k, t in expected.items():
        groups.setdefault(id(t), []).append(k)
    missing = [g[0] if len(g) == 1 else " | ".join(g) for g in groups.values() if not any(k in state_dict for k in g)]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
                  for k in state_dict if k in expected and tuple(state_dict[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        parts = [f"{label} {len(keys)} key(s): {_names(keys)}" for label, keys in
                 (("missing", missing), ("unexpected", unexpected), ("shape mismatch in", mismatched)) if keys]
        raise ValueError(f"{what} does not match {type(model).__name__}: " + "; ".join(parts))


def load_state_dict_exact(model: nn.Module, state_dict: dict[str, torch.Tensor], what: str) -> nn.Module:
    """Load ``state_dict`` into ``model`` after :func:`check_state_dict`; on any mismatch ``model`` is untouched."""
    check_state_dict(model, state_dict, what)
    model.load_state_dict(state_dict, strict=False)  # every model tensor is covered (ties through one name)
    return model


def _read_weights(path: str, what: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what}: {path} does not exist; was the model saved with save_pretrained?")
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types (e.g. HeaderTooSmall for an empty file)
        raise ValueError(f"{what}: {path} is not a readable safetensors file ({type(e).__name__}: {e})") from e


class DiffattnModel(nn.Module, PyTorchModelHubMixin, library_name="diffattn",
                    tags=["diffattn", "differential-attention"]):
    """Base class of saveable models. Subclasses take only JSON-serialisable constructor arguments."""

    model_name: str | None = None
    #: the vLLM architecture that serves this class (:mod:`diffattn.serve`), written with ``model_type`` "diffattn"
    #: into ``config.json`` by :meth:`save_pretrained`; None: not servable
    serve_architecture: str | None = None
    #: a family with towers: each tower's constructor argument (a dict of the tower's arguments) → the tower's class
    tower_classes: ClassVar[Mapping[str, type]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    # huggingface_hub records the constructor's arguments for config.json; an AttentionSpec (also inside a tower's
    # dict, as CLIP takes them) is recorded as its dict, which the constructors take back
    @classmethod
    def _is_jsonable(cls, value) -> bool:
        return super()._is_jsonable(_encode_specs(value))

    @classmethod
    def _encode_arg(cls, arg):
        return super()._encode_arg(_encode_specs(arg))

    @classmethod
    def upgrade_config(cls, config: dict) -> dict:
        """A saved configuration (``config.json``) with the loose attention keys of before (``attention: "diff",
        lambda_init: …``) made into one ``attention`` dict, as the model computed (:func:`upgrade_config`); the
        families with towers (:attr:`tower_classes`) do it for each tower's dict."""
        if cls.tower_classes:
            return {**config, **{t: upgrade_config(c, config[t]) for t, c in cls.tower_classes.items()
                                 if isinstance(config.get(t), dict)}}
        return upgrade_config(cls, config)

    def save_pretrained(self, save_directory: str | Path, *, config: dict | None = None, repo_id: str | None = None,
                        push_to_hub: bool = False, model_card_kwargs: dict | None = None, **push_to_hub_kwargs):
        """Write ``model.safetensors``, ``config.json`` and a model card to ``save_directory``, atomically: the
        directory is replaced as a whole (files that this save does not write are not kept). The config records
        the diffattn format and version (:mod:`diffattn.formats`)."""
        cfg = dict(self._hub_mixin_config or {}) if config is None else dict(config)
        cfg = self.upgrade_config(cfg)  # a model built with the loose attention keywords saves its spec's dict
        cfg["architecture"] = type(self).__name__
        if self.serve_architecture is not None:  # vLLM dispatches on these two (diffattn.serve)
            cfg["model_type"], cfg["architectures"] = SERVE_MODEL_TYPE, [self.serve_architecture]
        if self.model_name is not None:
            cfg["model_name"] = self.model_name
        cfg[FORMAT_KEY], cfg[VERSION_KEY] = FORMAT, __version__
        with atomic_write_dir(save_directory) as tmp:
            super().save_pretrained(tmp, config=cfg, model_card_kwargs=model_card_kwargs)
        if push_to_hub:
            return self.push_to_hub(repo_id=repo_id or Path(save_directory).name, config=cfg,
                                    model_card_kwargs=model_card_kwargs, **push_to_hub_kwargs)
        return None

    def generate_model_card(self, *args, training: str | None = None, **kwargs):
        """The ``README.md`` saved beside the weights: what the model is (its registered name, class, size and
        attention layers), how it was trained when ``training`` says so (``diffattn train`` does), and how to
        load it; no placeholder for a hub push that never happened."""
        from huggingface_hub import ModelCard

        name = self.model_name or type(self).__name__
        kinds = sorted({type(m).__name__ for m in self.modules() if type(m).__name__ in _ATTENTION_CLASSES})
        params = sum(p.numel() for p in self.parameters())
        lines = ["---", "library_name: diffattn", "tags:", "- diffattn", "- differential-attention", "---", "",
                 f"# {name}", "",
                 f"A diffattn `{type(self).__name__}` ({params:,} parameters; attention layers: "
                 f"{', '.join(f'`{k}`' for k in kinds) or 'none'}).", ""]
        if training:
            lines += [training, ""]
        lines += ["Load it (the saved `config.json` names the class, so no model name is needed):", "", "```python",
                  "import diffattn", "", 'model = diffattn.from_pretrained("path/to/this/folder")', "```", "",
                  "Differential attention: Ye et al. 2024, *Differential Transformer*; docs/design.md in the "
                  "diffattn source gives the equation of every variant.", ""]
        return ModelCard("\n".join(lines))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs):
        """Load a checkpoint of this class saved with :meth:`save_pretrained` (strict; module docstring)."""
        path = _saved_folder(pretrained_model_name_or_path, kwargs)
        _read_config(os.path.join(path, CONFIG_NAME), cls)
        return super().from_pretrained(path, **kwargs)  # a local folder by now: the hub keywords are not used

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision, cache_dir, force_download: bool, local_files_only: bool,
                         token, map_location: str = "cpu", strict: bool = True, **model_kwargs):
        """Build the model from its config (sizes bounded first; an older format migrated) and load
        ``model.safetensors`` strictly."""
        if not strict:
            raise ValueError("strict=False: diffattn loads checkpoints strictly; load the state dict yourself "
                             "with model.load_state_dict(..., strict=False) if a partial load is what you want")
        for k in _META_KEYS:
            model_kwargs.pop(k, None)
        hub = dict(revision=revision, cache_dir=cache_dir, force_download=force_download, token=token,
                   local_files_only=local_files_only)
        directory = _saved_folder(model_id, hub)
        cfg_file, weights = os.path.join(directory, CONFIG_NAME), os.path.join(directory, WEIGHTS_NAME)
        what = f"checkpoint {model_id}"
        source = _read_format(cfg_file)
        sd = _read_weights(weights, what)
        model_kwargs, sd = migrate("model", model_kwargs, sd, source=source, what=what)
        model_kwargs = cls.upgrade_config(model_kwargs)  # the loose attention keys of before → one attention dict
        with torch.device("meta"):  # shapes only: the real tensors come from the file
            probe = cls(**model_kwargs)
        check_state_dict(probe, sd, what)  # raises before any real model exists
        model = cls(**model_kwargs)
        load_state_dict_exact(model, sd, what)
        model.eval()  # as transformers' from_pretrained: a loaded model is for inference until trained
        return model.to(map_location) if map_location not in (None, "cpu") else model


def upgrade_config(cls: type, config: dict) -> dict:
    """``config`` (arguments of ``cls``) with the loose attention keys of before converted silently by
    ``cls.LOOSE`` (:meth:`~diffattn.layers.LooseAttention.upgrade`): a saved file loads as it always did."""
    import inspect

    loose = getattr(cls, "LOOSE", None)
    if loose is None:
        return config
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return loose.upgrade(config, defaults)


def _encode_specs(value):
    """``value`` with every :class:`~diffattn.layers.AttentionSpec` in it (at any depth of dicts, lists and tuples)
    replaced by its :meth:`~diffattn.layers.AttentionSpec.to_dict`."""
    if isinstance(value, AttentionSpec):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _encode_specs(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_encode_specs(v) for v in value)
    return value


def _no_config(path: str) -> Exception:
    """The error for a folder without config.json: a ValueError naming the right loader when the folder is another
    kind of save (a training run, an adapter, …), else a FileNotFoundError."""
    hint = wrong_kind(path, "a save_pretrained folder")
    return ValueError(hint) if hint else FileNotFoundError(f"{path} has no {CONFIG_NAME}; was it written by "
                                                           f"save_pretrained?")


def _load_json(cfg_file: str) -> dict:
    try:
        with open(cfg_file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict) or not is_diffattn_config(cfg):
        hint = wrong_kind(os.path.dirname(cfg_file), "a diffattn save_pretrained folder") if isinstance(cfg, dict) \
            else None
        if hint is not None:
            raise ValueError(hint)
        found = (f"'architecture' {cfg['architecture']!r}" if isinstance(cfg, dict) and "architecture" in cfg
                 else f"keys {sorted(cfg)[:8]}" if isinstance(cfg, dict) else type(cfg).__name__)
        raise ValueError(f"{cfg_file} must be a JSON object whose 'architecture' is the name of a diffattn model class "
                         f"(written by diffattn's save_pretrained), got {found}; diffattn.from_pretrained reads "
                         f"save_pretrained folders, a transformers checkpoint ('architectures') loads with "
                         f"transformers (DiffLlama: diffattn.convert.from_diffllama)")
    return cfg


def _read_format(cfg_file: str) -> int:
    """The diffattn format of ``cfg_file`` (0 without an entry); a newer one than this code reads is an error."""
    return read_format(_load_json(cfg_file), cfg_file)


def _read_config(cfg_file: str, cls: type[DiffattnModel] | None = None) -> dict:
    """The JSON object of ``cfg_file``, checked: a format this code reads (before anything else: a newer format
    may hold what this code does not know), an ``architecture`` entry (that of ``cls`` when given) and no entry
    that is not an argument of that class."""
    cfg = _load_json(cfg_file)
    read_format(cfg, cfg_file)
    arch = model_class(cfg["architecture"])
    if cls is not None and arch is not cls:
        raise ValueError(f"{cfg_file} holds a {cfg['architecture']} checkpoint, not a {cls.__name__}; load it with "
                         f"diffattn.models.from_pretrained")
    loose = getattr(arch, "LOOSE", None)  # the loose attention keys of files written before AttentionSpec
    allowed = set(arch._hub_mixin_init_parameters) - {"loose"} | set(_META_KEYS) | set(loose.keywords if loose else ())
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"{cfg_file} has entries that are not arguments of {arch.__name__}: {unknown}; it takes "
                         f"{sorted(set(arch._hub_mixin_init_parameters) - {'loose'})}")
    return cfg


def model_class(name: str) -> type[DiffattnModel]:
    """The :class:`DiffattnModel` subclass named ``name`` (a config's ``architecture``). Every family's class is
    defined by then: importing :mod:`diffattn.models` (which Python does before this module) imports them all."""
    if name not in _CLASSES:
        raise ValueError(f"architecture in config.json must be one of {sorted(_CLASSES)}, got {name!r}")
    return _CLASSES[name]


#: the keywords of ``from_pretrained`` that say where and how a Hub id is fetched
_HUB_KWARGS = ("revision", "cache_dir", "force_download", "token", "local_files_only")
#: what a missing local save needs, in the one-line error (:func:`diffattn.io.missing_path`)
_NEEDS = "give a folder written by save_pretrained, a run folder (diffattn train --out) or a Hub id 'org/name'"


def _saved_folder(path_or_repo_id: str | os.PathLike, hub: dict) -> str:
    """The local folder of a save: ``path_or_repo_id`` itself when it looks local (:func:`diffattn.io.looks_local`;
    a missing one is one line with the closest names beside it, never a Hub request), else the Hub id's
    ``config.json`` and ``model.safetensors`` from the hub or its cache (:func:`diffattn.io.from_hub`: offline, one
    line at once). A folder without ``config.json`` is an error naming what it holds (:func:`_no_config`)."""
    path = os.fspath(path_or_repo_id)
    if os.path.exists(path) or os.path.exists(path.rstrip("/") + ".old"):
        recover_dir(path)  # finish a swap that a killed save left half done
    local = local_path(path_or_repo_id, "path", _NEEDS)
    if local is None:
        from huggingface_hub import snapshot_download

        hub = {k: v for k, v in hub.items() if k in _HUB_KWARGS and v is not None}
        local = from_hub(snapshot_download, path, "path", allow_patterns=[CONFIG_NAME, WEIGHTS_NAME], **hub)
    if not local.is_dir():
        raise FileNotFoundError(f"path {path!r} is a file, not a folder; pass a folder written by save_pretrained "
                                f"(config.json + model.safetensors), or a Hub id 'org/name'")
    if not (local / CONFIG_NAME).is_file():
        raise _no_config(path)
    return str(local)


def from_pretrained(path_or_repo_id: str | Path, **kwargs) -> DiffattnModel:
    """Load a model saved with ``save_pretrained`` from a folder or a hub repo id; the config names the class. The
    model is in eval mode, as transformers returns it.

    Strict (module docstring): a config with unknown entries, a weights file with missing, unexpected or
    mis-shaped tensors, or sizes beyond the bounds raise ValueError and no model is returned.
    """
    path = _saved_folder(path_or_repo_id, kwargs)
    cfg = _read_config(os.path.join(path, CONFIG_NAME))
    cls = model_class(cfg["architecture"])
    model = cls.from_pretrained(path, **kwargs)
    model.model_name = cfg.get("model_name")
    return model
