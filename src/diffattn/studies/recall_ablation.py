"""Why the Diff Transformer does not learn multi-query associative recall: a pre-registered one-factor-at-a-time
ablation around the models of :mod:`.recall` (same task, generator, training and evaluation code: :mod:`.synthetic`,
:func:`.common.mqar_stream`).

In the recall study the Diff Transformer (V1) stays at the no-recall level (about 75 % with 2 pairs) on every seed
at widths 64 and 128, under one recipe tuned on the Transformer only. Four confounds are varied one at a time,
each against its reference level (``comparisons``):

- the number of differential heads: 4, 8, 16 standard heads (2, 4, 8 differential heads), with the Transformer at
  the same head counts (the gap V1 − Transformer at matching heads), and a 2-head Transformer (``standard_h2``:
  as many heads, of the same width 2d, as V1's 2 differential heads);
- the per-head sub-norm: V1 without it, Diff Transformer V2 (Ye et al. 2026) with it;
- λ_init of V1: the constants 0, 0.2, 0.5, 0.8 against ``"ye"`` (0.8 − 0.6·exp(−0.3·l));
- the initial gate bias b_g of gated differential attention (M-DGSA 2025): +2 (g = σ(2) ≈ 0.88 at the start)
  against 0 (g = 0.5, where g·A⁺ − (1 − g)·A⁻ sums to zero over a row). Every model family's ``init_weights``
  zeroes the biases, so the study sets b_g after the model is built.

Protocol (b) of :mod:`.protocol`: per (variant, width) a learning-rate sweep (``lrs``) on ``tuning_seeds`` that are
never reported; the lr with the highest mean area under the learning curve on those seeds is kept
(:func:`.protocol.select_lr`; ties: the higher final accuracy with the fewest pairs, then the smaller lr); then every
variant is trained at its own lr on the reported ``seeds``.
Metrics per run: the final accuracy with the fewest pairs on ``samples`` fresh samples, and the area under the
learning curve (the mean of the accuracy with the fewest pairs on a fixed set, measured every ``eval_every``
steps). Analysis: for each comparison (level, reference) and metric, the paired difference over the reported seeds
(:func:`.stats.paired_test`: mean, 95 % interval), Holm-adjusted over every test of the table. Control, one per
width: the Transformer with the base head count (the first variant) must reach ``control_accuracy`` with the
fewest pairs, as in :mod:`.recall`; a width whose control fails shows means only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..data.synthetic import SyntheticVocab, mqar_batch
from ..io import atomic_write_file
from ..layers import GatedDiffAttention
from .base import Study, StudyConfig
from .claims import SUBNORM_HELPS
from .common import increasing_ints, minimum_errors, mqar_stream, vocab_errors
from .protocol import PROTOCOLS, select_lr, tuning_errors
from .provenance import registration_status
from .report import Control, check_control, control_table
from .stats import holm, mean_std, paired_test
from .synthetic import answer_accuracy, build_model, param_count, train_model
from .verdict import verdict_of_test

__all__ = ["RecallAblationStudy", "VARIANTS", "DEFAULTS", "control", "variant_model", "variant_settings", "run_one",
           "select_lr"]

#: a setting that is a quarter of the model width (the Transformer's head width d = D / 4): resolved per width
_QUARTER = "D/4"

#: variant → (label, kind, query heads, the settings that update the recall study's spec of the kind
#: (:func:`.synthetic.attention_for`) or None, gate bias or None)
_TABLE: dict[str, tuple[str, str, int, dict | None, float | None]] = {
    "standard": ("Transformer, 4 heads", "standard", 4, None, None),
    "standard_h2": ("Transformer, 2 heads", "standard", 2, None, None),
    "standard_h8": ("Transformer, 8 heads", "standard", 8, None, None),
    "standard_h16": ("Transformer, 16 heads", "standard", 16, None, None),
    "diff": ("Diff V1, 4 heads (2 diff.), sub-norm, λ_init ye", "diff", 4, None, None),
    "diff_h8": ("Diff V1, 8 heads (4 diff.)", "diff", 8, None, None),
    "diff_h16": ("Diff V1, 16 heads (8 diff.)", "diff", 16, None, None),
    "diff_no_subnorm": ("Diff V1, no sub-norm", "diff", 4, {"sub_norm": False}, None),
    "diff_lambda0": ("Diff V1, λ_init 0", "diff", 4, {"lambda_init": 0.0}, None),
    "diff_lambda0.2": ("Diff V1, λ_init 0.2", "diff", 4, {"lambda_init": 0.2}, None),
    "diff_lambda0.5": ("Diff V1, λ_init 0.5", "diff", 4, {"lambda_init": 0.5}, None),
    "diff_lambda0.8": ("Diff V1, λ_init 0.8", "diff", 4, {"lambda_init": 0.8}, None),
    "diff_v2": ("Diff V2, 4 heads, no sub-norm", "diff_v2", 4, None, None),
    "diff_v2_subnorm": ("Diff V2, sub-norm", "diff_v2", 4, {"sub_norm": True}, None),
    "gated": ("DG, gate bias 0 (g = 0.5)", "gated", 4, None, 0.0),
    "gated_bias2": ("DG, gate bias +2 (g ≈ 0.88)", "gated", 4, None, 2.0),
    "gda_r4": ("Grouped diff., 4 signal + 1 noise heads of width D/4", "grouped", 5,
               {"num_noise_heads": 1, "head_dim": _QUARTER}, None),
    "diff_lambda0.2_fixed": ("Diff V1, λ_init 0.2, sub-norm × 1", "diff", 4,
                              {"lambda_init": 0.2, "output_scale": "fixed"}, None),
    "diff_lambda0.5_fixed": ("Diff V1, λ_init 0.5, sub-norm × 1", "diff", 4,
                              {"lambda_init": 0.5, "output_scale": "fixed"}, None),
    "diff_lambda0.8_fixed": ("Diff V1, λ_init 0.8, sub-norm × 1", "diff", 4,
                              {"lambda_init": 0.8, "output_scale": "fixed"}, None),
    "diff_no_subnorm_lambda0.2_tied": ("Diff V1, λ_init 0.2, no sub-norm, × (1 − λ_init)", "diff", 4,
                                        {"lambda_init": 0.2, "sub_norm": False, "output_scale": "tied"}, None),
    "diff_no_subnorm_lambda0.5_tied": ("Diff V1, λ_init 0.5, no sub-norm, × (1 − λ_init)", "diff", 4,
                                        {"lambda_init": 0.5, "sub_norm": False, "output_scale": "tied"}, None),
    "diff_no_subnorm_lambda0.8_tied": ("Diff V1, λ_init 0.8, no sub-norm, × (1 − λ_init)", "diff", 4,
                                        {"lambda_init": 0.8, "sub_norm": False, "output_scale": "tied"}, None),
    "diff_no_subnorm_lambda0.2": ("Diff V1, λ_init 0.2, no sub-norm, × 1", "diff", 4,
                                   {"lambda_init": 0.2, "sub_norm": False}, None),
    "diff_no_subnorm_lambda0.5": ("Diff V1, λ_init 0.5, no sub-norm, × 1", "diff", 4,
                                   {"lambda_init": 0.5, "sub_norm": False}, None),
    "diff_no_subnorm_lambda0.8": ("Diff V1, λ_init 0.8, no sub-norm, × 1", "diff", 4,
                                   {"lambda_init": 0.8, "sub_norm": False}, None),
}
#: variant → label (the first is the baseline of the controls)
VARIANTS: dict[str, str] = {k: v[0] for k, v in _TABLE.items()}
#: the variant every configuration starts with: the Transformer of the controls
CONTROL_VARIANT = next(iter(_TABLE))
#: the paper's one claim among the factors, as a comparison (level, reference, metric): its sub-norm helps V1
SUBNORM_CLAIM = ("diff_no_subnorm", "diff", "accuracy")
#: the budget (diffattn/configs/studies/recall_ablation.yaml)
DEFAULTS: dict[str, Any] = {
    "steps": 600, "batch_size": 32, "lrs": [3.0e-4, 1.0e-3, 3.0e-3], "tuning_seeds": [100], "weight_decay": 0.1,
    "warmup_steps": 50, "widths": [64, 128], "wide_variants": [], "depth": 2,
    "vocab": {"num_keys": 16, "num_values": 16, "num_filler": 1},
    "pairs": [2, 4, 8], "samples": 200, "eval_every": 50, "curve_samples": 100,
    "control_accuracy": 0.9, "comparisons": [], "threads": 1,
}
_METRICS = (("accuracy", "final accuracy with the fewest pairs (%)"), ("auc", "area under the learning curve (%)"))


def control(cfg: dict[str, Any]) -> list[Control]:
    """The positive controls, one per width, each gating only that width's tests: the Transformer with 4 heads (the
    first variant), at its chosen lr, must reach ``control_accuracy`` with the fewest pairs (as :mod:`.recall`)."""
    easiest = cfg["pairs"][0]
    return [Control(f"Transformer (4 heads) accuracy at width {w} with {easiest} pairs (%)", f"w{w}.accuracy",
                    100.0 * cfg["control_accuracy"], scale=100.0, gates=(f"w{w}",)) for w in cfg["widths"]]


def variant_settings(variant: str) -> tuple[str, dict[str, Any]]:
    """``variant``'s attention kind and the settings it changes in the recall study's spec of that kind (a copy;
    empty for the kind's defaults), as the module table lists them."""
    if variant not in _TABLE:
        raise ValueError(f"variant must be one of the recall ablation's {list(_TABLE)}, got {variant!r}")
    _, kind, _, settings, _ = _TABLE[variant]
    return kind, dict(settings or {})


def _width_heads(variant: str) -> int:
    """The heads the width is split into for ``variant``: its query heads, or 4 where it sets d = D/4."""
    _, _, heads, settings, _ = _TABLE[variant]
    return 4 if settings is not None and settings.get("head_dim") == _QUARTER else heads


def variant_model(variant: str, *, vocab_size: int, dim: int, depth: int, max_seq_len: int,
                  seed: int) -> torch.nn.Module:
    """The ablation's ``variant`` (module table) at width ``dim``, initialised from ``seed``, parameter-matched to
    the Transformer with the same heads (:func:`.synthetic.build_model`), or, for a variant that sets its head width
    d, to the Transformer with heads of width d (``gda_r4``: 4 heads of width D/4, as its 4 signal heads)."""
    _, kind, heads, settings, gate_bias = _TABLE[variant]
    baseline_heads = None
    if settings is not None and settings.get("head_dim") == _QUARTER:
        settings = {**settings, "head_dim": dim // 4}
        baseline_heads = 4
    model = build_model(kind, vocab_size=vocab_size, dim=dim, depth=depth, num_heads=heads, max_seq_len=max_seq_len,
                        seed=seed, attention=settings, baseline_heads=baseline_heads)
    if gate_bias is not None:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, GatedDiffAttention):
                    m.gate_proj.bias.fill_(gate_bias)
    return model


def _budget(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("steps", "batch_size", "weight_decay", "warmup_steps", "depth", "vocab", "pairs", "samples", "eval_every",
            "curve_samples")
    return json.loads(json.dumps({k: cfg[k] for k in keys}))


def run_one(cfg: dict[str, Any], vocab: SyntheticVocab, variant: str, width: int, lr: float, seed: int,
            folder: Path, progress: bool, phase: str, *,
            probe: Callable[[torch.nn.Module], Any] | None = None) -> dict[str, Any]:
    """One training of ``variant`` at ``width``, ``lr`` and ``seed`` (the recall study's data, test sets and
    training), read back from ``folder`` when it was run with this budget. ``probe(model)``: measured at every
    evaluation point (:func:`.synthetic.train_model`; :mod:`.probe`), in the result's ``"probe"``."""
    path = folder / f"{variant}_w{width}_lr{lr:g}_s{seed}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("budget") == _budget(cfg):
            return saved["result"]
    easiest = cfg["pairs"][0]
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1))  # as recall.run: the same sets per seed
    test = {p: mqar_batch(cfg["samples"], pairs=p, generator=g, vocab=vocab) for p in cfg["pairs"]}
    curve_set = mqar_batch(cfg["curve_samples"], pairs=easiest, generator=g, vocab=vocab)
    model = variant_model(variant, vocab_size=vocab.size, dim=width, depth=cfg["depth"],
                          max_seq_len=4 * max(cfg["pairs"]), seed=seed)
    batches = mqar_stream(cfg["pairs"], cfg["batch_size"], vocab, seed)  # the recall study's training stream
    trained = train_model(model, batches, steps=cfg["steps"], lr=lr,
                          weight_decay=cfg["weight_decay"], warmup_steps=cfg["warmup_steps"],
                          eval_every=cfg["eval_every"], evaluate=lambda m: answer_accuracy(m, curve_set).mean().item(),
                          probe=probe)
    acc = {f"P{p}": answer_accuracy(model, b).mean().item() for p, b in test.items()}
    curve = [v for _, v in trained["curve"]]
    result = {"accuracy": acc[f"P{easiest}"], "accuracy_all": acc, "auc": sum(curve) / len(curve), **trained,
              "params": param_count(model), "lr": lr}
    with atomic_write_file(path, "w") as f:
        json.dump({"budget": _budget(cfg), "result": result}, f, indent=1)
    if progress:
        print(f"[study recall_ablation] {phase} {variant} w{width} lr {lr:g} seed {seed}: accuracy "
              + ", ".join(f"{k} {100 * a:.1f} %" for k, a in acc.items())
              + f"; AUC {100 * result['auc']:.1f} %; {trained['train_seconds']:.0f} s", flush=True)
    return result


