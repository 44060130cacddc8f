"""The model factory: ``create_model(name, pretrained=…)``, ``from_pretrained(dir)`` and diffattn's entry points in
timm's registry, as open_clip's ``factory.py`` sits above its model code and its pretrained loaders.

It is the one module above both :mod:`diffattn.models` (the families, their config tables and the registry that
builds them) and :mod:`diffattn.convert` (the readers of other checkpoint formats, which build models through the
registry). Loading a pretrained tag needs both: the tag's file is found and hash-checked by
:mod:`diffattn.models.pretrained`, read by a :mod:`diffattn.convert` loader into a model the registry builds. Neither
package imports this module; :mod:`diffattn.models` and :mod:`diffattn` re-export its names lazily (PEP 562).

``create_model(name, **overrides)``:

- ``"<name>.<tag>"`` (timm's naming, what ``list_models(pretrained=True)`` returns) is ``pretrained=tag``;
- ``pretrained=TAG`` (or a local file) loads a public checkpoint of :data:`diffattn.models.pretrained.PRETRAINED`,
  verified by SHA-256 (``cache_dir=`` says where files are looked for and downloaded to); ``pretrained=True`` is
  refused with the list of tags;
- ``features_only=True`` returns the family's feature extractor (vision transformers: timm's ``FeatureGetterNet``,
  :func:`diffattn.models.vit.feature_extractor`; ``out_indices``, ``output_fmt``, ``feature_cfg``);
- every other keyword is an override of the registered config (:mod:`diffattn.models.registry`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn

from .adapters.hf import from_pretrained_retrofit, install_load_warning
from .adapters.saving import load_adapter
from .convert import from_motif, load_diffclip, load_diffclip_image_tower, load_openai_clip, load_timm_vit
from .convert.diffllama import from_diffllama, to_diffllama
from .convert.motif import motif_kwargs, to_motif
from .errors import UsageError, one_line
from .formats import saved_kind, wrong_kind
from .io import atomic_write_dir, from_hub, local_path, looks_local, missing_path, recover_dir
from .models import causal_lm, clip, text, vit, vlm  # noqa: F401  (each family registers itself on import)
from .models.base import DiffattnModel
from .models.base import from_pretrained as _load_saved
from .models.motif import MotifLM
from .models.pretrained import list_pretrained, pretrained_file, split_model_tag, timm_default_cfgs
from .models.registry import TIMM_KWARGS, build_model, is_model, model_family

__all__ = ["create_model", "from_pretrained", "load_run", "load_pretrained", "register_timm", "TIMM_NAMES",
           "find_saved_model", "is_retrofit_run", "load_retrofit_run", "RETROFIT_RUN", "RELEASED_LAYOUTS",
           "resolve_source", "released_layout", "load_released", "save_released", "run_source"]

#: the file a retrofit training run writes to say how it is rebuilt (:func:`load_retrofit_run`)
RETROFIT_RUN = "retrofit.json"

#: the :mod:`diffattn.convert` loader of each :class:`~diffattn.models.pretrained.PretrainedTag` ``loader`` name
LOADERS = {"diffclip": load_diffclip, "diffclip_image_tower": load_diffclip_image_tower,
           "openai_clip": load_openai_clip, "timm_vit": load_timm_vit}


def create_model(name: str, **overrides) -> nn.Module:
    """Build the registered model ``name``; keyword ``overrides`` replace entries of its config.

    ``pretrained=TAG`` loads a public checkpoint (:func:`diffattn.models.list_pretrained`); ``"<name>.<tag>"`` as
    the name does the same (the names ``list_models(pretrained=True)`` returns).

    ``features_only=True`` (vision transformers) returns timm's feature extractor instead
    (:func:`diffattn.models.vit.feature_extractor`; ``out_indices``, ``output_fmt``, ``feature_cfg``)."""
    if not is_model(name):  # "model.tag" (timm's naming, list_models(pretrained=True)): pretrained=tag
        name, tag = split_model_tag(name)
        if tag is not None:
            if overrides.get("pretrained") not in (None, False, True, tag):
                raise ValueError(f"model name {name}.{tag} names tag {tag!r}, but "
                                 f"pretrained={overrides['pretrained']!r}")
            overrides["pretrained"] = tag
    features_only = overrides.pop("features_only", False)
    known = model_family(name).feature_kwargs if is_model(name) else ()
    features = {k: overrides.pop(k) for k in dict.fromkeys((*vit.FEATURE_KWARGS, *known)) if k in overrides}
    if features and not features_only:
        raise ValueError(f"{sorted(features)} need features_only=True")
    family = model_family(name)  # an unknown name fails here, with the similar names
    if features_only and family.features is None:
        raise ValueError(f"features_only=True needs a vision transformer, got {family.cls.__name__}")
    pretrained = overrides.pop("pretrained", False)
    cache_dir = overrides.pop("cache_dir", None)
    for k in TIMM_KWARGS:  # passed by timm.create_model; diffattn models have no timm pretrained configs
        overrides.pop(k, None)
    if pretrained is True:
        tags = [t for _, t in list_pretrained(name)]
        raise ValueError(f"pretrained=True: name the checkpoint, pretrained='<tag>' (tags of {name!r}: {tags}) or a "
                         "local file; diffattn.models.from_pretrained(dir) loads your own save_pretrained folders")
    if pretrained not in (False, None):
        if not isinstance(pretrained, (str, os.PathLike)):
            raise TypeError(f"pretrained must be a tag, a file path or False, got {type(pretrained).__name__}")
        family.apply_overrides(name, overrides)  # unknown overrides fail before any download
        model = load_pretrained(name, pretrained, overrides, cache_dir)
    else:
        model = build_model(family, name, overrides)
    model.model_name = name
    if features_only:
        model = family.features(model, **features)
        model.model_name = name
    return model


def load_pretrained(name: str, pretrained: str | os.PathLike, overrides: dict,
                    cache_dir: str | os.PathLike | None = None) -> nn.Module:
    """Model ``name`` with the weights of tag or file ``pretrained``, hash-verified
    (:func:`diffattn.models.pretrained.pretrained_file`) and read by the tag's :mod:`diffattn.convert` loader."""
    entry, path = pretrained_file(name, pretrained, cache_dir)
    model = LOADERS[entry.loader](str(path), name=name, **overrides)
    model.pretrained_tag = entry.key
    for m in model.modules():  # timm's data config of the (image tower) ViT: the preprocessing the weights expect
        if isinstance(m, vit.VisionTransformer):
            m.pretrained_overlay = {**dict(entry.data_cfg), "tag": entry.key, "hf_hub_id": entry.hf_hub,
                                    "url": entry.url}
    return model


