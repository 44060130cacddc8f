"""Multi-needle retrieval at CPU size: standard vs Diff Transformer vs Diff Transformer V2 vs gated differential
attention (Ye et al. 2024, "Differential Transformer", §3.4, Table 2, Table 3 and Fig. 3).

Four causal LMs of (near-)equal parameter count (:mod:`.synthetic`) are trained from scratch with one recipe, seed
and budget, with the loss on the answer tokens only, on one of two training tasks (``train_task``):

- ``"mqar"`` (the default): multi-query associative recall (:func:`diffattn.data.synthetic.mqar_batch`; Arora et al.
  2023), P key–value pairs then every key again, P drawn per batch from ``train_pairs``; the longest sequence,
  4 · max(``train_pairs``), is the trained length ``train_length``. The models never see a distractor, a needle
  marker or a query marker in training: the needles are a test of retrieval from a noisy context, the way Ye et al.
  evaluate language models that were never trained on needles;
- ``"needles"``: the needles themselves (:func:`diffattn.data.synthetic.needle_batch`), (N, R) drawn from
  ``train_needles`` / ``train_queried``, the length from ``train_lengths`` (the longest is ``train_length``), the
  needles anywhere.

Then the same checkpoints are measured on generated multi-needle samples (N key–value needles in a context of
random distractor tokens, R of them asked for at the end):

- accuracy per (N, R, depth of the first queried needle, context length), ``samples`` per cell, at the trained
  length and at ``length_factors`` times it (Table 2's grid, shrunk: N ∈ {1, 2, 4, 6}, R ∈ {1, 2, 2, 2}, depths
  0/25/50/75/100 %);
- attention allocation (Table 3): from the query position that predicts the first answer, the attention mass on
  the answer's value token in the context vs on the rest of the context, mean over samples, heads and layers
  (:func:`diffattn.diagnostics.answer_attention` on the maps :func:`diffattn.diagnostics.capture_attention`
  records; signed = the map the layer applies to V, w1 ⊙ A1 − λ ⊙ A2 for the differential layers, whose row sums
  to 1 − λ, so the primary is the share: |A| over its row's Σ|A|, on one scale for every kind);
- activation outliers (Table 5): top-1, top-10 and median of |S| over the attention logits S = Q Kᵀ/√d the softmax
  sees (both maps of the differential layers together, and each map apart) and of |h| over the blocks' hidden states,
  on the attention-allocation samples (:func:`diffattn.diagnostics.capture_logits`,
  :func:`diffattn.diagnostics.logit_stats`, :func:`diffattn.diagnostics.capture_hidden_states`);
- quantised attention logits (Fig. 8): the accuracy at the trained length again with every map computed from logits
  quantised per head with absmax scaling to ``quant_bits`` bits (:func:`diffattn.diagnostics.quantized_logits`);
- learning curves (Fig. 3's efficiency claim at this size): the accuracy on a fixed set at the trained length every
  ``eval_every`` steps, and the first step at which each model reaches the control level.

Control: the Transformer's mean needle accuracy at the trained length (over the (N, R) cells and depths) must reach
``control_accuracy`` before any model is compared with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..data.synthetic import SyntheticBatch, SyntheticVocab, needle_batch
from ..diagnostics import (
    answer_attention,
    capture_attention,
    capture_hidden_states,
    capture_logits,
    hidden_stats,
    logit_stats,
    quantized_logits,
)
from . import claims
from .base import Study, StudyConfig
from .common import minimum_errors, mqar_stream
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

__all__ = ["NeedlesStudy", "VARIANTS", "DEFAULTS", "control", "needle_grid", "grid_accuracy", "needle_allocation",
           "needle_outliers", "quantized_accuracy"]

#: variant → label (the first is the baseline)
VARIANTS: dict[str, str] = dict(MODELS)
#: the training tasks (module docstring)
TRAIN_TASKS = ("mqar", "needles")
#: the budget (diffattn/configs/studies/needles.yaml)
DEFAULTS: dict[str, Any] = {
    "steps": 600, "batch_size": 32, "lr": 1.0e-3, "weight_decay": 0.1, "warmup_steps": 50,
    "model": {"dim": 64, "depth": 2, "num_heads": 4},
    "vocab": {"num_keys": 16, "num_values": 16, "num_filler": 8},
    "train_task": "mqar", "train_pairs": [2, 4, 8],
    "train_length": 32, "train_lengths": [16, 24, 32], "train_needles": [1, 2, 4, 6], "train_queried": [1, 2, 2, 2],
    "needles": [1, 2, 4, 6], "queried": [1, 2, 2, 2], "depths": [0.0, 0.25, 0.5, 0.75, 1.0],
    "length_factors": [1, 2, 4], "samples": 50, "eval_every": 60, "curve_samples": 50, "attention_samples": 10,
    "quant_bits": [8, 6, 4], "control_accuracy": 0.8, "threads": 1, **PROTOCOL_DEFAULTS,
}


def control(cfg: dict[str, Any]) -> Control:
    """The positive control: the baseline's mean accuracy at the trained length over the (N, R) cells and depths
    must reach ``control_accuracy`` (naming some needle's value without matching the key scores 1/N per answer)."""
    label = VARIANTS[cfg["variants"][0]]
    return Control(f"{label} accuracy at the trained length ({cfg['train_length']} tokens), mean over the (N, R) "
                   f"cells and depths (%)", "accuracy.x1", 100.0 * cfg["control_accuracy"], scale=100.0)


def _cell(n: int, r: int) -> str:
    return f"N{n}R{r}"


def _depth(d: float) -> str:
    return f"d{round(100 * d)}"


def needle_grid(cfg: dict[str, Any], vocab: SyntheticVocab,
                seed: int) -> dict[str, dict[str, dict[str, SyntheticBatch]]]:
    """The evaluation samples: length key ("x1", "x2", …) → cell ("N4R2") → depth ("d50") → ``samples`` samples,
    drawn from ``seed`` (the same for every model of a seed)."""
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1))
    return {f"x{f}": {_cell(n, r): {_depth(d): needle_batch(cfg["samples"], length=f * cfg["train_length"], needles=n,
                                                            queried=r, depth=d, generator=g, vocab=vocab)
                                    for d in cfg["depths"]}
                      for n, r in zip(cfg["needles"], cfg["queried"])}
            for f in cfg["length_factors"]}


