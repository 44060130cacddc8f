"""``diffattn eval``: evaluate a saved model or a training run, write ``results.json`` and ``report.md`` with plots.

What runs depends on the kind of model: each kind is one module of :mod:`diffattn.eval.kinds` (vision
transformers, CLIP models, causal LMs), registered in :data:`diffattn.eval.kinds.EVAL_KINDS` with the datasets it is
evaluated on, how it recognises a model and its suite; :func:`evaluate` loads the model, finds its kind
(:func:`diffattn.eval.kinds.kind_of`) and runs that kind's suite. Every suite ends with the attention diagnostics:
per-layer mean λ (or gate), per-branch entropy, heat maps of A1, A2 and the combined map, rollout (signed;
:func:`diffattn.diagnostics.rollout`). A suite whose data is missing is skipped and the reason is written into
``results.json`` (``"skipped"``) and the report; nothing is silently left out. The report is
:mod:`diffattn.eval.report`; ``diffattn compare`` is :mod:`diffattn.eval.comparison`.

The output folder is written as a whole, atomically (:func:`diffattn.io.atomic_write_dir`): a killed evaluation
leaves the previous results, and an evaluation that skips its suite never replaces finished results (it raises a
:class:`~diffattn.errors.UsageError` and keeps them). Everything the user gave (the target, a YAML file, the
dataset name, the output folder) is checked before anything is computed or written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..data import DATASETS
from ..deprecations import moved_attribute
from ..errors import UsageError, did_you_mean, user_input, yaml_error
from ..factory import load_run, run_source
from ..io import atomic_write_dir
from ..utils import resolve_device
from . import classification, comparison, report, sampling
from .kinds import EVAL_KINDS, EvalContext, get_eval_kind, kind_of
from .kinds.base import bare_model

#: also read here (module ``__getattr__``): ``EVAL_DATASETS`` and ``KIND_NAMES``, views of the registry of kinds
__all__ = ["evaluate", "PROTOCOLS", "check_eval_dataset", "offered_datasets"]


def offered_datasets() -> str:
    """The ``--dataset`` values, per kind of model: ``"vision transformer: digits, fashion_mnist; …"``."""
    return "; ".join(f"{k.label}: {', '.join(k.datasets)}" for k in EVAL_KINDS.values())


def check_eval_dataset(dataset: str | None, kind: str | None = None, what: str = "--dataset") -> None:
    """``dataset`` (None: the default) is one ``diffattn eval`` evaluates a ``kind`` model on (any kind: one it
    evaluates some model on); otherwise a :class:`~diffattn.errors.UsageError` naming ``what`` and the sets that fit."""
    if dataset is None:
        return
    names = list(dict.fromkeys(d for k in EVAL_KINDS.values() for d in k.datasets))
    if dataset not in names:
        raise UsageError(f"{what} {dataset!r} is not a dataset diffattn eval evaluates on"
                         f"{did_you_mean(dataset, names)}; per kind of model: {offered_datasets()}")
    spec = get_eval_kind(kind) if kind is not None else None
    if spec is not None and dataset not in spec.datasets:
        fits = [k.label for k in EVAL_KINDS.values() if dataset in k.datasets]
        raise UsageError(f"{what} {dataset!r} is for a {' or '.join(fits)}, but this run is a {spec.label}; "
                         f"a {spec.label} is evaluated on {', '.join(spec.datasets)}")


#: the protocols: ``--quick`` (a smoke test), the default, ``--full`` (every test and train image). ``max_images``
#: caps the test images and ``max_train_images`` the training images a CLIP model's linear probe is fitted on, each
#: a seeded stratified sample (:func:`diffattn.eval.sampling.stratified_subset`; None: all)
QUICK = {"noise_levels": (0.0, 0.25, 0.5, 1.0), "corruptions": ("gaussian_noise", "motion_blur", "contrast"),
         "severities": (1, 3, 5), "episodes": 200, "max_images": 256, "max_train_images": 1024, "ppl_tokens": 2048,
         "lambada": 20, "needle_lengths": (128, 256), "needle_depths": (0.0, 0.5, 1.0), "needle_trials": 2,
         "probe_max_iter": 200, "probe_fine_steps": 5}
FULL = {"noise_levels": (0.0, 0.1, 0.25, 0.5, 1.0), "corruptions": None, "severities": (1, 2, 3, 4, 5),
        "episodes": 5000, "max_images": None, "max_train_images": None, "ppl_tokens": 65536, "lambada": 500,
        "needle_lengths": (256, 512, 1024, 2048), "needle_depths": (0.0, 0.25, 0.5, 0.75, 1.0), "needle_trials": 10,
        "probe_max_iter": 1000, "probe_fine_steps": 17}
DEFAULT = dict(FULL, max_images=2000, max_train_images=5000)
PROTOCOLS = {"quick": QUICK, "default": DEFAULT, "full": FULL}


# ------------------------------------------------------------------------------------------------ loading


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a YAML mapping, got {type(data).__name__}")
    return data


def _run_config(model_dir: Path) -> dict:
    for d in (model_dir, *list(model_dir.parents)[:2]):
        if (d / "config.yaml").is_file():
            return _read_yaml(d / "config.yaml")
    return {}


def _dataset_name(cfg: dict) -> str | None:
    """The built-in dataset a run trained on (None for data of its own: token files, CSV, shards, …)."""

    for key in ("dataset", "data"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("name") or v.get("dataset")
        if isinstance(v, str):
            return v if v in DATASETS else None
    return None


def _run_seed(cfg: dict):
    """The training seed a run's config.yaml records (``run.seed`` or ``seed``), for ``diffattn compare``."""
    run = cfg.get("run")
    return run.get("seed") if isinstance(run, dict) and "seed" in run else cfg.get("seed")