#: what :func:`load_run` (and ``diffattn eval`` / ``inspect``) take, in the one-line error for a path that is not there
_RUN_NEEDS = ("give a run folder (diffattn train --out), a folder written by save_pretrained, or a released "
              "DiffLlama (transformers) or Motif folder")


def run_source(path: str | os.PathLike, what: str = "path") -> tuple[str, Path]:
    """(layout, folder) of anything :func:`load_run` takes, from its marker files alone (no weights read):

    - ``"retrofit"``: a retrofit run (``retrofit.json``), the run folder;
    - ``"retrofit_checkpoint"``: a transformers checkpoint saved from a retrofitted model;
    - ``"diffllama"``, ``"motif"``: a released checkpoint folder (what ``diffattn train``'s ``model.pretrained``
      takes), converted by :func:`load_released`;
    - ``"diffattn"``: the ``save_pretrained`` folder of a save or a run (:func:`find_saved_model`).

    A path that does not exist is one line naming it (``what``) and the closest names beside it
    (:func:`diffattn.io.missing_path`); a path of another kind (an adapter, a training checkpoint, a plain
    transformers model, a file) is a ValueError naming the loader it needs."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a run folder or a saved model folder (str or os.PathLike), got "
                        f"{type(path).__name__}")
    p = Path(path).expanduser()
    if not p.exists() and p.with_name(p.name + ".old").is_dir():
        recover_dir(p)  # finish a swap that a killed save left half done
    if not p.exists():
        raise missing_path(path, what, _RUN_NEEDS)
    if is_retrofit_run(p):
        return "retrofit", p
    kind = saved_kind(p)
    if kind is not None:
        if "from_pretrained_retrofit" in kind[1]:
            return "retrofit_checkpoint", p
        for layout in ("diffllama", "motif"):
            if RELEASED_LAYOUTS[layout][0] in kind[1]:
                return layout, p
        if not kind[1].startswith(("diffattn.load_run", "diffattn.from_pretrained(")):
            raise ValueError(wrong_kind(p, "a run or a saved model"))
    if p.is_file():
        raise ValueError(f"{what} {str(p)!r} is a file; it takes a folder: {_RUN_NEEDS.removeprefix('give ')}")
    return "diffattn", find_saved_model(p)


def from_pretrained(path_or_repo_id: str | Path, **kwargs) -> nn.Module:
    """Load a saved model, in eval mode (as transformers returns it): a ``save_pretrained`` folder, a training run
    folder (its final model, as ``diffattn eval RUN`` finds it: :func:`find_saved_model`), a released DiffLlama or
    Motif folder (converted: :func:`load_released`, ``backend=``), a retrofit run (:func:`load_retrofit_run`), or a
    Hub repo id of a diffattn save; the config names the class.

    A path that looks local (:func:`diffattn.io.looks_local`) is never sent to the Hub: a missing one is one line
    naming it and the closest names beside it. Strict (:mod:`diffattn.models.base`): a config with unknown entries,
    a weights file with missing, unexpected or mis-shaped tensors, or sizes beyond the bounds raise ValueError and
    no model is returned. A path of another kind (an adapter, a plain transformers checkpoint, …) is a ValueError
    naming the loader it needs.
    """
    if not looks_local(path_or_repo_id):  # a Hub id: diffattn saves only
        return _load_saved(path_or_repo_id, **kwargs)
    layout, folder = run_source(path_or_repo_id)
    if layout == "diffattn":
        return _load_saved(folder, **kwargs)
    extra = sorted(set(kwargs) - {"backend"}) if layout in ("diffllama", "motif") else sorted(kwargs)
    if extra:
        raise TypeError(f"from_pretrained of {str(folder)!r} ({layout}) takes no {extra}")
    return load_run(folder, **kwargs)


def load_run(path: str | os.PathLike, *, backend: str = "auto") -> nn.Module:
    """The model of any run folder or save, in eval mode: the one call that loads what ``diffattn eval``,
    ``diffattn inspect`` and ``diffattn train``'s ``model.pretrained`` take (:func:`run_source`).

    - a ``diffattn train`` run folder: its final model (``model/``; else ``final/``, ``best/``:
      :func:`find_saved_model`); a ``save_pretrained`` folder: that model;
    - a released DiffLlama (transformers) or Motif folder: converted to diffattn's model through the registered
      converter (:func:`load_released`; ``backend`` of the converted layers);
    - a retrofit run (``retrofit.json``): the retrofitted base model (:func:`load_retrofit_run`), a transformers
      model with the run's adapters (and LoRA);
    - a transformers checkpoint saved from a retrofitted model: :func:`diffattn.from_pretrained_retrofit`.

    Anything else (an adapter folder without its base, a plain transformers checkpoint, a checkpoint file, a
    training checkpoint) is a ValueError naming the loader it needs; a path that does not exist, one line naming it
    and the closest names beside it (FileNotFoundError)."""
    layout, folder = run_source(path)
    if layout == "retrofit":
        return load_retrofit_run(folder)
    if layout == "retrofit_checkpoint":
        return from_pretrained_retrofit(folder).eval()
    if layout in ("diffllama", "motif"):
        return load_released(folder, backend=backend)[0].eval()
    return _load_saved(folder).eval()


def _is_saved_model(p: Path) -> bool:
    """Whether ``p`` holds a diffattn ``save_pretrained`` model; a ``config.json`` beside ``model.safetensors`` that
    is not valid JSON is a :class:`~diffattn.errors.UsageError` naming it (a damaged save, not a missing one)."""
    cfg = p / "config.json"
    if not cfg.is_file() or not (p / "model.safetensors").is_file():
        return False
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{cfg} is not valid JSON ({e}): the model saved in {p} is damaged") from None
    return isinstance(data, dict) and "architecture" in data


def find_saved_model(path: str | Path) -> Path:
    """The folder holding a diffattn ``save_pretrained`` model (config.json with ``architecture`` and
    model.safetensors): ``path`` itself, else ``path/model``, ``path/final``, ``path/best``, else the most recently
    written such folder below ``path``."""
    if not Path(path).expanduser().exists():
        raise missing_path(path, "path", _RUN_NEEDS)
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"path must be a folder holding a saved model or a run directory, got {str(path)!r}")
    for p in (path, path / "model", path / "final", path / "best"):
        if _is_saved_model(p):
            return p
    found = sorted((c.parent for c in path.rglob("config.json") if _is_saved_model(c.parent)),
                   key=lambda p: (p / "model.safetensors").stat().st_mtime)
    if not found:
        kind = saved_kind(path)
        if kind is not None and not kind[0].startswith("a diffattn training run"):  # a run without a model: below
            raise ValueError(wrong_kind(path, "a run or a save_pretrained folder"))
        raise FileNotFoundError(f"no model saved with save_pretrained (config.json with 'architecture' + "
                                f"model.safetensors) under {str(path)!r}")
    return found[-1]


def is_retrofit_run(path: str | Path) -> bool:
    """Whether ``path`` is a run directory of ``diffattn train`` with task ``retrofit``."""
    return (Path(path) / RETROFIT_RUN).is_file()


def load_retrofit_run(run_dir: str | Path) -> nn.Module:
    """A retrofit training run rebuilt from its directory alone, in eval mode: the base named in ``retrofit.json``
    (the run's own ``base/`` folder for a base built from a config, else the pretrained checkpoint it was trained
    from), retrofitted and loaded from ``adapter/`` (:func:`diffattn.load_adapter`), with the peft LoRA weights of
    ``lora/`` on top when the run trained LoRA. Errors name the file at fault."""
    run_dir = Path(run_dir)
    path = run_dir / RETROFIT_RUN
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != 1 or not isinstance(meta.get("base"), str):
        raise UsageError(f"{path} must be a JSON object with format_version 1 and 'base', got {meta!r}")
    base_dir = run_dir / meta["base"]  # an absolute path stays itself
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{path} names the base model {str(base_dir)!r}, which holds no config.json")
    from transformers import AutoModelForCausalLM

    install_load_warning()
    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    model = load_adapter(base, run_dir / (meta.get("adapter") or "adapter"))
    if meta.get("lora"):
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(run_dir / meta["lora"]))
    return model.eval()


# ------------------------------------------------------------------------------------------ released checkpoints

#: the layouts a released differential model comes in (``diffattn train``'s ``model.pretrained``): layout → (what
#: :func:`diffattn.formats.saved_kind`'s call names, the folder the trained model is also written to in that layout;
#: None: diffattn's own ``save_pretrained`` is the layout)
RELEASED_LAYOUTS = {"diffllama": ("from_diffllama", "diffllama"), "motif": ("from_motif", "motif"),
                    "diffattn": ("diffattn.from_pretrained(", None), "run": ("diffattn.load_run", None)}
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"]


def resolve_source(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local folder of ``source``: a path that looks local (:func:`diffattn.io.looks_local`) as it is (a
    missing one is one line naming it and the closest names beside it, never a Hub request), else a Hugging Face Hub
    id (``org/name``) fetched with ``huggingface_hub.snapshot_download`` (config, safetensors and tokenizer files;
    ``cache_dir`` as the hub's; offline, the cache at once: :func:`diffattn.io.from_hub`)."""
    path = local_path(source, "model.pretrained", "it takes a released model folder or a Hugging Face Hub id "
                      "(org/name)")
    if path is None:
        from huggingface_hub import snapshot_download

        path = from_hub(snapshot_download, str(source), "model.pretrained", allow_patterns=_HUB_FILES,
                        cache_dir=cache_dir)
    if not path.is_dir():
        raise UsageError(f"model.pretrained {str(source)!r} is a file; it takes a released model folder or a Hugging "
                         f"Face Hub id (org/name)")
    return path


