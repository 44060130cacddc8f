"""The two training protocols a study reports, and the plumbing of protocol (b).

- **(a) shared recipe**: every model is trained with the study's one recipe (``lr``, ``warmup_steps``), which was
  chosen on the baseline (the Transformer) only. It favours the baseline: a differential model whose best lr differs
  from the Transformer's is compared away from its best.
- **(b) tuned per model**: for every model (and every part a study tunes apart, e.g. each width of the recall
  study) a sweep over the pre-registered grid ``lrs`` (times ``warmups`` when given, else the recipe's warm-up) on
  ``tuning_seeds`` that are never reported; the pre-registered rule :func:`select_lr` picks that model's lr; then
  every model is trained at its own lr on the reported ``seeds`` (disjoint from the tuning seeds) and compared
  exactly as under (a): same budget, metrics, control and tests.

A study takes part through three keys in its budget (:data:`PROTOCOL_DEFAULTS`, checked by :func:`protocol_errors`)
and :meth:`~diffattn.studies.base.Study.tuning_score` (what the rule ranks: the area under a learning curve and a
final metric, both higher-is-better); ``diffattn study NAME --protocol b`` (or ``--set protocol=b``) runs (b) through
:func:`run_protocol_b`, which calls the study's own ``run`` once per (model, part, grid point) and once per
(model, part) for the reported seeds, and writes everything under ``<out>/protocol_b/``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["PROTOCOLS", "PROTOCOL_DEFAULTS", "protocol_errors", "tuning_errors", "select_lr", "protocol_text",
           "lr_text", "run_protocol_b"]

#: protocol → how a report names it
PROTOCOLS: dict[str, str] = {
    "a": "(a) shared recipe, tuned on the baseline only (favours the baseline)",
    "b": "(b) lr tuned per model",
}
#: the budget keys of a study that runs both protocols: ``protocol`` ("a" or "b"), the lr grid ``lrs``, the warm-up
#: grid ``warmups`` (empty: the recipe's ``warmup_steps`` only) and the ``tuning_seeds`` (never reported)
PROTOCOL_DEFAULTS: dict[str, Any] = {"protocol": "a", "lrs": [], "warmups": [], "tuning_seeds": []}


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def tuning_errors(cfg: Mapping[str, Any], where: str) -> list[str]:
    """The lr grid ``lrs`` and the ``tuning_seeds`` of ``cfg``: each non-empty, distinct, and no tuning seed a
    reported seed (one message per broken constraint, naming the key and ``where``)."""
    errors = []
    lrs = cfg["lrs"]
    if not lrs or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf
                          for x in lrs) or len(set(lrs)) != len(lrs):
        errors.append(f"lrs in {where} must be a list of distinct numbers > 0, got {lrs!r}")
    tune = cfg["tuning_seeds"]
    if not tune or not all(_int(s) and s >= 0 for s in tune) or len(set(tune)) != len(tune) or \
            set(tune) & set(cfg["seeds"]):
        errors.append(f"tuning_seeds in {where} must be distinct integers >= 0 none of which is a reported seed "
                      f"({cfg['seeds']}), got {tune!r}")
    return errors


def protocol_errors(cfg: Mapping[str, Any], where: str) -> list[str]:
    """The protocol keys of a study (:data:`PROTOCOL_DEFAULTS`): ``protocol`` is "a" or "b"; under (b), or
    whenever they are given, :func:`tuning_errors`; ``warmups`` distinct integers >= 0 (only for a study with
    ``warmup_steps``)."""
    errors = []
    if cfg["protocol"] not in PROTOCOLS:
        errors.append(f"protocol in {where} must be one of {list(PROTOCOLS)} ((a) shared recipe, (b) lr tuned per "
                      f"model), got {cfg['protocol']!r}")
    if cfg["protocol"] == "b" or cfg["lrs"] or cfg["tuning_seeds"]:
        errors += tuning_errors(cfg, where)
    warm = cfg["warmups"]
    if warm and ("warmup_steps" not in cfg or not all(_int(w) and w >= 0 for w in warm) or
                 len(set(warm)) != len(warm)):
        errors.append(f"warmups in {where} must be distinct integers >= 0 (a study with warmup_steps), got "
                      f"{warm!r}")
    return errors


def select_lr(tuning: Mapping[Any, list], score: Callable[[Any], tuple[float, float]] | None = None) -> Any:
    """The pre-registered rule: the grid point (an lr, or an (lr, warm-up) pair) whose runs on the tuning seeds have
    the highest mean area under the learning curve; ties (within 1e-9) go to the higher mean final metric, then to
    the smaller lr (then the shorter warm-up). ``tuning``: grid point → per-seed runs; ``score(run)`` → (area, final
    metric), both higher-is-better (default: a run's ``"auc"`` and ``"accuracy"``)."""
    score = score or (lambda r: (r["auc"], r["accuracy"]))

    def key(point):
        s = [score(r) for r in tuning[point]]
        return (round(sum(a for a, _ in s) / len(s), 9), round(sum(b for _, b in s) / len(s), 9))

    return max(sorted(tuning), key=key)  # max keeps the first of equal keys: the smallest grid point


def _lr_list(cfg: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{x:g}" for x in cfg["lrs"]) + "}"


def protocol_text(cfg: Mapping[str, Any], baseline: str = "baseline") -> str:
    """The sentence of a report that names its protocol: (a) for a study without the protocol keys (every model
    trained with the one recipe whose budget was chosen so that the ``baseline``, e.g. "Transformer", passes its
    control)."""
    if cfg.get("protocol", "a") != "b":
        lr = f" (lr {cfg['lr']:g})" if isinstance(cfg.get("lr"), (int, float)) else ""
        return (f"Protocol: {PROTOCOLS['a'].replace('the baseline only', f'the {baseline} only')}{lr}: one recipe "
                f"for every model, chosen on the {baseline} only, so it favours the {baseline}.")
    chosen, tuning = cfg.get("chosen_lr") or {}, cfg.get("tuning") or {}

    def sweep(model: str, part: str) -> str:
        runs = tuning.get(model, {}).get(part, {})
        return ", ".join(f"{point[2:]}: {sum(r['auc'] for r in rs) / len(rs):.4g}" for point, rs in runs.items())

    picks = "; ".join(f"{model}{f' {part}' if part else ''}: lr {c['lr']:g}"
                      + (f", warm-up {c['warmup']}" if cfg["warmups"] else "")
                      + (f" (tuning score per lr {sweep(model, part)})" if sweep(model, part) else "")
                      for model, parts in chosen.items() for part, c in parts.items())
    warm = f" × warm-up {cfg['warmups']}" if cfg["warmups"] else ""
    return (f"Protocol: {PROTOCOLS['b']}, on tuning seeds {list(cfg['tuning_seeds'])} (never reported) from lr "
            f"{_lr_list(cfg)}{warm}, by the pre-registered rule (highest mean area under the learning curve, ties: "
            f"the final metric, then the smaller lr); reported seeds {list(cfg['seeds'])}. Chosen: {picks}.")


def lr_text(cfg: Mapping[str, Any]) -> str:
    """How a study's intro states its lr: "lr 0.001" (protocol (a)) or "lr tuned per model, protocol (b)"."""
    if cfg.get("protocol") == "b":
        return f"lr tuned per model from {_lr_list(cfg)}, protocol (b)"
    return f"lr {cfg['lr']:g}"


def run_protocol_b(study, cfg, progress: bool = True) -> dict[str, Any]:
    """Protocol (b) of ``study`` (module docstring) with the checked config ``cfg``: per model, in the config's
    order, and per part (:meth:`~diffattn.studies.base.Study.tuning_parts`), the grid on the tuning seeds under
    ``<out>/protocol_b/tuning/<model>[/<part>]/lr<lr>[_w<warm-up>]/``, the selection (:func:`select_lr` on
    :meth:`~diffattn.studies.base.Study.tuning_score`), then the reported seeds at the chosen lr under
    ``<out>/protocol_b/<model>[/<part>]/`` — each model tuned and reported before the next, so a cut run keeps the
    finished models whole (every run is saved by the study's own ``run`` and read back by a rerun). Then the study's
    own :meth:`~diffattn.studies.base.Study.report` of the merged seeds, into ``<out>/protocol_b/``."""
    out = Path(cfg["out"]) / "protocol_b"
    warmups = list(cfg["warmups"])
    grid = [(lr, w) for lr in cfg["lrs"] for w in (warmups or [None])]
    parts = study.tuning_parts(cfg)
    t0 = time.perf_counter()
    merged: dict[int, dict[str, dict]] = {s: {} for s in cfg["seeds"]}
    chosen: dict[str, dict[str, dict]] = {}
    tuning: dict[str, dict[str, dict]] = {}

    def sub(variant: str, lr: float, warm: int | None, seeds: list[int], folder: Path, over: Mapping):
        changes = {"protocol": "a", "variants": [variant], "seeds": list(seeds), "lr": lr, "out": str(folder),
                   **over}
        if warm is not None:
            changes["warmup_steps"] = warm
        return cfg.replace(**changes)

    for v in cfg["variants"]:
        label = study.label(v)
        chosen[label], tuning[label] = {}, {}
        for part, over in parts:
            base = out / "tuning" / v / part if part else out / "tuning" / v
            sweep: dict[tuple, list] = {}
            for lr, w in grid:
                c = sub(v, lr, w, cfg["tuning_seeds"], base / (f"lr{lr:g}" + (f"_w{w}" if w is not None else "")),
                        over)
                res = study.run(c, progress)
                sweep[(lr, -1 if w is None else w)] = [study.tuning_score(c, res[s][label]) for s in c["seeds"]]
            lr, w = select_lr(sweep, score=lambda t: t)
            chosen[label][part] = {"lr": lr, "warmup": cfg.get("warmup_steps") if w == -1 else w}
            tuning[label][part] = {f"lr{p[0]:g}" + (f"_w{p[1]}" if p[1] != -1 else ""):
                                   [{"auc": a, "final": b} for a, b in runs] for p, runs in sweep.items()}
            if progress:
                print(f"[study {cfg['study']}] protocol (b): {label}{f' {part}' if part else ''}: lr {lr:g} chosen "
                      f"from " + ", ".join(f"{p[0]:g}: {sum(a for a, _ in r) / len(r):.4f}" for p, r in sweep.items())
                      + " (mean area under the learning curve on the tuning seeds)", flush=True)
            folder = out / v / part if part else out / v
            res = study.run(sub(v, lr, None if w == -1 else w, cfg["seeds"], folder, over), progress)
            for s in cfg["seeds"]:
                merged[s][label] = {**merged[s].get(label, {}), **res[s][label]}
    final = cfg.replace(out=str(out), chosen_lr=chosen, tuning=tuning)
    return study.report(final, merged, time.perf_counter() - t0)