def _variants_at(cfg: dict[str, Any], width: int) -> list[str]:
    return cfg["variants"] if width == cfg["widths"][0] or not cfg["wide_variants"] else cfg["wide_variants"]


def _fmt(values: list[float]) -> str:
    m, s = mean_std(values)
    return f"{m:.1f} ± {s:.1f}"


def _execute(cfg: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The sweep on the tuning seeds, the selection, the reported seeds and the paired analysis (module
    docstring); writes ``<out>/results.json`` and ``<out>/report.md``."""
    torch.set_num_threads(cfg["threads"])
    vocab = SyntheticVocab(**cfg["vocab"])
    out = Path(cfg["out"])
    folder = out / "runs"
    t0 = time.perf_counter()
    chosen: dict[str, dict[str, float]] = {}
    tuning: dict[str, dict[str, dict[str, list[dict]]]] = {}
    reported: dict[str, dict[str, list[dict]]] = {}
    for w in cfg["widths"]:  # the first width complete before the next: a cut run still reports it whole
        key = f"w{w}"
        chosen[key], tuning[key], reported[key] = {}, {}, {}
        for v in _variants_at(cfg, w):  # each variant tuned and reported before the next: a cut keeps it whole
            sweep = {lr: [run_one(cfg, vocab, v, w, lr, s, folder, progress, "tuning") for s in cfg["tuning_seeds"]]
                     for lr in cfg["lrs"]}
            tuning[key][v] = {f"{lr:g}": runs for lr, runs in sweep.items()}
            chosen[key][v] = select_lr(sweep)
            reported[key][v] = [run_one(cfg, vocab, v, w, chosen[key][v], s, folder, progress, "reported")
                                for s in cfg["seeds"]]
    seconds = time.perf_counter() - t0
    return _write(cfg, out, chosen, tuning, reported, seconds)


def _write(cfg, out: Path, chosen, tuning, reported, seconds: float) -> dict[str, Any]:
    base = {s: {VARIANTS["standard"]: {f"w{w}": {"accuracy": reported[f"w{w}"]["standard"][i]["accuracy"]}
                                        for w in cfg["widths"]}} for i, s in enumerate(cfg["seeds"])}
    checked = {c.gates[0]: check_control(base, c, str(cfg.get("control_set", "") or "")) for c in control(cfg)}
    controls = {k: {kk: c[kk] for kk in ("values", "mean", "threshold", "passed", "seeds", "failed_seeds",
                                          "control_set", "line")} for k, c in checked.items()}
    train_minutes = sum(r["train_seconds"] for per_w in (tuning, reported) for per_v in per_w.values()
                        for runs in per_v.values() for rs in (runs.values() if isinstance(runs, dict) else [runs])
                        for r in rs) / 60
    tests = []
    for w in cfg["widths"]:
        runs = reported[f"w{w}"]
        for factor, level, ref in cfg["comparisons"]:
            if level not in runs or ref not in runs:
                continue
            for metric, _ in _METRICS:
                x = [100 * r[metric] for r in runs[level]]
                y = [100 * r[metric] for r in runs[ref]]
                row = {"width": w, "factor": factor, "level": level, "reference": ref, "metric": metric,
                       "tested": controls[f"w{w}"]["passed"], "mean_level": sum(x) / len(x),
                       "mean_reference": sum(y) / len(y)}
                row.update(paired_test(x, y))
                tests.append(row)
    tested = [t for t in tests if t["tested"]]
    for t, p in zip(tested, holm([t["p"] for t in tested]) if tested else []):
        t["p_holm"] = p
    registered = registration_status(cfg)
    confirmatory = {(e["primary_endpoint"], e["comparison"].get("variant"), e["comparison"].get("baseline"))
                    for e in registered["registrations"] if e["confirmatory"]}
    for t in tests:  # the registered primary endpoints of a confirmatory run; every other test is exploratory
        t["analysis"] = ("confirmatory" if (f"w{t['width']}.{t['metric']}", t["level"], t["reference"])
                         in confirmatory else "exploratory")
    for t in tests:  # the paper's one claim among the factors: its sub-norm (GroupNorm) helps V1
        if (t["level"], t["reference"], t["metric"]) == SUBNORM_CLAIM:
            t["verdict"] = verdict_of_test(t if t["tested"] else None, SUBNORM_HELPS).value
    lines = ["# Study: why the Diff Transformer does not learn recall — a one-factor-at-a-time ablation", "",
             f"Protocol: {PROTOCOLS['b']} (and per width). MQAR as in the recall study ({cfg['depth']} layers, "
             f"pairs {cfg['pairs']}, {cfg['steps']} steps of "
             f"{cfg['batch_size']}, warm-up {cfg['warmup_steps']} then cosine); per (variant, width) the lr among "
             f"{cfg['lrs']} with the highest mean area under the learning curve on tuning seeds "
             f"{cfg['tuning_seeds']} (never reported), then reported seeds {cfg['seeds']}. Wall time of this "
             f"call {seconds / 60:.1f} min (runs saved by an earlier call are read back); training time summed "
             f"over every run {train_minutes:.1f} min.", "", *registered["lines"], ""]
    lines += [c["line"] for c in controls.values()]
    lines += ["", "Per-seed control status (✓ passed at that seed):", "", *control_table(list(checked.values()))]
    for w in cfg["widths"]:
        runs = reported[f"w{w}"]
        lines += ["", f"## Width {w}: mean ± std over the {len(cfg['seeds'])} reported seeds", "",
                  "| variant | lr (chosen) | tuning AUC per lr (%) | accuracy, " + ", ".join(f"{p} pairs" for p in
                                                                                           cfg["pairs"])
                  + " (%) | AUC (%) | parameters |", "|---|---:|---|---|---:|---:|"]
        for v, rs in runs.items():
            sweep = ", ".join(f"{lr}: {100 * sum(r['auc'] for r in t) / len(t):.1f}"
                              for lr, t in tuning[f"w{w}"][v].items())
            accs = " / ".join(_fmt([100 * r["accuracy_all"][f"P{p}"] for r in rs]) for p in cfg["pairs"])
            lines.append(f"| {VARIANTS[v]} (`{v}`) | {chosen[f'w{w}'][v]:g} | {sweep} | {accs} | "
                         f"{_fmt([100 * r['auc'] for r in rs])} | {rs[0]['params']:,} |")
    start = len(lines) + 2
    lines += ["", "## Effects: level − reference, paired by seed (protocol (b))", "",
              f"Mean difference in points [95 % CI], Cohen's d_z, Holm-adjusted p over the {len(tested)} tests "
              f"(widths whose control passed).", "",
              "| width | factor | level − reference | metric | level | reference | difference [95 % CI] | d_z | "
              "p_Holm | analysis |", "|---:|---|---|---|---:|---:|---|---:|---:|---|"]
    for t in tests:
        lo, hi = t["ci95"]
        ph = f"{t['p_holm']:.3f}" if "p_holm" in t else "—"
        lines.append(f"| {t['width']} | {t['factor']} | `{t['level']}` − `{t['reference']}` | {t['metric']} | "
                     f"{t['mean_level']:.1f} | {t['mean_reference']:.1f} | {t['mean_diff']:+.1f} "
                     f"[{lo:+.1f}, {hi:+.1f}] | {t['d_z']:+.2f} | {ph} | {t['analysis']} |")
    claimed = [t for t in tests if "verdict" in t]
    if claimed:
        lines += ["", f"Verdict on the paper's claim ({SUBNORM_HELPS.source}: removing the sub-norm lowers "
                      f"accuracy), from the list of diffattn.studies.verdict:", ""]
        lines += [f"- width {t['width']}: `diff_no_subnorm` − `diff` {t['mean_diff']:+.1f} "
                  f"[{t['ci95'][0]:+.1f}, {t['ci95'][1]:+.1f}] → **{t['verdict']}**" for t in claimed]
    table = "\n".join(lines[start:])
    report = "\n".join(lines) + "\n"
    with atomic_write_file(out / "report.md", "w") as f:
        f.write(report)
    results = {"study": cfg.get("study"), "config": dict(cfg), "control": controls, "chosen_lr": chosen,
               "tuning": tuning, "reported": reported, "tests": tests, "seconds": round(seconds, 1),
               "registration": {k: registered[k] for k in ("label", "registrations")}}
    with atomic_write_file(out / "results.json", "w") as f:
        json.dump(results, f, indent=1, default=float)
    return {"results": results, "table": table, "report": str(out / "report.md"), "seconds": seconds}


class RecallAblationStudy(Study, name="recall_ablation", variants=VARIANTS, defaults=DEFAULTS, control=control):
    """The recall ablation (module docstring). Each factor level is compared with its own reference level, not with
    one baseline, and the models are tuned per variant, so it runs and reports as one step (:meth:`execute`)."""

    def endpoint_values(self, results: Mapping[str, Any], key: str, variant: str) -> list[float | None]:
        """``w<width>.<metric>`` (``auc``, ``accuracy``) of ``variant``'s reported runs, in points (%)."""
        width, _, metric = key.partition(".")
        runs = results["reported"].get(width, {}).get(variant)
        if runs is None or metric not in ("auc", "accuracy"):
            raise ValueError(f"results of study recall_ablation have no {key!r} for variant {variant!r}")
        return [100.0 * r[metric] for r in runs]

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("steps", "batch_size", "depth", "samples", "eval_every", "curve_samples",
                                      "threads"), where)
        errors += minimum_errors(cfg, ("warmup_steps",), where, 0)
        variants = cfg["variants"]
        if variants[0] != CONTROL_VARIANT:
            errors.append(f"variants in {where} must start with 'standard' (the Transformer of the controls), got "
                          f"{variants!r}")
        errors += tuning_errors(cfg, where)
        widths = cfg["widths"]
        heads = max(_width_heads(v) for v in variants if v in _TABLE)
        if not increasing_ints(widths):
            errors.append(f"widths in {where} must be a list of distinct integers >= 1 in increasing order, got "
                          f"{widths!r}")
        elif any(w % (2 * heads) for w in widths):
            errors.append(f"widths in {where} must be multiples of 2 · the most heads of a variant ({2 * heads}), got "
                          f"{widths!r}")
        wide = cfg["wide_variants"]
        if any(v not in variants for v in wide) or len(set(wide)) != len(wide) or (wide and wide[0] != CONTROL_VARIANT):
            errors.append(f"wide_variants in {where} must be distinct variants of the study starting with 'standard' "
                          f"(the ones also trained at the widths after the first; empty: every variant), got {wide!r}")
        for c in cfg["comparisons"]:
            if not (isinstance(c, list) and len(c) == 3 and all(isinstance(x, str) for x in c)
                    and c[1] in variants and c[2] in variants and c[1] != c[2]):
                errors.append(f"comparisons in {where} must be [factor, level, reference] triples of distinct variants "
                              f"of the study, got {c!r}")
        vocab = cfg["vocab"]
        errors += vocab_errors(vocab, list(DEFAULTS["vocab"]), where)
        pairs = cfg["pairs"]
        if not increasing_ints(pairs) or \
                (isinstance(vocab.get("num_keys"), int) and max(pairs) > vocab["num_keys"]):
            errors.append(f"pairs in {where} must be distinct increasing integers in [1, vocab.num_keys], got "
                          f"{pairs!r}")
        if not 0 < cfg["control_accuracy"] <= 1:
            errors.append(f"control_accuracy in {where} must be in (0, 1], got {cfg['control_accuracy']!r}")
        return errors

    def execute(self, cfg: StudyConfig, progress: bool = True) -> dict[str, Any]:
        return _execute(cfg, progress)