def released_layout(path: str | os.PathLike) -> str:
    """The layout of the released differential model in folder ``path`` (a key of :data:`RELEASED_LAYOUTS`), read
    from its marker files (:func:`diffattn.formats.saved_kind`); anything else is a one-line
    :class:`~diffattn.errors.UsageError` naming what was found and what to use instead."""
    kind = None if is_retrofit_run(path) else saved_kind(path)
    if kind is not None:
        for layout, (call, _) in RELEASED_LAYOUTS.items():
            if call in kind[1] and "retrofit" not in kind[1]:
                return layout
    wants = ("a DiffLlama checkpoint (transformers), a Motif checkpoint, a diffattn save_pretrained folder or a "
             "diffattn run folder")
    if kind is None:
        found = "holds no config.json that names a model (no diffattn run or save either)"
        raise UsageError(f"model.pretrained {str(path)!r} {found}; it takes {wants}")
    hint = ("; to make a plain transformers model differential, use task.name retrofit with task.base.path"
            if "transformers checkpoint (" in kind[0] else f"; load it with {kind[1]}")
    raise UsageError(f"model.pretrained {str(path)!r} is {kind[0]}, not a released differential model ({wants})"
                     f"{hint}")


def load_released(path: str | os.PathLike, *, backend: str = "auto") -> tuple[DiffattnModel, str]:
    """(the diffattn model of the released checkpoint in folder ``path``, its layout): a DiffLlama checkpoint through
    :func:`~diffattn.convert.from_diffllama`, a Motif one through :func:`~diffattn.convert.from_motif`, a diffattn
    save or run through :func:`from_pretrained` (``backend`` then is the saved one). In the checkpoint's dtype.
    Under ``torch.device("meta")`` the model is built from ``config.json`` alone (shapes, no weights read)."""
    layout = released_layout(path)
    meta = torch.empty(0).device.type == "meta"
    if layout == "diffllama":
        from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

        if meta:
            return from_diffllama(DiffLlamaForCausalLM(DiffLlamaConfig.from_pretrained(str(path))),
                                  backend=backend), layout
        return from_diffllama(_read_diffllama(path), backend=backend), layout
    if layout == "motif":
        if meta:
            config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
            return MotifLM(**motif_kwargs(config, backend)), layout
        return from_motif(path, backend=backend), layout
    if meta:  # the weights of a diffattn save are read, shapes only are not worth a second code path
        raise RuntimeError("a diffattn save is not built on the meta device")
    return (_load_saved(find_saved_model(path)) if layout == "run" else from_pretrained(path)), layout


