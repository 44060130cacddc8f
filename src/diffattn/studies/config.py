"""Study configs: a YAML mapping naming the experiment (``study``), the ``variants`` (the first is the baseline
every other is compared with), the ``seeds`` (at least 2), the output folder ``out`` and the study's own budget
keys (each study module's ``DEFAULTS``), and the report keys every study accepts
(:data:`~diffattn.studies.report.REPORT_DEFAULTS`: ``control_set``, when and in which commit the control levels were
fixed; ``exclude_failed_seeds``). Unknown keys and wrong types are a ``ValueError`` naming the key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ..configs import apply_sets, config_names
from ..configs import find_config as _find
from ..deprecations import moved_attribute
from ..errors import yaml_error
from .base import COMMON_KEYS, Study, StudyConfig, get_study, registered_studies
from .report import REPORT_DEFAULTS

__all__ = ["COMMON_KEYS", "WALL_TIMES", "study_names", "study_for", "find_config",
           "load_study", "validate_study", "budget_warnings"]


def study_names() -> list[str]:
    """The packaged studies (one YAML under diffattn/configs/studies/ each), then the others registered so far."""
    packaged = config_names("studies")
    return packaged + [n for n in registered_studies() if n not in packaged]


def study_for(name: Any, where: str = "the study config") -> Study:
    """The registered :class:`~diffattn.studies.base.Study` called ``name`` (:func:`.base.get_study`: a packaged
    study's module, ``diffattn.studies.<name>``, is imported on first use and registers it). An unknown name is a
    ``ValueError`` listing the studies."""
    study = get_study(name) if isinstance(name, str) else None
    if study is None:
        raise ValueError(f"study in {where} must be one of {', '.join(study_names())}, got {name!r}")
    return study


#: study name → the wall time of its packaged config as measured for docs/studies.md (its summary table; the shared
#: 2-core CPU, one thread per study): what ``diffattn study --help`` quotes, never an estimate (data, not dispatch:
#: a study without an entry is "not measured")
WALL_TIMES: dict[str, str] = {
    "detection": "56 + 37 min (6 seeds in two runs, docs/detection.md)",
    "dgvit": "21.7 min (two calls)",
    "diffclip": "14.2 min (seeds 1–4; seed 0 read back from `make demo`)",
    "llava": "25 min",
    "needles": "8.5 min",
    "noise": "21.7 min (two processes)",
    "paligemma": "20.5 min",
    "recall": "20.6 min",
    "recall_ablation": "51.1 min",
    "retrofit": "27.1 min",
}


def find_config(config: str | os.PathLike) -> Path:
    """``config`` itself if it is a file, else the study recipe shipped with the package under that name
    (``diffclip`` → ``<package>/configs/studies/diffclip.yaml``; :func:`diffattn.configs.find_config`)."""
    try:
        return _find(config, group="studies")
    except FileNotFoundError:
        raise FileNotFoundError(f"config must be a study YAML file or the name of a packaged study "
                                f"({', '.join(study_names())}), got {str(config)!r}") from None


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


def validate_study(cfg: Any, where: str = "the study config") -> StudyConfig:
    """The full config (the study's ``defaults`` under ``cfg``), checked; ``where`` names the source in errors."""
    if isinstance(cfg, StudyConfig):
        cfg = dict(cfg)
    if not isinstance(cfg, dict):
        raise ValueError(f"{where} must hold a YAML mapping, got {type(cfg).__name__}")
    name = cfg.get("study")
    study = study_for(name, where)
    own = {**REPORT_DEFAULTS, **study.defaults}
    defaults = {"variants": list(study.default_variants or study.variants), "out": f"runs/studies/{name}", **own}
    valid = (*COMMON_KEYS, *own)
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
            len(set(variants)) != len(variants) or any(v not in study.variants for v in variants):
        errors.append(f"variants in {where} must be a list of at least 2 distinct names from "
                      f"{list(study.variants)} (the first is the baseline), got {variants!r}")
        variants = defaults["variants"]
    if not isinstance(cfg.get("out", defaults["out"]), str):
        errors.append(f"out in {where} must be a folder path (str), got {cfg.get('out')!r}")
    typed = True
    for key, value in cfg.items():
        if key in own:
            try:
                _check_type(where, key, value, own[key])
            except ValueError as e:
                errors.append(str(e))
                typed = False
    full = {**defaults, **cfg, "variants": variants}
    checked = StudyConfig(**{k: full.pop(k) for k in COMMON_KEYS}, budget=full)
    if typed:  # the budget's constraints need the types right
        errors += study.check(checked, where)
    if errors:
        raise ValueError("; ".join(errors))
    return checked


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


def load_study(config: str | os.PathLike, overrides: dict[str, Any] | None = None) -> StudyConfig:
    """A study config (module docstring): a YAML file, or the name of one under diffattn/configs/studies/; ``overrides``
    (``{"out": ..., "seeds": [...], "model.dim": 32}``: a dotted key sets an entry of a mapping;
    :func:`diffattn.configs.apply_sets`) replace its entries before it is checked."""
    path = find_config(config)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    if isinstance(data, dict) and overrides:
        data = apply_sets(data, overrides, where=str(path))
    return validate_study(data, str(path) + (" with the command-line overrides" if overrides else ""))


def _study_modules() -> dict[str, str]:
    return {n: f"diffattn.studies.{n}" for n in config_names("studies")}


#: ``STUDY_MODULES`` (packaged study name → ``diffattn.studies.<name>``), read with a warning: :func:`study_names`
__getattr__ = moved_attribute(__name__, {"STUDY_MODULES": _study_modules})
