"""Multi-query associative recall at two widths: standard vs Diff Transformer vs Diff Transformer V2 vs gated
differential attention (MQAR of Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", §3; the models of Ye et al. 2024 and 2026, M-DGSA 2025).

At each model width, four causal LMs of (near-)equal parameter count (:mod:`.synthetic`) are trained from scratch
with one recipe, seed and budget on generated MQAR samples (:func:`diffattn.data.synthetic.mqar_batch`: P
key–value pairs, then every key again, each to be completed with its value; P drawn per batch from ``pairs``), with
the loss on the queried values only. Measured on the same checkpoints: accuracy per (width, P) on ``samples`` fresh
samples per cell, and learning curves (the accuracy at the easiest setting, the smallest P, on a fixed set every
``eval_every`` steps) with the first step at which each model reaches the control level.

Controls, one per width: at each width the Transformer must reach ``control_accuracy`` at the easiest setting (the
smallest P) before any model of that width is compared with it; a width whose Transformer misses it shows means only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..data.synthetic import SyntheticVocab, mqar_batch
from . import claims
from .base import Study, StudyConfig
from .common import increasing_ints, minimum_errors, mqar_stream, vocab_errors
from .protocol import PROTOCOL_DEFAULTS, lr_text, protocol_errors
from .report import Control, Metric, check_control, run_seeds, warmup_text
from .stats import mean_std
from .synthetic import (
    DEFAULT_VARIANTS,
    MODELS,
    answer_accuracy,
    build_model,
    param_count,
    steps_to_control_lines,
    steps_to_control_tests,
    steps_to_reach,
    train_model,
)

__all__ = ["RecallStudy", "VARIANTS", "DEFAULTS", "control"]

#: variant → label (the first is the baseline)
VARIANTS: dict[str, str] = dict(MODELS)
#: the budget (diffattn/configs/studies/recall.yaml)
DEFAULTS: dict[str, Any] = {
    "steps": 600, "batch_size": 32, "lr": 1.0e-3, "weight_decay": 0.1, "warmup_steps": 50,
    "widths": [64, 128], "depth": 2, "num_heads": 4,
    "vocab": {"num_keys": 16, "num_values": 16, "num_filler": 1},
    "pairs": [2, 4, 8], "samples": 200, "eval_every": 50, "curve_samples": 100,
    "control_accuracy": 0.9, "threads": 1, **PROTOCOL_DEFAULTS,
}


def control(cfg: dict[str, Any]) -> list[Control]:
    """The positive controls, one per width, each gating only that width's tests: the baseline must reach
    ``control_accuracy`` with the fewest pairs (with 2 pairs, naming the value not yet given scores 75 % without
    matching any key)."""
    easiest = cfg["pairs"][0]
    return [Control(f"{VARIANTS[cfg['variants'][0]]} accuracy at width {w} with {easiest} pairs (%)",
                    f"w{w}.accuracy.P{easiest}", 100.0 * cfg["control_accuracy"], scale=100.0, gates=(f"w{w}",))
            for w in cfg["widths"]]


def _train_batches(cfg: dict[str, Any], vocab: SyntheticVocab, seed: int):
    """The training stream of a seed: P drawn uniformly from ``pairs`` per batch (:func:`~.common.mqar_stream`)."""
    return mqar_stream(cfg["pairs"], cfg["batch_size"], vocab, seed)


def _fmt(values: list[float], digits: int = 1) -> str:
    m, s = mean_std([100 * v for v in values])
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _sections(cfg: dict[str, Any], per_seed: dict[int, dict], labels: list[str]) -> list[str]:
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    easiest = cfg["pairs"][0]
    out = ["## Parameters", "", "| model | " + " | ".join(f"width {w}: parameters (SwiGLU width)"
                                                           for w in cfg["widths"]) + " |",
           "|---|" + "---:|" * len(cfg["widths"])]
    out += [f"| {lab} | " + " | ".join(f"{first[lab][f'w{w}']['params']:,} ({first[lab][f'w{w}']['mlp_hidden']})"
                                       for w in cfg["widths"]) + " |" for lab in labels]
    for w in cfg["widths"]:
        out += ["", f"## Learning curve at width {w}: accuracy (%) with {easiest} pairs on the fixed set "
                    f"({cfg['curve_samples']} samples), mean ± std over seeds", "",
                "| step | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
        steps = [int(s) for s, _ in first[labels[0]][f"w{w}"]["curve"]]
        for i, st in enumerate(steps):
            out.append(f"| {st} | " + " | ".join(_fmt([per_seed[s][lab][f"w{w}"]["curve"][i][1] for s in seeds])
                                                  for lab in labels) + " |")
        out += ["", f"Steps to reach the control level ({100 * cfg['control_accuracy']:g} % with {easiest} pairs; "
                    f"evaluated every {cfg['eval_every']} steps) at width {w}:", ""]
        out += steps_to_control_lines(
            {lab: [per_seed[s][lab][f"w{w}"]["steps_to_control"] for s in seeds] for lab in labels}, cfg["steps"])
        gate = next(c for c in control(cfg) if c.gates == (f"w{w}",))
        out += ["", *steps_to_control_tests(
            {lab: [per_seed[s][lab][f"w{w}"]["steps_to_control"] for s in seeds] for lab in labels},
            cfg["steps"], control_passed=check_control(per_seed, gate)["passed"])[0]]
    return out


class RecallStudy(Study, name="recall", variants=VARIANTS, default_variants=DEFAULT_VARIANTS, defaults=DEFAULTS,
                  title="Study: multi-query associative recall, standard vs differential attention", control=control):
    """The recall study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("steps", "batch_size", "depth", "num_heads", "samples", "eval_every",
                                      "curve_samples", "threads"), where)
        errors += minimum_errors(cfg, ("warmup_steps",), where, 0)
        widths = cfg["widths"]
        if not increasing_ints(widths):
            errors.append(f"widths in {where} must be a list of distinct integers >= 1 in increasing order, got "
                          f"{widths!r}")
        elif cfg["num_heads"] >= 1 and any(w % (2 * cfg["num_heads"]) for w in widths):
            errors.append(f"widths in {where} must be multiples of 2 · num_heads ({2 * cfg['num_heads']}: even head "
                          f"widths for the rotary embedding), got {widths!r}")
        if cfg["num_heads"] % 2:
            errors.append(f"num_heads in {where} must be even (the differential models pair heads), got "
                          f"{cfg['num_heads']}")
        vocab = cfg["vocab"]
        errors += vocab_errors(vocab, list(DEFAULTS["vocab"]), where)
        pairs = cfg["pairs"]
        if not increasing_ints(pairs):
            errors.append(f"pairs in {where} must be a list of distinct integers >= 1 in increasing order (the first "
                          f"is the control's setting), got {pairs!r}")
        elif isinstance(vocab.get("num_keys"), int) and max(pairs) > vocab["num_keys"]:
            errors.append(f"pairs in {where} must be <= vocab.num_keys ({vocab['num_keys']}: distinct keys), got "
                          f"{pairs!r}")
        if not 0 < cfg["control_accuracy"] <= 1:
            errors.append(f"control_accuracy in {where} must be in (0, 1], got {cfg['control_accuracy']!r}")
        return errors + protocol_errors(cfg, where)

    def tuning_parts(self, cfg: StudyConfig) -> list[tuple[str, dict[str, Any]]]:
        """Protocol (b) tunes each width apart: a model at another width is another model."""
        return [(f"w{w}", {"widths": [w]}) for w in cfg["widths"]]

    def tuning_score(self, cfg: StudyConfig, result: dict[str, Any]) -> tuple[float, float]:
        """The area under the learning curve (mean accuracy with the fewest pairs on the fixed set over the
        evaluations) and the final accuracy with the fewest pairs (the control's metric), at the one width of a
        tuning part (:meth:`tuning_parts`), as the recall ablation ranks its lrs."""
        (w,) = cfg["widths"]
        r = result[f"w{w}"]
        curve = [v for _, v in r["curve"]]
        return sum(curve) / len(curve), r["accuracy"][f"P{cfg['pairs'][0]}"]

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every variant at every width and seed (module docstring)."""
        torch.set_num_threads(cfg["threads"])
        vocab = SyntheticVocab(**cfg["vocab"])
        easiest = cfg["pairs"][0]

        def one_seed(seed: int, folder: Path) -> dict:
            g = torch.Generator().manual_seed(1_000_003 * (seed + 1))
            test = {p: mqar_batch(cfg["samples"], pairs=p, generator=g, vocab=vocab) for p in cfg["pairs"]}
            curve_set = mqar_batch(cfg["curve_samples"], pairs=easiest, generator=g, vocab=vocab)
            res: dict[str, dict] = {}
            for v in cfg["variants"]:
                label = VARIANTS[v]
                res[label] = {}
                for w in cfg["widths"]:
                    model = build_model(v, vocab_size=vocab.size, dim=w, depth=cfg["depth"],
                                        num_heads=cfg["num_heads"], max_seq_len=4 * max(cfg["pairs"]), seed=seed)
                    trained = train_model(model, _train_batches(cfg, vocab, seed), steps=cfg["steps"], lr=cfg["lr"],
                                          weight_decay=cfg["weight_decay"], warmup_steps=cfg["warmup_steps"],
                                          eval_every=cfg["eval_every"],
                                          evaluate=lambda m: answer_accuracy(m, curve_set).mean().item())
                    acc = {f"P{p}": answer_accuracy(model, b).mean().item() for p, b in test.items()}
                    res[label][f"w{w}"] = {"accuracy": acc, "mean_accuracy": sum(acc.values()) / len(acc),
                                           **trained,
                                           "steps_to_control": steps_to_reach(trained["curve"],
                                                                              cfg["control_accuracy"]),
                                           "params": param_count(model), "mlp_hidden": model.mlp_hidden}
                    if progress:
                        print(f"[study recall] seed {seed}: {label} width {w}: accuracy "
                              + ", ".join(f"{k} {100 * a:.1f} %" for k, a in acc.items())
                              + f"; {trained['train_seconds']:.0f} s training", flush=True)
            return res

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        vocab = SyntheticVocab(**cfg["vocab"])
        labels = [VARIANTS[v] for v in cfg["variants"]]
        intro = (f"Multi-query associative recall (Arora et al. 2023, MQAR) at widths {cfg['widths']}: four causal "
                 f"LMs of {cfg['depth']} layers and {cfg['num_heads']} (standard) heads per width, near-equal "
                 f"parameter counts (below), trained from scratch for {cfg['steps']} AdamW steps ({lr_text(cfg)}, "
                 f"{warmup_text(cfg['steps'], cfg['warmup_steps'])}) of {cfg['batch_size']} generated samples, loss "
                 f"on the queried "
                 f"values only; P key–value pairs drawn per batch from {cfg['pairs']} (4P tokens), {vocab.num_keys} "
                 f"keys, {vocab.num_values} values. Accuracy on {cfg['samples']} fresh samples per (width, P).")
        metrics = [Metric(f"accuracy, width {w}, {p} pairs (%)", f"w{w}.accuracy.P{p}", 100.0, 1)
                   for w in cfg["widths"] for p in cfg["pairs"]]
        metrics += [Metric(f"accuracy, width {w}, mean over P (%)", f"w{w}.mean_accuracy", 100.0, 1,
                           claim=claims.IN_CONTEXT_RECALL) for w in cfg["widths"]]
        return self.write_report(cfg, intro, per_seed, metrics, seconds, _sections(cfg, per_seed, labels))