def _retrofit_name(run_cfg: dict) -> str:
    task = run_cfg.get("task") if isinstance(run_cfg.get("task"), dict) else {}
    base = task.get("base") if isinstance(task.get("base"), dict) else {}
    lora = " + LoRA" if task.get("lora") else ""
    return f"{base.get('type', '?')} retrofitted with {task.get('method', '?')}{lora}"


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------- driver


def evaluate(target: str | Path, out_dir: str | Path | None = None, *, dataset: str | None = None,
             text: str | None = None, mmvp: str | None = None, quick: bool = False, seed: int = 0,
             progress: bool = True, protocol: dict | None = None, device: str | None = None,
             full: bool = False) -> dict:
    """Evaluate the model in ``target``: a saved model, a run directory, or a YAML file with ``model:`` and any
    of ``dataset``, ``text``, ``mmvp``, ``quick``, ``full``, ``seed``, ``out``, ``device`` (paths relative to the
    YAML file).

    The protocol (:data:`PROTOCOLS`): ``quick`` a smoke test; by default a seeded stratified sample of the test
    images (2,000) and, for a CLIP model's linear probe, of the training images (5,000), with the papers' episode
    and corruption counts; ``full`` every image.

    ``dataset`` must fit the kind of model (its ``datasets`` in :data:`diffattn.eval.kinds.EVAL_KINDS`); ``device``
    is ``cpu``, ``cuda`` or ``cuda:N`` (None: ``cuda`` when torch sees a GPU, else ``cpu``;
    :func:`diffattn.utils.resolve_device`).

    Writes ``results.json`` and ``report.md`` with the plots into ``out_dir`` (default ``<run>/eval``) and returns
    the results. ``protocol`` overrides entries of the protocol (sizes, corruption list, episodes, needle grid)."""

    target = Path(target)
    with user_input():  # what the user gave: the target, a YAML file, the protocol, the dataset, the folder
        if target.is_file() and target.suffix in (".yaml", ".yml"):
            cfg = _read_yaml(target)
            if "model" not in cfg:
                raise UsageError(f"{target} must name the model to evaluate under 'model:'")
            model_path = (target.parent / cfg["model"]).resolve()

            def rel(key):  # paths in the YAML are relative to the YAML file
                return str((target.parent / cfg[key]).resolve()) if cfg.get(key) else None

            dataset, text, mmvp = dataset or cfg.get("dataset"), text or rel("text"), mmvp or rel("mmvp")
            device = device or cfg.get("device")
            quick, seed = quick or bool(cfg.get("quick", False)), int(cfg.get("seed", seed))
            full = full or bool(cfg.get("full", False))
            out_dir = out_dir or rel("out")
        else:
            model_path = target
        if quick and full:
            raise UsageError("--quick and --full pick opposite protocols: give one of them")
        protocol_name = "quick" if quick else ("full" if full else "default")
        p = dict(PROTOCOLS[protocol_name])
        unknown = set(protocol or {}) - set(p)
        if unknown:
            raise ValueError(f"protocol keys must be among {sorted(p)}, got {sorted(unknown)}")
        p.update(protocol or {})
        dev = resolve_device(device, "device")
        if text is not None and not Path(text).is_file():
            raise UsageError(f"--text {str(text)!r} is not a file")
        out = Path(out_dir) if out_dir else (Path(model_path) / "eval")
        previous = _check_output_dir(out)
        layout, model_dir = run_source(model_path, "target")  # any folder load_run takes, released ones included
        run_cfg = _run_config(model_dir)
        dataset = dataset or _dataset_name(run_cfg)
        torch.manual_seed(seed)
        model = load_run(model_dir)
        kind = kind_of(model, layout)
        if layout.startswith("retrofit"):  # a transformers model with the run's adapters (and LoRA)
            name, arch = _retrofit_name(run_cfg), type(bare_model(model)).__name__
        else:
            name, arch = getattr(model, "model_name", None) or layout, type(model).__name__

        if dataset in DATASETS:  # a built-in set of another kind (a name it does not know: get_dataset's error)
            check_eval_dataset(dataset, kind.name, what="dataset")
        model = model.to(dev)
    if progress:  # what is about to run, and the other protocols, before the first bar
        other = {"quick": "the default protocol without --quick, --full for every image",
                 "default": "--quick for a smoke test, --full for every image",
                 "full": "without --full a stratified sample"}[protocol_name]
        print(f"evaluating {name or arch} ({kind.label}): {protocol_name} protocol, {kind.sample(p)} ({other})",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "model": {"path": str(model_dir), "name": name, "architecture": arch, "kind": kind.name,
                  "params": _params(model), "seed": _run_seed(run_cfg)},
        "protocol": protocol_name, "eval_seed": seed, "device": str(dev), "skipped": {}}
    try:
        with atomic_write_dir(out) as tmp:  # the whole folder at once: results, report and plots agree
            who = f"{name or arch}, run {_run_label(model_dir)}"  # every figure names model, run and dataset
            ctx = EvalContext(model=model, model_dir=model_dir, dataset=dataset, text=text, mmvp=mmvp, protocol=p,
                              out=tmp, seed=seed, progress=progress, device=dev, who=who)
            try:
                results[kind.suite] = kind.run(ctx)
            except (FileNotFoundError, ImportError) as e:  # missing data (or extra): recorded, never silent
                results["skipped"][kind.name] = f"{type(e).__name__}: {e}"
                if previous is not None:
                    raise _KeepPrevious(results["skipped"][kind.name]) from None
            results["seconds"] = round(time.perf_counter() - t0, 1)
            results["output_dir"] = str(out)
            with open(tmp / "results.json", "w") as f:
                json.dump(results, f, indent=1, default=float)
            report.write_report(results, tmp / "report.md")
    except _KeepPrevious as e:
        raise UsageError(f"the {kind.name} suite of {model_dir} was skipped ({e}); the finished results in {out} are "
                         f"kept unchanged") from None
    return results