def _read_diffllama(path: str | os.PathLike) -> nn.Module:
    """``DiffLlamaForCausalLM.from_pretrained(path)``, strictly: transformers fills missing or mis-shaped weights
    with random ones and says so in a log; here any such key, or a folder transformers cannot read, is one line
    naming the folder (a :class:`~diffattn.errors.UsageError`), so no converted model is ever partly random."""
    from transformers import DiffLlamaForCausalLM

    kind = saved_kind(path)
    what = f"{path} is {kind[0] if kind else 'a DiffLlama checkpoint'}"
    install_load_warning()
    try:
        model, info = DiffLlamaForCausalLM.from_pretrained(str(path), output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as e:  # no weights, a damaged file, a config it cannot read
        raise UsageError(f"{what} that transformers cannot load ({type(e).__name__}: "
                         f"{one_line(e).split('; ')[0]})") from None
    bad = {k: sorted(map(str, info.get(k) or ())) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        found = "; ".join(f"{k.replace('_', ' ')} {len(v)}: {v[:4]}" for k, v in bad.items() if v)
        raise UsageError(f"{what} whose weights do not match its config.json ({found})")
    return model


def save_released(model: nn.Module, layout: str, folder: str | os.PathLike, *, source: str | os.PathLike | None
                  = None) -> Path | None:
    """Write ``model`` (a diffattn model loaded by :func:`load_released`) into ``folder/<layout>`` in its original
    layout: a DiffLlama as ``DiffLlamaForCausalLM.save_pretrained`` (what ``transformers`` loads), a Motif model as
    :func:`~diffattn.convert.to_motif` (the released config of ``source`` kept for its other entries, e.g. token
    ids and ``auto_map``). A diffattn save needs nothing besides ``save_pretrained``: None."""
    sub = RELEASED_LAYOUTS[layout][1]
    if sub is None:
        return None
    target = Path(folder) / sub
    if layout == "diffllama":
        hf = to_diffllama(model)
        with atomic_write_dir(target) as tmp:
            hf.save_pretrained(tmp)
        return target
    base = json.loads((Path(source) / "config.json").read_text(encoding="utf-8")) if source is not None else {}
    base["torch_dtype"] = str(model.lm_head.weight.dtype).removeprefix("torch.")  # the dtype the weights are saved in
    to_motif(model, target, base_config=base)
    return target


# ------------------------------------------------------------------------------------------------ timm's registry

def _timm_entry(name: str, timm_name: str):
    """The timm entry point that builds diffattn's ``name`` (``features_only=True``: the family's extractor)."""

    def entry(pretrained: bool = False, pretrained_cfg=None, **kwargs) -> nn.Module:
        if pretrained is True:  # timm names the tag in pretrained_cfg ("name.tag"), else the default (first) tag
            tag = pretrained_cfg if isinstance(pretrained_cfg, str) else getattr(pretrained_cfg, "tag", None)
            tags = [t for _, t in list_pretrained(name)]
            pretrained = tag or (tags[0] if tags else True)  # no tags: create_model explains pretrained=True
        return create_model(name, pretrained=pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = timm_name
    entry.__module__ = __name__
    entry.__doc__ = f"timm entry point of diffattn's {name!r} (features_only=True supported)."
    return entry


#: the names :func:`register_timm` has put in timm's registry (empty until it is called)
TIMM_NAMES: list[str] = []
#: timm's pretrained configs of the registered names: timm's ``register_model`` reads a module's ``default_cfgs``
#: for the pretrained tags (filled by :func:`register_timm`)
default_cfgs: dict = {}


def register_timm() -> list[str]:
    """Register each vision model with timm as ``diffattn_<name>`` and, where timm lacks it, as ``<name>``, so that
    ``timm.create_model("diff_vit_nano")`` builds diffattn's model and ``timm.list_models(pretrained=True)`` lists
    its public checkpoints. Idempotent; returns :data:`TIMM_NAMES`. Imports timm (``ImportError`` without it).
    Importing diffattn registers nothing: call this
    (``diffattn.register_timm()``) before asking timm for a diffattn name."""
    import timm
    from timm.models import register_model as timm_register

    default_cfgs.update(timm_default_cfgs(vit.VIT_CONFIGS))
    exported = list(__all__)
    for name in vit.VIT_CONFIGS:
        for timm_name in (f"diffattn_{name}", name):
            if not timm.is_model(timm_name):  # timm's own vit_*_patch16_224 are never overridden
                timm_register(_timm_entry(name, timm_name))
                TIMM_NAMES.append(timm_name)
    __all__[:] = exported  # timm's register_model appends each name to the module's __all__; they are not globals
    return TIMM_NAMES