def grid_accuracy(model: torch.nn.Module, grid: dict) -> dict[str, Any]:
    """``{"grid": length → cell → depth → accuracy, "accuracy": length → mean, "cells": cell → mean at the trained
    length}``."""
    acc = {lk: {ck: {dk: answer_accuracy(model, b).mean().item() for dk, b in cell.items()}
                for ck, cell in cells.items()} for lk, cells in grid.items()}

    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs)

    first = next(iter(acc))
    return {"grid": acc, "accuracy": {lk: mean(v for c in cells.values() for v in c.values())
                                      for lk, cells in acc.items()},
            "cells": {ck: mean(c.values()) for ck, c in acc[first].items()}}


@torch.no_grad()
def needle_allocation(model: torch.nn.Module, batches: list[SyntheticBatch]) -> dict[str, float]:
    """Attention mass (Ye et al. 2024, Table 3) from the position that predicts the first answer onto the answer's
    value token in the context vs onto the rest of the context, mean over ``batches`` (each weighted by its size),
    heads and layers; ``signed`` (the map applied to V), ``abs`` (|map|) and ``share`` (|map| over its row's sum,
    :func:`~diffattn.diagnostics.noise.transform`: the comparable one, since a differential row's signed sum is
    1 − λ, not 1)."""
    model.eval()
    sums = {f"{part}_{mode}": 0.0 for mode in ("signed", "abs", "share") for part in ("answer", "noise")}
    total = 0
    for b in batches:
        B, L = b.ids.shape
        with capture_attention(model) as cap:
            model(b.ids)  # (B, L, V)
        maps = cap.combined()  # per layer (B, heads, L, L)
        pos = torch.arange(L)
        context = (pos < b.context).expand(B, L)  # (B, L)
        answer = pos[None] == b.answer_span[:, :1]  # (B, L)
        for mode in ("signed", "abs", "share"):
            r = answer_attention(maps, answer, context, query=int(b.answer_pos[0, 0]), mode=mode)
            sums[f"answer_{mode}"] += r["answer"] * B
            sums[f"noise_{mode}"] += r["noise"] * B
        total += B
    return {k: v / total for k, v in sums.items()}


