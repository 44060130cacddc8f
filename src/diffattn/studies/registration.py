"""Registrations: one confirmatory question per YAML file, committed before any run answers it, so that git can check
that the question, the seeds and the analysis came first.

A registration is ``studies/registrations/<name>.yaml`` in the project's checkout (the file name is its name):

    study: recall_ablation           # a registered study (diffattn.studies.study_names())
    confirmatory: true
    question: Does ... ?
    primary_endpoint: w64.auc        # the metric key as the study's results.json writes it
    comparison: {variant: diff_lambda0.8, baseline: standard}   # variant − baseline, the study's variant names
    test: paired_test                # one of diffattn.studies.stats.MDD_TESTS
    holm_family: [recall_v1_lambda08, ...]   # the registered primary endpoints corrected together (Holm 1979)
    seeds: [200, ..., 209]           # at least 8 fresh seeds, disjoint from every earlier result's
    tuning_seeds: [300, 301]         # where each model's lr is chosen (never reported); [] when nothing is tuned
    paper_effect: {value: 14.8, unit: points, source: ..., scaling_argument: ...}
    minimum_detectable_difference: {assumed_std: 5.0, std_source: ..., value: 4.97}
    exclusion_rules: [...]           # which seeds or runs may be dropped, decided now
    control: {statement: ..., key: w64.accuracy, level: 90.0}   # the task-learnability control, stated now
    budget: {wall_minutes: 12, basis: ...}   # planned wall time on the shared 2-core CPU
    config: studies/registrations/configs/recall_headline.yaml  # the study config that runs it
    needs: []                        # study options that do not exist yet (the config cannot run until they do)

``minimum_detectable_difference.value`` is what :func:`diffattn.studies.stats.min_detectable_difference` gives for the
registered seeds and test at α = 0.05 and 80 % power from the stated ``assumed_std``; the loader recomputes it and
rejects a file whose value disagrees. The run's config names the registrations it answers (``registrations:``), and
its report prints the registration's commit and labels its results confirmatory or exploratory
(:mod:`.provenance`). Changes after registration go in ``studies/deviations.md``, never into the committed file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import yaml_error
from .config import find_config, load_study, study_for, study_names
from .provenance import REGISTRATIONS, project_root
from .stats import MDD_TESTS, min_detectable_difference

__all__ = ["Registration", "FIELDS", "ALPHA", "POWER", "MIN_SEEDS", "EARLIER_SEEDS", "SHARED_STREAMS", "used_seeds",
           "validate_registration", "load_registration", "load_registrations", "registrations_folder"]

#: every field of a registration file; ``needs`` may be left out (nothing missing)
FIELDS = ("study", "confirmatory", "question", "primary_endpoint", "comparison", "test", "holm_family", "seeds",
          "tuning_seeds", "paper_effect", "minimum_detectable_difference", "exclusion_rules", "control", "budget",
          "config", "needs")
#: the level and power every registered minimum detectable difference is computed at
ALPHA, POWER = 0.05, 0.8
#: the fewest reported seeds a registration may plan
MIN_SEEDS = 8
#: study → seeds of earlier results beyond its packaged config's ``seeds`` and ``tuning_seeds``: the runs
#: docs/studies.md and docs/detection.md report (needles: the dry runs that chose the budget, seeds 0-4; detection:
#: seeds 0-5 in two runs)
EARLIER_SEEDS: dict[str, tuple[int, ...]] = {
    "needles": (0, 1, 2, 3, 4, 100), "recall": (0, 1, 2, 3, 4, 100), "recall_ablation": (10, 11, 12, 13, 14, 100),
    "diffclip": (0, 1, 2, 3, 4), "dgvit": (0, 1, 2, 3, 4, 100), "noise": (0, 1, 2, 3, 4, 100),
    "detection": (0, 1, 2, 3, 4, 5), "retrofit": (0, 1, 2), "paligemma": (0, 1, 2), "llava": (0, 1, 2),
}
#: studies whose runs draw the same training stream for a seed (the MQAR generator of diffattn.studies.common): a
#: seed one of them used counts as used by all
SHARED_STREAMS: tuple[frozenset[str], ...] = (frozenset({"needles", "recall", "recall_ablation"}),)


@dataclass(frozen=True)
class Registration:
    """A checked registration file (module docstring): ``name`` is the file's stem, ``path`` the file; the other
    attributes are its fields; :attr:`mdd` the minimum detectable difference recomputed from them."""

    name: str
    path: Path
    study: str
    question: str
    primary_endpoint: str
    variant: str
    baseline: str
    test: str
    holm_family: tuple[str, ...]
    seeds: tuple[int, ...]
    tuning_seeds: tuple[int, ...]
    paper_effect: Mapping[str, Any]
    assumed_std: float
    exclusion_rules: tuple[str, ...]
    control: Mapping[str, Any]
    budget: Mapping[str, Any]
    config: str
    needs: tuple[str, ...]

    @property
    def mdd(self) -> float:
        """The smallest true difference the registered test detects on these seeds at :data:`ALPHA` with
        :data:`POWER` if the per-seed differences have the stated ``assumed_std``."""
        return min_detectable_difference(self.assumed_std, len(self.seeds), alpha=ALPHA, power=POWER, test=self.test)

    @property
    def runnable(self) -> bool:
        """Whether the study can run it today (it needs no missing option)."""
        return not self.needs


def registrations_folder(root: str | os.PathLike | None = None) -> Path:
    """``<root>/studies/registrations`` (root: the checkout that holds it above the working directory,
    :func:`~diffattn.studies.provenance.project_root`). A FileNotFoundError when there is none."""
    base = Path(root) if root is not None else project_root()
    folder = None if base is None else base / REGISTRATIONS
    if folder is None or not folder.is_dir():
        raise FileNotFoundError(f"no {REGISTRATIONS} folder in {base if base is not None else Path.cwd()} or above "
                                f"it: run from the project's checkout or pass root")
    return folder


def used_seeds(study: str) -> set[int]:
    """The seeds earlier results of ``study`` used: its packaged config's ``seeds`` and ``tuning_seeds`` and
    :data:`EARLIER_SEEDS`, for every study that shares its training stream (:data:`SHARED_STREAMS`)."""
    group = next((g for g in SHARED_STREAMS if study in g), frozenset({study}))
    used: set[int] = set()
    for name in group:
        used |= set(EARLIER_SEEDS.get(name, ()))
        if name in study_names():
            try:
                data = yaml.safe_load(find_config(name).read_text(encoding="utf-8")) or {}
            except FileNotFoundError:
                continue
            used |= {s for key in ("seeds", "tuning_seeds") for s in data.get(key) or [] if isinstance(s, int)}
    return used


def _text(errors: list[str], where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        errors.append(f"{key} in {where} must be a non-empty string, got {value!r}")
        return ""
    return value


def _number(errors: list[str], where: str, key: str, value: Any, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        errors.append(f"{key} in {where} must be a finite number{' > 0' if positive else ''}, got {value!r}")
        return math.nan
    return float(value)


def _seeds(errors: list[str], where: str, key: str, value: Any, least: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) < least or len(set(map(repr, value))) != len(value) or \
            not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
        errors.append(f"{key} in {where} must be a list of at least {least} distinct integers >= 0, got {value!r}")
        return ()
    return tuple(value)


def _mapping(errors: list[str], where: str, key: str, value: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != set(keys):
        errors.append(f"{key} in {where} must be a mapping with exactly the keys {list(keys)}, got {value!r}")
        return {}
    return value


def _strings(errors: list[str], where: str, key: str, value: Any, least: int) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) < least or not all(isinstance(v, str) and v.strip() for v in value):
        errors.append(f"{key} in {where} must be a list of at least {least} non-empty strings, got {value!r}")
        return ()
    return tuple(value)


def validate_registration(data: Any, name: str, where: str = "the registration",
                          root: str | os.PathLike | None = None) -> Registration:
    """The :class:`Registration` ``name`` from the mapping ``data`` (module docstring), checked: every field, the
    study and its variants, the seeds (fresh: disjoint from :func:`used_seeds` and from ``tuning_seeds``), the
    recomputed minimum detectable difference and the config (``root``: the checkout its path is relative to). A
    ``ValueError`` lists every problem, each naming the field, what it got and what it needs."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold a YAML mapping, got {type(data).__name__}")
    errors: list[str] = []
    missing = [k for k in FIELDS if k not in data and k != "needs"]
    unknown = sorted(set(data) - set(FIELDS))
    if missing:
        errors.append(f"{where} misses the fields {missing}")
    if unknown:
        errors.append(f"unknown fields {unknown} in {where}; the fields are {', '.join(FIELDS)}")
    if errors:
        raise ValueError("; ".join(errors))
    try:
        study = study_for(data["study"], where)
    except ValueError as e:
        raise ValueError(str(e)) from None
    if data["confirmatory"] is not True:
        errors.append(f"confirmatory in {where} must be true (a registration is a confirmatory question; exploratory "
                      f"analyses need none), got {data['confirmatory']!r}")
    question = _text(errors, where, "question", data["question"])
    endpoint = _text(errors, where, "primary_endpoint", data["primary_endpoint"])
    needs = _strings(errors, where, "needs", data.get("needs", []), 0)
    comparison = _mapping(errors, where, "comparison", data["comparison"], ("variant", "baseline"))
    for key in ("variant", "baseline"):
        v = comparison.get(key)
        if comparison and (not isinstance(v, str) or (v not in study.variants and not any(v in n for n in needs))):
            errors.append(f"comparison.{key} in {where} must be a variant of study {study.name!r} "
                          f"({', '.join(study.variants)}) or one that a `needs` entry names, got {v!r}")
    if comparison and comparison.get("variant") == comparison.get("baseline"):
        errors.append(f"comparison in {where} must compare two different variants, got {comparison!r}")
    test = data["test"]
    if test not in MDD_TESTS:
        errors.append(f"test in {where} must be one of {', '.join(MDD_TESTS)} (diffattn.studies.stats), got {test!r}")
    family = _strings(errors, where, "holm_family", data["holm_family"], 1)
    if family and name not in family:
        errors.append(f"holm_family in {where} must list this registration ({name!r}) among the primary endpoints "
                      f"corrected together, got {list(family)}")
    seeds = _seeds(errors, where, "seeds", data["seeds"], MIN_SEEDS)
    tuning = _seeds(errors, where, "tuning_seeds", data["tuning_seeds"], 0)
    reused = sorted(set(seeds) & used_seeds(study.name))
    if reused:
        errors.append(f"seeds in {where} must be fresh, disjoint from the seeds earlier results of study "
                      f"{study.name!r} used ({sorted(used_seeds(study.name))}), got {reused} among them")
    if set(seeds) & set(tuning):
        errors.append(f"tuning_seeds in {where} must be disjoint from the reported seeds, got "
                      f"{sorted(set(seeds) & set(tuning))} in both")
    effect = _mapping(errors, where, "paper_effect", data["paper_effect"], ("value", "unit", "source",
                                                                             "scaling_argument"))
    if effect:
        _number(errors, where, "paper_effect.value", effect["value"])
        for key in ("unit", "source", "scaling_argument"):
            _text(errors, where, f"paper_effect.{key}", effect[key])
    mdd = _mapping(errors, where, "minimum_detectable_difference", data["minimum_detectable_difference"],
                   ("assumed_std", "std_source", "value"))
    std = math.nan
    if mdd:
        std = _number(errors, where, "minimum_detectable_difference.assumed_std", mdd["assumed_std"], positive=True)
        _text(errors, where, "minimum_detectable_difference.std_source", mdd["std_source"])
        stated = mdd["value"]
        if seeds and test in MDD_TESTS and math.isfinite(std):
            computed = min_detectable_difference(std, len(seeds), alpha=ALPHA, power=POWER, test=test)
            if not (isinstance(stated, (int, float)) and not isinstance(stated, bool)
                    and abs(stated - computed) <= 0.01 * max(1.0, abs(computed))):
                errors.append(f"minimum_detectable_difference.value in {where} must be what {test} detects on "
                              f"{len(seeds)} seeds with sd {std:g} at α = {ALPHA:g}, {POWER:.0%} power: "
                              f"{computed:.2f}, got {stated!r}")
    exclusion = _strings(errors, where, "exclusion_rules", data["exclusion_rules"], 1)
    control = _mapping(errors, where, "control", data["control"], ("statement", "key", "level"))
    if control:
        _text(errors, where, "control.statement", control["statement"])
        _text(errors, where, "control.key", control["key"])
        _number(errors, where, "control.level", control["level"])
    budget = _mapping(errors, where, "budget", data["budget"], ("wall_minutes", "basis"))
    if budget:
        _number(errors, where, "budget.wall_minutes", budget["wall_minutes"], positive=True)
        _text(errors, where, "budget.basis", budget["basis"])
    config = _text(errors, where, "config", data["config"])
    if config and seeds:
        errors += _config_errors(config, name, study.name, seeds, tuning, comparison, needs, where, root)
    if errors:
        raise ValueError("; ".join(errors))
    return Registration(name=name, path=Path(where), study=study.name, question=question, primary_endpoint=endpoint,
                        variant=comparison["variant"], baseline=comparison["baseline"], test=test,
                        holm_family=family, seeds=seeds, tuning_seeds=tuning, paper_effect=dict(effect),
                        assumed_std=std, exclusion_rules=exclusion, control=dict(control), budget=dict(budget),
                        config=config, needs=needs)