def _run_label(model_dir: Path) -> str:
    """The run a model belongs to, as figures name it: the run folder (``tiny_clip`` for ``runs/tiny_clip/model``:
    the folder holding ``config.yaml``, else the one holding a ``model``, ``final`` or ``best`` folder), else the
    model folder."""
    model_dir = Path(model_dir).resolve()
    for d in (model_dir, *list(model_dir.parents)[:2]):
        if (d / "config.yaml").is_file():
            return d.name
    return model_dir.parent.name if model_dir.name in ("model", "final", "best") else model_dir.name


class _KeepPrevious(Exception):
    """An evaluation skipped its suite where finished results exist: nothing is written."""


def _check_output_dir(out: Path) -> dict | None:
    """The output folder may be absent, empty or a previous evaluation's (it is replaced as a whole); returns the
    previous results when they are finished (no suite skipped), else None."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output folder {str(out)!r} is a file")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    path = out / "results.json"
    if not path.is_file():
        raise UsageError(f"output folder {str(out)!r} holds other files and no results.json; the evaluation replaces "
                         f"its output folder as a whole, so give --out an empty folder or a previous evaluation's")
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None  # a damaged result is replaced
    return previous if isinstance(previous, dict) and not previous.get("skipped") else None


def __getattr__(name: str):
    """``EVAL_DATASETS`` (kind → the built-in datasets it is evaluated on, ``--dataset``) and ``KIND_NAMES`` (kind →
    how messages name it): views of :data:`~diffattn.eval.kinds.EVAL_KINDS`, read when asked; and the names that
    moved to :mod:`diffattn.eval.report`, :mod:`diffattn.eval.comparison`, :mod:`diffattn.eval.sampling` and
    :mod:`diffattn.eval.classification` (deprecated here)."""
    if name == "EVAL_DATASETS":
        return {k.name: k.datasets for k in EVAL_KINDS.values()}
    if name == "KIND_NAMES":
        return {k.name: k.label for k in EVAL_KINDS.values()}
    return _moved(name)


_moved = moved_attribute(__name__, {
    **{n: (lambda n=n: getattr(report, n)) for n in ("write_report", "summary_table", "headline_metrics",
                                                      "metric_label")},
    **{n: (lambda n=n: getattr(comparison, n)) for n in ("compare", "load_results", "flatten", "recorded_chance")},
    "stratified_subset": lambda: sampling.stratified_subset,
    "classification_chance": lambda: classification.classification_chance,
})