@torch.no_grad()
def needle_outliers(model: torch.nn.Module, batches: list[SyntheticBatch]) -> dict[str, dict[str, float]]:
    """Activation outliers (Ye et al. 2024, §3.8, Table 5) over ``batches``: ``{"logits": {"top1", "top10",
    "median"}, "logits_A1": …, "logits_A2": … (the differential maps apart; "logits_A" for standard attention),
    "hidden": {…}}``, the |attention logits| the softmax sees and the |hidden states| of every block."""
    model.eval()
    with capture_logits(model) as cap, capture_hidden_states(model) as hs:
        for b in batches:
            model(b.ids)  # (B, L, V)
    stats = logit_stats(cap, per_map=True)
    keep = ("top1", "top10", "median")
    out = {"logits": {k: stats[k] for k in keep}}
    out.update({f"logits_{name}": {k: v[k] for k in keep} for name, v in stats["per_map"].items()})
    h = hidden_stats(hs)
    out["hidden"] = {k: h[k] for k in keep}
    return out


def quantized_accuracy(model: torch.nn.Module, cells: dict[str, dict[str, SyntheticBatch]],
                       bits_list: list[int]) -> dict[str, float]:
    """``{"b8": accuracy, …}``: the mean accuracy over ``cells`` (cell → depth → samples) with the attention logits
    quantised to each number of bits (Ye et al. 2024, §3.8, Fig. 8; :func:`diffattn.diagnostics.quantized_logits`)."""
    out = {}
    for bits in bits_list:
        with quantized_logits(model, bits):
            accs = [answer_accuracy(model, b).mean().item() for c in cells.values() for b in c.values()]
        out[f"b{bits}"] = sum(accs) / len(accs)
    return out


def _train_batches(cfg: dict[str, Any], vocab: SyntheticVocab, seed: int):
    """The training stream of a seed (module docstring): ``"mqar"``: P drawn uniformly from ``train_pairs`` per
    batch; ``"needles"``: (N, R) drawn uniformly from the training pairs, then the length from the
    ``train_lengths`` that hold N needles and R queries, the needles anywhere."""
    if cfg["train_task"] == "mqar":
        return mqar_stream(cfg["train_pairs"], cfg["batch_size"], vocab, seed)
    return _needle_stream(cfg, vocab, seed)


def _needle_stream(cfg: dict[str, Any], vocab: SyntheticVocab, seed: int):
    g = torch.Generator().manual_seed(seed)
    pairs = list(zip(cfg["train_needles"], cfg["train_queried"]))
    while True:
        n, r = pairs[int(torch.randint(len(pairs), (1,), generator=g))]
        lengths = [x for x in cfg["train_lengths"] if x >= 3 * (n + r)]
        length = lengths[int(torch.randint(len(lengths), (1,), generator=g))]
        yield needle_batch(cfg["batch_size"], length=length, needles=n, queried=r, depth=None, generator=g,
                           vocab=vocab)


