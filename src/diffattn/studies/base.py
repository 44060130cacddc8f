"""The study protocol and the registry of studies: what a study is, how it is found by name, how it runs.

A study is one :class:`Study` subclass registered by name plus its YAML config
(``diffattn/configs/studies/<name>.yaml``, or any file naming ``study: <name>``):

- class keywords, which set the class attributes of the same names: ``name`` (given: the class registers an
  instance under it, as :func:`register_study` does), ``title`` (the report's heading), ``variants`` (variant →
  label, or → (model, label); the first listed in a config is the baseline), ``default_variants`` (None: all),
  ``defaults`` (the budget: key → default value, whose type is the key's type) and ``control`` (the positive
  control(s) the baseline must pass before any comparison: a :class:`~diffattn.studies.report.Control`, a list of
  them, or a function of the config giving them; held as ``positive_control``)::

      class NoiseStudy(Study, name="noise", title="Study: ...", variants=VARIANTS, defaults=DEFAULTS,
                       control=CONTROL):
          ...

  (setting the attributes in the class body and decorating the class with :func:`register_study` works as well);
- :meth:`Study.check` (the budget's constraints, one error message per broken constraint),
  :meth:`Study.control` (the positive control(s) for a config: the ``control`` keyword's),
  :meth:`Study.run` (every variant at every seed: seed → variant label → results, usually through
  :func:`~diffattn.studies.report.run_seeds`) and :meth:`Study.report` (the tables: usually
  :func:`~diffattn.studies.report.write_study`). :meth:`Study.execute` runs the two and times them.

A study reads its config as a :class:`StudyConfig`: the common keys as fields, the budget by key
(``cfg["steps"]``) or attribute (``cfg.steps``).

The code several studies share is in :mod:`.common` (``mqar_stream``, ``require_datasets``, the needle prompts);
this module keeps the protocol and the registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .. import configs, directions
from ..deprecations import moved_attribute
from . import common
from .protocol import run_protocol_b
from .report import Control, Metric, write_study

__all__ = ["Study", "StudyConfig", "COMMON_KEYS", "register_study", "add_study_loader", "get_study",
           "registered_studies"]

#: keys every study config holds
COMMON_KEYS = ("study", "variants", "seeds", "out")


@dataclass(frozen=True)
class StudyConfig(Mapping):
    """A checked study config (:func:`diffattn.studies.validate_study`): the common keys as fields and ``budget``,
    the study's own keys (its ``defaults`` overridden by the file). It is also the read-only mapping of all of them
    (``cfg["steps"]``, ``dict(cfg)``), and a budget key reads as an attribute (``cfg.steps``)."""

    study: str
    variants: list[str]
    seeds: list[int]
    out: str
    budget: dict[str, Any] = field(default_factory=dict)

    def _flat(self) -> dict[str, Any]:
        return {"study": self.study, "variants": self.variants, "seeds": self.seeds, "out": self.out, **self.budget}

    def __getitem__(self, key: str) -> Any:
        return self._flat()[key]

    def __iter__(self):
        return iter(self._flat())

    def __len__(self) -> int:
        return len(COMMON_KEYS) + len(self.budget)

    def __getattr__(self, key: str) -> Any:
        budget = self.__dict__.get("budget", {})
        if key in budget:
            return budget[key]
        raise AttributeError(f"{type(self).__name__} has no key {key!r}")

    def replace(self, **changes: Any) -> StudyConfig:
        """A copy with ``changes`` (common or budget keys)."""
        flat = {**self._flat(), **changes}
        return StudyConfig(**{k: flat.pop(k) for k in COMMON_KEYS}, budget=flat)


class Study:
    """One experiment run over seeds (module docstring). Subclass it with the class keywords (``name``, ``title``,
    ``variants``, ``default_variants``, ``defaults``, ``control``; a ``name`` registers the study) and implement
    :meth:`run` and :meth:`report` (and :meth:`check` for constraints between budget keys)."""

    name: ClassVar[str]
    title: ClassVar[str] = ""
    variants: ClassVar[Mapping[str, Any]]
    default_variants: ClassVar[Sequence[str] | None] = None
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: the ``control`` class keyword: a :class:`Control`, a list of them, or a function of the config giving them
    positive_control: ClassVar[Control | list[Control] | Callable[[StudyConfig], Any] | None] = None

    def __init_subclass__(cls, *, name: str | None = None, title: str | None = None,
                          variants: Mapping[str, Any] | None = None, default_variants: Sequence[str] | None = None,
                          defaults: Mapping[str, Any] | None = None,
                          control: Control | list[Control] | Callable[[StudyConfig], Any] | None = None,
                          **kwargs: Any) -> None:
        """Set the class attributes given as class keywords (``control`` as :attr:`positive_control`); with a
        ``name``, register an instance (:func:`register_study`). A subclass without keywords inherits its parent's
        and registers nothing."""
        super().__init_subclass__(**kwargs)
        given = {"name": name, "title": title, "variants": variants, "default_variants": default_variants,
                 "defaults": defaults, "positive_control": control}
        for key, value in given.items():
            if value is not None:
                setattr(cls, key, value)
        if name is not None:
            register_study(cls)

    def label(self, variant: str) -> str:
        """The label of ``variant`` in the tables (the last entry of a (model, label) value)."""
        v = self.variants[variant]
        return v[-1] if isinstance(v, tuple) else v

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        """Every constraint of the budget that ``cfg`` breaks, one message each naming the key and ``where``."""
        return []

    def control(self, cfg: StudyConfig) -> Control | list[Control]:
        """The positive control(s) the baseline must pass before any comparison (:attr:`positive_control`, the
        ``control`` class keyword; a function of the config is called with ``cfg``)."""
        given = type(self).positive_control
        if given is None:
            raise NotImplementedError(f"study {self.name!r} declares no control")
        return given(cfg) if callable(given) else given

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """seed → variant label → that variant's results."""
        raise NotImplementedError

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        """Write ``<out>/results.json`` and ``<out>/report.md``; returns ``{"rows", "table", "seconds", "report",
        "results", "control"}`` (:func:`~diffattn.studies.report.write_study`)."""
        raise NotImplementedError

    def write_report(self, cfg: StudyConfig, intro: str, per_seed: dict[int, dict], metrics: Sequence[Metric],
                     seconds: float, extra_sections: Sequence[str] = ()) -> dict[str, Any]:
        """What :meth:`report` returns, written under ``cfg["out"]`` with the study's title and its :meth:`control`
        (:func:`~diffattn.studies.report.write_study`; ``extra_sections``: markdown after the tables)."""
        return write_study(cfg["out"], cfg, self.title, intro, per_seed, metrics, seconds, extra_sections,
                           control=self.control(cfg))

    def tuning_score(self, cfg: StudyConfig, result: Mapping[str, Any]) -> tuple[float, float]:
        """What protocol (b) ranks the lrs by (:func:`~diffattn.studies.protocol.select_lr`): ``(area under the
        learning curve, final metric)`` of one model's ``result`` at one tuning seed, both higher-is-better. Only
        studies with the protocol keys (:data:`~diffattn.studies.protocol.PROTOCOL_DEFAULTS`) implement it."""
        raise NotImplementedError(f"study {self.name!r} has no protocol (b)")

    def endpoint_values(self, results: Mapping[str, Any], key: str, variant: str) -> list[float | None]:
        """The per-seed values of metric ``key`` for ``variant`` in this study's ``results.json``, in the run's seed
        order, as a registration names its primary endpoint and control (:mod:`.confirmatory`). Studies that answer
        registered questions implement it."""
        raise ValueError(f"confirmatory results of study {self.name!r} cannot be read yet (a study answers a "
                         f"registered question once it implements Study.endpoint_values)")

    @staticmethod
    def seed_results(results: Mapping[str, Any], variant: str) -> list[Mapping[str, Any]]:
        """``variant``'s entries of ``per_seed`` in a ``results.json`` written by
        :func:`~diffattn.studies.report.write_study` (keyed by the variant's label), one per seed in the run's seed
        order: what :meth:`endpoint_values` reads."""
        variants, labels = results["config"]["variants"], results["labels"]
        if variant not in variants:
            raise ValueError(f"variant {variant!r} is not among the run's variants {variants}")
        label = labels[variants.index(variant)]
        return [results["per_seed"][str(s)][label] for s in results["config"]["seeds"]]

    def tuning_parts(self, cfg: StudyConfig) -> list[tuple[str, dict[str, Any]]]:
        """The parts protocol (b) tunes apart, as (name, config changes): one lr per model and part (default: one
        part, the whole study)."""
        return [("", {})]

    def execute(self, cfg: StudyConfig, progress: bool = True) -> dict[str, Any]:
        """:meth:`run` then :meth:`report`, timed; under ``protocol: b`` the per-model tuning first
        (:func:`~diffattn.studies.protocol.run_protocol_b`)."""
        if cfg.get("protocol") == "b":
            return run_protocol_b(self, cfg, progress)
        t0 = time.perf_counter()
        per_seed = self.run(cfg, progress)
        return self.report(cfg, per_seed, time.perf_counter() - t0)


