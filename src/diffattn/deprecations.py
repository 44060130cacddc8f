"""Every deprecated spelling of diffattn in one table, and the one way to warn about it.

A row names an old spelling (a keyword, a module attribute, a config key, a function), its replacement, the version
that deprecated it and the version that removes it; :func:`warn_deprecated` is the only place a deprecation warning
is raised, always a :class:`FutureWarning` (the category Python shows to the users of a library), pointing at the
user's own line. ``tests/test_deprecations.py`` fails once ``diffattn.__version__`` reaches a row's ``removed_in``: the
spelling must then be deleted, with its row. The shape is timm's ``register_model_deprecations``.

    warn_deprecated("diffattn.train.tasks.TASK_CLASSES")      # FutureWarning: "… is deprecated since diffattn
                                                              # 0.2.0 and removed in diffattn 0.3.0; use …"
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Deprecation", "DEPRECATIONS", "warn_deprecated", "moved_attribute", "version_tuple", "user_stacklevel"]


@dataclass(frozen=True)
class Deprecation:
    """One deprecated spelling: what to write instead, the version that deprecated it (``since``) and the version
    whose release deletes it (``removed_in``)."""

    replacement: str
    since: str
    removed_in: str


#: old spelling → its row. The keys are what a user wrote (a dotted name, ``Class(keyword=)``, a config key path).
#: ``docs/design.md`` ("Deprecated spellings") lists the same rows (``tests/test_deprecations.py`` compares them).
DEPRECATIONS: dict[str, Deprecation] = {
    # attention: settings as loose keyword arguments of a model family, block or registered model, or a kind's name
    # as ``attention=``: one AttentionSpec (or its dict) holds them; the settings each kind takes are its Config's
    "loose attention keywords": Deprecation("attention=AttentionSpec(...) or its dict", "0.2.0", "0.3.0"),
    "diffattn.layers.KIND_SETTINGS": Deprecation("diffattn.layers.AttentionSpec.settings_of(kind)", "0.2.0",
                                                 "0.3.0"),
    # training: a task table and names that moved out of a recipe module
    "diffattn.train.tasks.TASK_CLASSES": Deprecation("tuple(diffattn.train.tasks.TASKS)", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.build_paligemma": Deprecation(
        "diffattn.models.paligemma.build_paligemma (extra_keys=DATA_KEYS for a task.base)", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.word_tokenizer": Deprecation(
        "diffattn.models.paligemma.word_tokenizer", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.paligemma_batch": Deprecation(
        "diffattn.models.paligemma.paligemma_batch", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.paligemma_transform": Deprecation(
        "diffattn.models.paligemma.paligemma_transform", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.PALIGEMMA_SPECIAL": Deprecation(
        "diffattn.models.paligemma.PALIGEMMA_SPECIAL", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.load_paligemma": Deprecation("diffattn.eval.paligemma.load_paligemma", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.answer_paligemma": Deprecation(
        "diffattn.eval.paligemma.answer_paligemma", "0.2.0", "0.3.0"),
    "diffattn.train.tasks.vlm.paligemma_image_attention": Deprecation(
        "diffattn.eval.paligemma.paligemma_image_attention", "0.2.0", "0.3.0"),
    "diffattn.train.config.apply_overrides": Deprecation(
        "diffattn.configs.apply_sets(d, sets, min_depth=2)", "0.2.0", "0.3.0"),
    # the trainer's parts that moved out of diffattn.train.loop into a module each
    "diffattn.train.loop.fit": Deprecation("diffattn.train.step.fit", "0.2.0", "0.3.0"),
    "diffattn.train.loop.run_steps": Deprecation("diffattn.train.step.run_steps", "0.2.0", "0.3.0"),
    "diffattn.train.loop.optimizer_step": Deprecation("diffattn.train.step.optimizer_step", "0.2.0", "0.3.0"),
    "diffattn.train.loop.RunLog": Deprecation("diffattn.train.runlog.RunLog", "0.2.0", "0.3.0"),
    "diffattn.train.loop.training_bytes": Deprecation("diffattn.train.memory.training_bytes", "0.2.0", "0.3.0"),
    "diffattn.train.loop.check_fits": Deprecation("diffattn.train.build.check_fits", "0.2.0", "0.3.0"),
    "diffattn.train.loop.check_backends": Deprecation("diffattn.train.build.check_backends", "0.2.0", "0.3.0"),
    "diffattn.train.loop.build_run_model": Deprecation("diffattn.train.build.build_run_model", "0.2.0", "0.3.0"),
    "diffattn.train.loop.LAMBDA_VECTORS": Deprecation("diffattn.train.build.LAMBDA_VECTORS", "0.2.0", "0.3.0"),
    # the training config: the loose backend key of a released checkpoint's model
    "model.overrides.backend": Deprecation("model.overrides.attention.backend", "0.2.0", "0.3.0"),
    # retrofits: the method groups under their old names
    "diffattn.adapters.methods.SEED001_METHODS": Deprecation(
        "diffattn.adapters.methods.ANNEALED_METHODS", "0.2.0", "0.3.0"),
    "diffattn.adapters.methods.SEED002_METHODS": Deprecation(
        "diffattn.adapters.methods.BLENDED_METHODS", "0.2.0", "0.3.0"),
    "diffattn.adapters.SEED001_METHODS": Deprecation("diffattn.adapters.ANNEALED_METHODS", "0.2.0", "0.3.0"),
    "diffattn.adapters.SEED002_METHODS": Deprecation("diffattn.adapters.BLENDED_METHODS", "0.2.0", "0.3.0"),
    # evaluation: the report, compare and the suites' helpers moved out of diffattn.eval.runner into a module each
    "diffattn.eval.runner.write_report": Deprecation("diffattn.eval.report.write_report", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.summary_table": Deprecation("diffattn.eval.report.summary_table", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.headline_metrics": Deprecation("diffattn.eval.report.headline_metrics", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.metric_label": Deprecation("diffattn.eval.report.metric_label", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.compare": Deprecation("diffattn.eval.comparison.compare", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.load_results": Deprecation("diffattn.eval.comparison.load_results", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.flatten": Deprecation("diffattn.eval.comparison.flatten", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.recorded_chance": Deprecation("diffattn.eval.comparison.recorded_chance", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.stratified_subset": Deprecation("diffattn.eval.sampling.stratified_subset", "0.2.0", "0.3.0"),
    "diffattn.eval.runner.classification_chance": Deprecation(
        "diffattn.eval.classification.classification_chance", "0.2.0", "0.3.0"),
    # saved files: format 0 (diffattn 0.1.0) loads through its migration (diffattn.formats.migrate, which warns with a
    # FormatMigrationWarning, not through warn_deprecated); the migration goes with this row
    "diffattn_format 0": Deprecation("a file saved again by a 0.2 release (format 1)", "0.2.0", "0.3.0"),
    # studies: the registry's old table, the shared plumbing that moved to diffattn.studies.common, a study's old
    # entry point
    "diffattn.studies.STUDY_MODULES": Deprecation(
        "diffattn.studies.study_names() (a packaged study's module is diffattn.studies.<name>)", "0.2.0", "0.3.0"),
    "diffattn.studies.config.STUDY_MODULES": Deprecation(
        "diffattn.studies.study_names() (a packaged study's module is diffattn.studies.<name>)", "0.2.0", "0.3.0"),
    "diffattn.studies.base.mqar_stream": Deprecation("diffattn.studies.common.mqar_stream", "0.2.0", "0.3.0"),
    "diffattn.studies.base.require_datasets": Deprecation("diffattn.studies.common.require_datasets", "0.2.0",
                                                          "0.3.0"),
    "diffattn.studies.base.higher_is_better": Deprecation("diffattn.directions.higher_is_better", "0.2.0", "0.3.0"),
    "diffattn.studies.base.apply_sets": Deprecation("diffattn.configs.apply_sets", "0.2.0", "0.3.0"),
    "diffattn.studies.diffclip.run": Deprecation(
        "diffattn.studies.run_study(cfg) (or diffattn.studies.get_study('diffclip').execute(cfg))", "0.2.0", "0.3.0"),
    # the operator: the fused kernels moved into the operator's package, diffattn.ops
    "diffattn.kernels.triton_diff_attention": Deprecation("diffattn.ops.kernels.triton_diff_attention", "0.2.0",
                                                          "0.3.0"),
    "diffattn.kernels.triton_unsupported_reason": Deprecation("diffattn.ops.kernels.triton_unsupported_reason",
                                                              "0.2.0", "0.3.0"),
    "diffattn.kernels.triton_diff": Deprecation("diffattn.ops.kernels.triton_diff", "0.2.0", "0.3.0"),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.2.0"`` → (0, 2, 0): the numeric release segments (a suffix such as ``.dev1`` is ignored)."""
    parts = []
    for p in version.split("."):
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by the caller of this function that points at the first
    frame outside diffattn (and outside the importlib and huggingface_hub frames a load or an import passes
    through): the user's own line."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == "diffattn" or name.startswith(("diffattn.", "importlib", "huggingface_hub"))):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def warn_deprecated(old: str, *, detail: str = "", used: str = "") -> None:
    """The FutureWarning of the deprecated spelling ``old`` (a key of :data:`DEPRECATIONS`; KeyError otherwise:
    a deprecation without a row is a bug), naming its replacement and the version that removes it; ``detail``:
    what this use should write instead, when more precise than the row's replacement; ``used``: how this use spelt
    it, when more precise than ``old``."""
    row = DEPRECATIONS[old]
    warnings.warn(FutureWarning(
        f"{used or old} is deprecated since diffattn {row.since} and removed in diffattn {row.removed_in}; use "
        f"{detail or row.replacement} instead"), stacklevel=user_stacklevel())


def moved_attribute(module: str, moved: Mapping[str, Callable[[], object]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for deprecated attributes of ``module``: ``moved`` maps each old attribute name to a
    function giving its value; reading one warns with the row ``f"{module}.{name}"``."""

    def __getattr__(name: str) -> object:
        if name in moved:
            warn_deprecated(f"{module}.{name}")
            return moved[name]()
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