def _fmt(values: list[float], digits: int = 1, scale: float = 100.0) -> str:
    m, s = mean_std([v * scale for v in values])
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _sections(cfg: dict[str, Any], per_seed: dict[int, dict], labels: list[str]) -> list[str]:
    seeds = list(per_seed)
    level = cfg["control_accuracy"]
    out = ["## Parameters", "", "| model | parameters | SwiGLU width |", "|---|---:|---:|"]
    first = per_seed[seeds[0]]
    out += [f"| {lab} | {first[lab]['params']:,} | {first[lab]['mlp_hidden']} |" for lab in labels]
    out += ["", f"## Learning curves: accuracy (%) on the fixed set at the trained length ({cfg['curve_samples']} "
                f"samples per (N, R), random depth), mean ± std over seeds", "",
            "| step | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    steps = [int(s) for s, _ in first[labels[0]]["curve"]]
    for i, st in enumerate(steps):
        out.append(f"| {st} | " + " | ".join(_fmt([per_seed[s][lab]["curve"][i][1] for s in seeds])
                                              for lab in labels) + " |")
    out += ["", f"Steps to reach the control level ({100 * level:g} % on this set; evaluated every "
                f"{cfg['eval_every']} steps):", ""]
    out += steps_to_control_lines({lab: [per_seed[s][lab]["steps_to_control"] for s in seeds] for lab in labels},
                                  cfg["steps"])
    out += ["", *steps_to_control_tests(
        {lab: [per_seed[s][lab]["steps_to_control"] for s in seeds] for lab in labels}, cfg["steps"],
        control_passed=check_control(per_seed, control(cfg))["passed"])[0]]
    out += ["", "## Attention-logit outliers per map: |S| (mean ± std over seeds; A: standard attention's map, "
                "A1 / A2: the two maps of a differential layer)", "",
            "| model | map | top-1 | top-10 | median |", "|---|---|---:|---:|---:|"]
    for lab in labels:
        for key in sorted(k for k in first[lab]["outliers"] if k.startswith("logits_")):
            out.append(f"| {lab} | {key[7:]} | " + " | ".join(
                _fmt([per_seed[s][lab]["outliers"][key][st] for s in seeds], 3, 1.0)
                for st in ("top1", "top10", "median")) + " |")
    out += ["", "## Accuracy (%) per cell: (context length, N needles / R queried) × depth of the first queried "
                "needle, mean ± std over seeds", ""]
    grid0 = first[labels[0]]["grid"]
    depths = list(next(iter(next(iter(grid0.values())).values())))
    for lab in labels:
        out += [f"### {lab}", "", "| length | cell | " + " | ".join(depths) + " |",
                "|---:|---|" + "---:|" * len(depths)]
        for lk, cells in grid0.items():
            length = int(lk[1:]) * cfg["train_length"]
            for ck in cells:
                out.append(f"| {length} | {ck} | " + " | ".join(
                    _fmt([per_seed[s][lab]["grid"][lk][ck][dk] for s in seeds], 0) for dk in depths) + " |")
        out.append("")
    return out


def _training(cfg: dict[str, Any]) -> str:
    if cfg["train_task"] == "mqar":
        return (f"trained on multi-query associative recall (Arora et al. 2023) with P drawn from "
                f"{cfg['train_pairs']} pairs per batch ({4 * min(cfg['train_pairs'])}–{cfg['train_length']} tokens): "
                f"no distractor, needle or query marker is seen in training")
    return (f"trained on needles of {cfg['train_lengths']} tokens (one length per batch), (N needles, R queried) "
            f"drawn from {[_cell(n, r) for n, r in zip(cfg['train_needles'], cfg['train_queried'])]}")


class NeedlesStudy(Study, name="needles", title="Study: multi-needle retrieval, standard vs differential attention",
                   variants=VARIANTS, default_variants=DEFAULT_VARIANTS, defaults=DEFAULTS, control=control):
    """The needles study (module docstring)."""

    def endpoint_values(self, results: Mapping[str, Any], key: str, variant: str) -> list[float | None]:
        """``steps_to_control`` (None: never reached) or ``<group>.<part>`` (e.g. ``accuracy.x1``, in points) of
        ``variant`` per seed, read from ``per_seed`` under the variant's label."""
        per_seed = self.seed_results(results, variant)
        if key == "steps_to_control":
            return [r["steps_to_control"] for r in per_seed]
        group, _, part = key.partition(".")
        return [100.0 * r[group][part] for r in per_seed]

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("steps", "batch_size"), where)
        errors += minimum_errors(cfg, ("warmup_steps",), where, 0)
        errors += minimum_errors(cfg, ("train_length", "samples", "eval_every", "curve_samples", "attention_samples",
                                       "threads"), where)
        task = cfg["train_task"]
        if task not in TRAIN_TASKS:
            errors.append(f"train_task in {where} must be one of {list(TRAIN_TASKS)}, got {task!r}")
        train_pairs = cfg["train_pairs"]
        if task == "mqar":
            if not train_pairs or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in train_pairs):
                errors.append(f"train_pairs in {where} must be a non-empty list of integers >= 1, got {train_pairs!r}")
            elif 4 * max(train_pairs) != cfg["train_length"]:
                errors.append(f"train_length in {where} must be the longest MQAR sequence, 4 · max train_pairs = "
                              f"{4 * max(train_pairs)}, got {cfg['train_length']}")
            elif max(train_pairs) > cfg["vocab"].get("num_keys", 0):
                errors.append(f"train_pairs in {where} must be <= vocab.num_keys ({cfg['vocab'].get('num_keys')}: the "
                              f"keys of a sample are distinct), got {train_pairs!r}")
        lengths = cfg["train_lengths"]
        if task == "needles" and (not lengths or any(isinstance(x, bool) or not isinstance(x, int) or x < 1
                                                     for x in lengths) or max(lengths) != cfg["train_length"]):
            errors.append(f"train_lengths in {where} must be a list of integers >= 1 whose largest is train_length "
                          f"({cfg['train_length']}), got {lengths!r}")
        checked = (("needles", "queried"), ("train_needles", "train_queried")) if task == "needles" else \
            (("needles", "queried"),)
        for a, b in checked:
            needles, queried = cfg[a], cfg[b]
            if not needles or len(needles) != len(queried) or \
                    not all(isinstance(x, int) and x >= 1 for x in needles + queried) or \
                    any(r > n for n, r in zip(needles, queried)):
                errors.append(f"{a} and {b} in {where} must be lists of the same length of integers >= 1 with "
                              f"{b}[i] <= {a}[i], got {needles!r} and {queried!r}")
            elif 3 * (max(needles) + max(queried)) > cfg["train_length"]:
                errors.append(f"train_length in {where} must be >= 3 · (max {a} + max {b}) = "
                              f"{3 * (max(needles) + max(queried))}, got {cfg['train_length']}")
            elif max(needles) > cfg["vocab"].get("num_keys", 0):
                errors.append(f"{a} in {where} must be <= vocab.num_keys ({cfg['vocab'].get('num_keys')}: the keys "
                              f"of a sample are distinct), got {needles!r}")
        if not cfg["depths"] or any(isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1
                                    for d in cfg["depths"]):
            errors.append(f"depths in {where} must be a non-empty list of numbers in [0, 1], got {cfg['depths']!r}")
        if not cfg["length_factors"] or cfg["length_factors"][0] != 1 or \
                any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in cfg["length_factors"]):
            errors.append(f"length_factors in {where} must be a list of integers >= 1 starting with 1 (the trained "
                          f"length), got {cfg['length_factors']!r}")
        if any(isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= 16 for b in cfg["quant_bits"]):
            errors.append(f"quant_bits in {where} must be a list of integers in [2, 16], got {cfg['quant_bits']!r}")
        if not 0 < cfg["control_accuracy"] <= 1:
            errors.append(f"control_accuracy in {where} must be in (0, 1], got {cfg['control_accuracy']!r}")
        for key in ("model", "vocab"):
            if set(cfg[key]) != set(DEFAULTS[key]) or not all(isinstance(v, int) and v >= 1 for v in cfg[key].values()):
                errors.append(f"{key} in {where} must map exactly {sorted(DEFAULTS[key])} to integers >= 1, got "
                              f"{cfg[key]!r}")
        errors += protocol_errors(cfg, where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every variant at every seed, aggregated (module docstring)."""
        torch.set_num_threads(cfg["threads"])
        vocab = SyntheticVocab(**cfg["vocab"])
        pairs = list(zip(cfg["needles"], cfg["queried"]))
        max_len = cfg["train_length"] * max(cfg["length_factors"])

        def one_seed(seed: int, folder: Path) -> dict:
            grid = needle_grid(cfg, vocab, seed)
            g = torch.Generator().manual_seed(2_000_003 * (seed + 1))
            curve_set = [needle_batch(cfg["curve_samples"], length=cfg["train_length"], needles=n, queried=r,
                                      depth=None, generator=g, vocab=vocab) for n, r in pairs]
            attn_set = [needle_batch(cfg["attention_samples"], length=cfg["train_length"], needles=n, queried=r,
                                     depth=d, generator=g, vocab=vocab) for n, r in pairs for d in cfg["depths"]]

            def curve_accuracy(model) -> float:
                return sum(answer_accuracy(model, b).mean().item() for b in curve_set) / len(curve_set)

            res = {}
            for v in cfg["variants"]:
                label = VARIANTS[v]
                model = build_model(v, vocab_size=vocab.size, max_seq_len=max_len, seed=seed, **cfg["model"])
                trained = train_model(model, _train_batches(cfg, vocab, seed), steps=cfg["steps"], lr=cfg["lr"],
                                      weight_decay=cfg["weight_decay"], warmup_steps=cfg["warmup_steps"],
                                      eval_every=cfg["eval_every"], evaluate=curve_accuracy)
                model.eval()
                r = {**grid_accuracy(model, grid), "attention": needle_allocation(model, attn_set),
                     "outliers": needle_outliers(model, attn_set),
                     "quantized": quantized_accuracy(model, grid["x1"], cfg["quant_bits"]), **trained,
                     "steps_to_control": steps_to_reach(trained["curve"], cfg["control_accuracy"]),
                     "params": param_count(model), "mlp_hidden": model.mlp_hidden}
                res[label] = r
                if progress:
                    acc = ", ".join(f"{k} {100 * a:.1f} %" for k, a in r["accuracy"].items())
                    print(f"[study needles] seed {seed}: {label}: accuracy {acc}; answer/context share "
                          f"{r['attention']['answer_share']:.3f}/{r['attention']['noise_share']:.3f}; "
                          f"{trained['train_seconds']:.0f} s training", flush=True)
            return res

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        vocab = SyntheticVocab(**cfg["vocab"])
        pairs = list(zip(cfg["needles"], cfg["queried"]))
        labels = [VARIANTS[v] for v in cfg["variants"]]
        m = cfg["model"]
        intro = (f"Multi-needle retrieval (Ye et al. 2024, §3.4, Tables 2–3, Fig. 3) at CPU size: four causal LMs "
                 f"of {m['depth']} layers, width {m['dim']}, {m['num_heads']} (standard) heads, near-equal parameter "
                 f"counts (below), trained from scratch for {cfg['steps']} AdamW steps ({lr_text(cfg)}, "
                 f"{warmup_text(cfg['steps'], cfg['warmup_steps'])}) of {cfg['batch_size']} generated samples, loss on "
                 f"the answer tokens only, {_training(cfg)}; vocabulary {vocab.size} tokens ({vocab.num_keys} keys, "
                 f"{vocab.num_values} values, {vocab.num_filler} distractors). Evaluated on {cfg['samples']} samples "
                 f"per (N, R, depth {cfg['depths']}) cell at "
                 f"{[f * cfg['train_length'] for f in cfg['length_factors']]} tokens. Attention mass from the position "
                 f"that predicts the first answer: share = |A| over its row's Σ|A| (primary: rows on one scale for "
                 f"every kind), signed = the map applied to V, mean over {cfg['attention_samples']} "
                 f"samples per (N, R, depth) cell at the trained length, heads and layers. Outliers: |S| over the "
                 f"attention logits the softmax sees (both maps of a differential layer) and |h| over the blocks' "
                 f"outputs on those samples. Quantised: every map from logits quantised per head (absmax) to "
                 f"{cfg['quant_bits']} bits, the accuracy at the trained length.")
        metrics = [Metric(f"accuracy at {cfg['train_length']} tokens (trained), mean over cells (%)", "accuracy.x1",
                          100.0, 1, claim=claims.MULTI_NEEDLE)]
        metrics += [Metric(f"accuracy {_cell(n, r)} at {cfg['train_length']} tokens (%)", f"cells.{_cell(n, r)}",
                           100.0, 1) for n, r in pairs]
        metrics += [Metric(f"accuracy at {f * cfg['train_length']} tokens ({f}× trained) (%)", f"accuracy.x{f}",
                           100.0, 1) for f in cfg["length_factors"][1:]]
        metrics += [Metric("answer attention share (|A| over its row)", "attention.answer_share", 1.0, 3,
                           claim=claims.ANSWER_MASS),
                    Metric("context attention share outside the answer (|A| over its row)", "attention.noise_share",
                           1.0, 3, False, claim=claims.CONTEXT_MASS),
                    Metric("answer attention mass (signed)", "attention.answer_signed", 1.0, 3),
                    Metric("context attention mass outside the answer (signed)", "attention.noise_signed", 1.0, 3,
                           False),
                    Metric("attention logits |S|: top-1", "outliers.logits.top1", 1.0, 2, None,
                           claim=claims.LOGIT_OUTLIERS),
                    Metric("attention logits |S|: top-10", "outliers.logits.top10", 1.0, 2, None),
                    Metric("attention logits |S|: median", "outliers.logits.median", 1.0, 3, None),
                    Metric("hidden states |h|: top-1", "outliers.hidden.top1", 1.0, 2, None,
                           claim=claims.HIDDEN_OUTLIERS),
                    Metric("hidden states |h|: top-10", "outliers.hidden.top10", 1.0, 2, None),
                    Metric("hidden states |h|: median", "outliers.hidden.median", 1.0, 3, None)]
        metrics += [Metric(f"accuracy at {cfg['train_length']} tokens, logits quantised to {b} bits (%)",
                           f"quantized.b{b}", 100.0, 1) for b in cfg["quant_bits"]]
        metrics += [Metric("final train loss (answer tokens)", "final_loss", 1.0, 3, False)]
        return self.write_report(cfg, intro, per_seed, metrics, seconds, _sections(cfg, per_seed, labels))

    def tuning_score(self, cfg: StudyConfig, result: Mapping[str, Any]) -> tuple[float, float]:
        """Protocol (b)'s ranking of one run (:func:`.protocol.select_lr`): the area under its learning curve (the mean
        accuracy on the fixed needle set at the trained length over the evaluations) and its final accuracy at the
        trained length (the control's metric)."""
        curve = [v for _, v in result["curve"]]
        return sum(curve) / len(curve), result["accuracy"]["x1"]