def _config_errors(config: str, name: str, study: str, seeds: tuple[int, ...], tuning: tuple[int, ...],
                   comparison: Mapping[str, Any], needs: tuple[str, ...], where: str,
                   root: str | os.PathLike | None) -> list[str]:
    """What is wrong with the study config a registration runs: it must exist, be that study's, name the
    registration, the registered seeds and tuning seeds and both compared variants, and (with nothing in ``needs``)
    load as a valid study config."""
    base = Path(root) if root is not None else project_root() or Path.cwd()
    path = base / config
    if not path.is_file():
        return [f"config in {where} must be the path of a study config relative to {base}, got {config!r} (no "
                f"such file)"]
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        return [str(yaml_error(path, e))]
    if not isinstance(cfg, dict):
        return [f"config {config} of {where} must hold a YAML mapping, got {type(cfg).__name__}"]
    errors = []
    if cfg.get("study") != study:
        errors.append(f"config {config} of {where} must run study {study!r}, got {cfg.get('study')!r}")
    if name not in (cfg.get("registrations") or []):
        errors.append(f"config {config} of {where} must name this registration in `registrations`, got "
                      f"{cfg.get('registrations')!r}")
    if list(cfg.get("seeds") or []) != list(seeds):
        errors.append(f"config {config} of {where} must run the registered seeds {list(seeds)}, got "
                      f"{cfg.get('seeds')!r}")
    if list(cfg.get("tuning_seeds") or []) != list(tuning):
        errors.append(f"config {config} of {where} must tune on the registered tuning_seeds {list(tuning)}, got "
                      f"{cfg.get('tuning_seeds')!r}")
    variants = cfg.get("variants") or []
    if comparison and not {comparison.get("variant"), comparison.get("baseline")} <= set(variants):
        errors.append(f"config {config} of {where} must train both compared variants {dict(comparison)}, got "
                      f"variants {variants!r}")
    if not needs and not errors:
        try:
            load_study(path)
        except (ValueError, FileNotFoundError) as e:
            errors.append(f"config {config} of {where} must be a valid study config (or the missing options listed "
                          f"in `needs`): {e}")
    return errors


def load_registration(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Registration:
    """The checked registration in the YAML file ``path`` (named by its stem; :func:`validate_registration`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    return validate_registration(data, path.stem, str(path), root)


def load_registrations(root: str | os.PathLike | None = None) -> dict[str, Registration]:
    """Every registration of the checkout at ``root`` (:func:`registrations_folder`), by name, checked one by one
    and together: each ``holm_family`` lists registrations that exist and that list the same family."""
    folder = registrations_folder(root)
    regs = {p.stem: load_registration(p, folder.parents[1]) for p in sorted(folder.glob("*.yaml"))}
    errors = []
    for reg in regs.values():
        unknown = [n for n in reg.holm_family if n not in regs]
        if unknown:
            errors.append(f"holm_family in {reg.path} must name registrations of {folder}, got unknown {unknown}")
            continue
        odd = [n for n in reg.holm_family if set(regs[n].holm_family) != set(reg.holm_family)]
        if odd:
            errors.append(f"holm_family in {reg.path} must be the same family in each of its members, but "
                          f"{odd} list other families")
    if errors:
        raise ValueError("; ".join(errors))
    return regs
