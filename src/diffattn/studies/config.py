"""Study configs: a YAML mapping naming the experiment (``study``), the ``variants`` (the first is the baseline
every other is compared with), the ``seeds`` (at least 2), the output folder ``out`` and the study's own budget
keys (each study module's ``DEFAULTS``). Unknown keys and wrong types are a ``ValueError`` naming the key."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["COMMON_KEYS", "STUDY_MODULES", "WALL_TIMES", "find_config", "load_study", "validate_study",
           "budget_warnings"]

#: study name → module (each defines ``VARIANTS``, ``DEFAULTS`` and ``run(cfg, progress)``)
STUDY_MODULES: dict[str, str] = {
    "diffclip": "diffattn.studies.diffclip",
    "retrofit": "diffattn.studies.retrofit",
    "dgvit": "diffattn.studies.dgvit",
    "noise": "diffattn.studies.noise",
    "paligemma": "diffattn.studies.paligemma",
    "llava": "diffattn.studies.llava",
    "detection": "diffattn.studies.detection",
    "needles": "diffattn.studies.needles",
    "recall": "diffattn.studies.recall",
    "recall_ablation": "diffattn.studies.recall_ablation",
}
#: study name → the wall time of its packaged config as measured for docs/studies.md (its summary table; the shared
#: 2-core CPU, one thread per study): what ``diffattn study --help`` quotes, never an estimate
WALL_TIMES: dict[str, str] = {
    "diffclip": "67 min (5 seeds in 3 processes)",
    "retrofit": "27.1 min",
    "dgvit": "21.7 min (two calls)",
    "noise": "21.7 min (two processes)",
    "paligemma": "20.5 min",
    "llava": "25 min",
    "detection": "56 + 37 min (6 seeds in two runs, docs/detection.md)",
    "needles": "8.5 min",
    "recall": "20.6 min",
    "recall_ablation": "51.1 min",
}
#: keys every study config holds
COMMON_KEYS = ("study", "variants", "seeds", "out")


def find_config(config: str | os.PathLike) -> Path:
    """``config`` itself if it is a file, else the study recipe shipped with the package under that name
    (``diffclip`` → ``<package>/configs/studies/diffclip.yaml``; :func:`diffattn.configs.find_config`)."""
    from ..configs import find_config as _find

    try:
        return _find(config, group="studies")
    except FileNotFoundError:
        raise FileNotFoundError(f"config must be a study YAML file or the name of a packaged study "
                                f"({', '.join(STUDY_MODULES)}), got {str(config)!r}") from None


def _check_type(where: str, key: str, value: Any, default: Any) -> None:
    if default is None:
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(f"{key} in {where} must be of type {type(default).__name__} (default {default!r}), got "
                         f"{value!r} ({type(value).__name__})")


def validate_study(cfg: Any, where: str = "the study config") -> dict[str, Any]:
    """The full config (the study's ``DEFAULTS`` under ``cfg``), checked; ``where`` names the source in errors."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{where} must hold a YAML mapping, got {type(cfg).__name__}")
    name = cfg.get("study")
    if name not in STUDY_MODULES:
        raise ValueError(f"study in {where} must be one of {', '.join(STUDY_MODULES)}, got {name!r}")
    module = importlib.import_module(STUDY_MODULES[name])
    defaults = {"variants": list(getattr(module, "DEFAULT_VARIANTS", module.VARIANTS)), "out": f"runs/studies/{name}",
                **module.DEFAULTS}
    valid = (*COMMON_KEYS, *module.DEFAULTS)
    unknown = sorted(set(cfg) - set(valid))
    if unknown:
        raise ValueError(f"unknown study keys {unknown} in {where}; valid keys for study {name!r}: "
                         f"{', '.join(valid)}")
    errors: list[str] = []  # every problem of the config, reported together
    seeds = cfg.get("seeds")
    if not isinstance(seeds, list) or len(seeds) < 2 or not all(_hashable(x) for x in seeds) or \
            len(set(seeds)) != len(seeds) or \
            not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds):
        errors.append(f"seeds in {where} must be a list of at least 2 distinct integers >= 0, got {seeds!r}")
    variants = cfg.get("variants", defaults["variants"])
    if not isinstance(variants, list) or len(variants) < 2 or not all(_hashable(v) for v in variants) or \
            len(set(variants)) != len(variants) or any(v not in module.VARIANTS for v in variants):
        errors.append(f"variants in {where} must be a list of at least 2 distinct names from "
                      f"{list(module.VARIANTS)} (the first is the baseline), got {variants!r}")
        variants = defaults["variants"]
    if not isinstance(cfg.get("out", defaults["out"]), str):
        errors.append(f"out in {where} must be a folder path (str), got {cfg.get('out')!r}")
    typed = True
    for key, value in cfg.items():
        if key in module.DEFAULTS:
            try:
                _check_type(where, key, value, module.DEFAULTS[key])
            except ValueError as e:
                errors.append(str(e))
                typed = False
    full = {**defaults, **cfg, "variants": variants}
    check = getattr(module, "check_config", None)
    if check is not None and typed:  # the budget's constraints need the types right
        try:
            check(full, where)
        except ValueError as e:
            errors.append(str(e))
    if errors:
        raise ValueError("; ".join(errors))
    return full


def budget_warnings(cfg: dict[str, Any]) -> list[str]:
    """One line per budget key of a checked study config that undoes another: a warm-up (``warmup_steps``) at
    least as long as the training (``steps``), where the lr rises linearly the whole run and never reaches its
    peak or decays. The ``diffattn study`` command prints them as ``diffattn: warning: …`` before it starts."""
    steps, warmup = cfg.get("steps"), cfg.get("warmup_steps")
    if isinstance(steps, int) and isinstance(warmup, int) and warmup >= steps > 0:
        return [f"warmup_steps {warmup} is not shorter than steps {steps}: the learning rate rises for the whole "
                f"run and reaches only {steps / warmup:.0%} of lr {cfg.get('lr', '')}".rstrip() +
                f"; set warmup_steps below {steps} (e.g. --set warmup_steps={max(1, steps // 10)})"]
    return []


def _hashable(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def load_study(config: str | os.PathLike, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A study config (module docstring): a YAML file, or the name of one under diffattn/configs/studies/; ``overrides``
    (``{"out": ..., "seeds": [...], "model.dim": 32}``: a dotted key sets an entry of a mapping) replace its
    entries before it is checked."""
    from ..errors import yaml_error

    path = find_config(config)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    for key, value in (overrides or {}).items():
        if not isinstance(data, dict):
            break
        *parents, last = key.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {p!r} in {path} is not a mapping")
        node[last] = value
    return validate_study(data, str(path) + (" with the command-line overrides" if overrides else ""))