_REGISTRY: dict[str, Study] = {}
#: functions that may register the study of a given name on demand (the package imports its study modules)
_LOADERS: list[Callable[[str], None]] = []


def register_study(study: Study | type[Study]) -> Study | type[Study]:
    """Register ``study`` (an instance, or a class, instantiated here: usable as a class decorator) under its
    ``name``; a second study of the same name replaces the first. Returns its argument."""
    instance = study() if isinstance(study, type) else study
    if not isinstance(instance, Study) or not isinstance(getattr(type(instance), "name", None), str):
        raise TypeError(f"register_study takes a Study with a name, got {study!r}")
    _REGISTRY[instance.name] = instance
    return study


def registered_studies() -> dict[str, Study]:
    """The studies registered so far (a copy), by name."""
    return dict(_REGISTRY)


def add_study_loader(loader: Callable[[str], None]) -> None:
    """Ask ``loader(name)`` to register the study ``name`` when :func:`get_study` does not know it yet
    (``diffattn.studies`` imports its module ``<name>``, which registers the packaged study)."""
    if loader not in _LOADERS:
        _LOADERS.append(loader)


def get_study(name: str) -> Study | None:
    """The study registered as ``name`` (after asking the loaders, :func:`add_study_loader`), or None."""
    for loader in _LOADERS:
        if name in _REGISTRY:
            break
        loader(name)
    return _REGISTRY.get(name)


#: the shared plumbing this module re-exported, now in :mod:`.common` (or its own home), read with a warning
__getattr__ = moved_attribute(__name__, {
    "mqar_stream": lambda: common.mqar_stream, "require_datasets": lambda: common.require_datasets,
    "higher_is_better": lambda: directions.higher_is_better, "apply_sets": lambda: configs.apply_sets})
