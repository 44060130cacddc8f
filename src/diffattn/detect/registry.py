"""Teach Ultralytics' model-YAML parser the differential modules, without editing Ultralytics' files.

Ultralytics builds a model from its YAML in ``ultralytics.nn.tasks.parse_model``: it looks each module name up in
that module's globals and computes the channel arguments itself for the modules it knows (``c1`` from the input
layer, ``c2`` = the YAML width × the scale's width multiple, capped by ``max_channels``; repeats scaled by the depth
multiple). :func:`register` replaces ``ultralytics.nn.tasks.parse_model`` by a wrapper that, for each row naming one of
:data:`YAML_MODULES`, hands the original parser a stand-in Ultralytics module with the same channel rules (``Conv``
for :class:`DiffAttention2d`, ``C2PSA`` / ``C3k2`` for :class:`DiffC2PSA` / :class:`DiffC3k2`), so every channel
and repeat is resolved exactly as Ultralytics resolves it, then swaps the built stand-in for the differential module
of the same sizes. The names are also put into ``ultralytics.nn.tasks``' globals, where Ultralytics looks modules up.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path

import torch.nn as nn

from .modules import DiffAttention2d, DiffC2PSA, DiffC3k2, make_psa_differential

__all__ = ["YAML_MODULES", "MODEL_YAMLS", "register", "model_yaml", "yolo"]

#: YAML module name → the Ultralytics module whose channel rules it follows
YAML_MODULES: dict[str, str] = {"DiffAttention2d": "Conv", "DiffC2PSA": "C2PSA", "DiffC3k2": "C3k2"}

#: the model YAMLs shipped with the package (``diffattn/detect/cfg``)
MODEL_YAMLS = ("yolo26n-diffattn", "yolo26s-diffattn", "yolo26n-diffpsa", "yolo26s-diffpsa")


def _finish(name: str, standin: nn.Module, args: list) -> nn.Module:
    """The differential module for the built stand-in of a row ``name`` with YAML ``args``."""
    if name == "DiffAttention2d":
        convs = list(standin) if isinstance(standin, nn.Sequential) else [standin]
        c1, c2 = convs[0].conv.in_channels, convs[0].conv.out_channels
        blocks = [DiffAttention2d(c1 if j == 0 else c2, c2, *args[1:]) for j in range(len(convs))]
        return blocks[0] if len(blocks) == 1 else nn.Sequential(*blocks)
    make_psa_differential(standin)
    for m in standin if isinstance(standin, nn.Sequential) else [standin]:
        m.__class__ = DiffC2PSA if name == "DiffC2PSA" else DiffC3k2
    return standin


def _wrap(parse_model):
    @functools.wraps(parse_model)
    def parse_model_with_diffattn(d, ch, verbose=True):
        rows = [(i, row) for i, row in enumerate(d["backbone"] + d["head"]) if row[2] in YAML_MODULES]
        if not rows:
            return parse_model(d, ch, verbose)
        d = copy.deepcopy(d)
        nb = len(d["backbone"])
        args_of = {}
        for i, (f, n, m, args) in rows:
            section, j = ("backbone", i) if i < nb else ("head", i - nb)
            std_args = [args[0], 1] if m == "DiffAttention2d" else copy.deepcopy(args)
            d[section][j] = [f, n, YAML_MODULES[m], std_args]
            args_of[i] = (m, list(args))
        model, save = parse_model(d, ch, verbose)
        for i, (name, args) in args_of.items():
            old = model[i]
            new = _finish(name, old, args)
            new.i, new.f, new.type = old.i, old.f, f"diffattn.detect.{name}"
            new.np = sum(p.numel() for p in new.parameters())
            model[i] = new
        return model, save

    parse_model_with_diffattn.diffattn_original = parse_model
    return parse_model_with_diffattn


def register() -> None:
    """Install the parser wrapper into ``ultralytics.nn.tasks`` (idempotent; :mod:`diffattn.detect` calls it on
    import)."""
    from ultralytics.nn import tasks

    if not hasattr(tasks.parse_model, "diffattn_original"):
        tasks.parse_model = _wrap(tasks.parse_model)
    for name, cls in (("DiffAttention2d", DiffAttention2d), ("DiffC2PSA", DiffC2PSA), ("DiffC3k2", DiffC3k2)):
        setattr(tasks, name, cls)


def model_yaml(name: str) -> Path:
    """The path of a shipped model YAML (:data:`MODEL_YAMLS`), with or without ``.yaml``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem not in MODEL_YAMLS:
        raise ValueError(f"name must be one of {list(MODEL_YAMLS)}, got {name!r}")
    return Path(str(resources.files("diffattn.detect") / "cfg" / f"{stem}.yaml"))


def yolo(name_or_yaml: str | Path = "yolo26n-diffattn", task: str = "detect", verbose: bool = False):
    """An ``ultralytics.YOLO`` model: a shipped differential YAML by name (:data:`MODEL_YAMLS`), or anything
    ``YOLO(...)`` takes (a YAML path such as ``yolo26n.yaml``, a ``.pt`` checkpoint), with the differential modules
    registered first. The model trains, validates, predicts and exports through Ultralytics as usual."""
    from ultralytics import YOLO

    register()
    if isinstance(name_or_yaml, str) and (name_or_yaml in MODEL_YAMLS or name_or_yaml.removesuffix(".yaml")
                                          in MODEL_YAMLS):
        name_or_yaml = model_yaml(name_or_yaml)
    if not isinstance(name_or_yaml, (str, Path)):
        raise TypeError(f"name_or_yaml must be a str or Path, got {type(name_or_yaml).__name__}")
    return YOLO(str(name_or_yaml), task=task, verbose=verbose)
