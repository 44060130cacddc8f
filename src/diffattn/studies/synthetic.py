"""What the synthetic-task studies (:mod:`.needles`, :mod:`.recall`) share: causal LMs of (near-)equal size that
differ only in their attention, trained from scratch on generated batches with the loss on the answer tokens only,
and batched answer accuracy.

The models are the library's :class:`~diffattn.models.CausalLM` with an
:class:`~diffattn.layers.AttentionSpec`:

- ``standard``: h heads of width d = D / h (a Llama-style Transformer);
- ``diff``: the Diff Transformer (Ye et al. 2024, §2.1, eq. 1–3): the h query heads paired into h/2 differential
  heads with V of width 2d, λ_init = 0.8 − 0.6·exp(−0.3·l) with the 0-based layer index l (Ye et al.'s
  0.8 − 0.6·exp(−0.3·(l − 1)) with l 1-based), per-head RMSNorm;
- ``diff_v2``: Diff Transformer V2 (Ye et al. 2026): 2h query heads, one K and V shared by both branches,
  λ = σ(x W_λ) per token and head, no sub-norm;
- ``gated``: gated differential attention (M-DGSA 2025, eq. 3), λ_init 0.8.
- ``diff_lambda0.8``: ``diff`` with a constant λ_init of 0.8 in every layer (the value Ye et al. 2024's schedule
  approaches with depth; the recall ablation's variant of that name);
- ``grouped``: grouped differential attention (Motif Technologies 2025, arXiv 2510.06949), by default one noise
  head per signal head (``diff``'s layout with the grouped layer's λ_init); a ratio r is set through ``attention``
  (``num_noise_heads``), with ``baseline_heads`` naming the Transformer it is matched to.

Equal size: every model's SwiGLU width is the one whose total parameter count comes closest to the standard
model's (the Diff Transformer V2's extra query projection D × D per layer is paid for by a narrower MLP; Ye et al.
2024, §3.1 match sizes the same way by construction). Every model's count is reported.

Training: AdamW (decoupled weight decay on weight matrices, :func:`diffattn.train.optim.param_groups`), linear
warm-up then cosine decay (:func:`diffattn.train.optim.warmup_cosine`), gradient clipping at 1, the steps taken by
:func:`diffattn.train.step.fit`; the loss is the cross-entropy of the answer tokens only. The batches come from a
generator seeded by the study seed, so at one seed all models see the same data in the same order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..data.synthetic import SyntheticBatch
from ..layers import AttentionSpec
from ..models import CausalLM
from ..train.optim import param_groups, warmup_cosine
from ..train.step import fit
from .claims import FEWER_STEPS
from .stats import censored_paired_test, holm, mean_std
from .verdict import PaperEffect, derive_verdict, verdict_text

__all__ = ["MODELS", "DEFAULT_VARIANTS", "VARIANT_ATTENTION", "attention_for", "build_model", "param_count",
           "answer_loss", "answer_accuracy", "steps_to_control_lines", "FEWER_STEPS", "steps_to_control_tests",
           "train_model", "steps_to_reach"]

#: the variants the synthetic studies compare: name → (label, attention)
VARIANT_ATTENTION: dict[str, tuple[str, AttentionSpec]] = {
    "standard": ("Transformer", AttentionSpec("standard")),
    "diff": ("Diff Transformer", AttentionSpec("diff", lambda_init="ye")),
    "diff_v2": ("Diff Transformer V2", AttentionSpec("diff_v2")),
    "gated": ("DG Transformer", AttentionSpec("gated", lambda_init=0.8)),
    "diff_lambda0.8": ("Diff Transformer, λ_init 0.8", AttentionSpec("diff", lambda_init=0.8)),
    "grouped": ("Grouped Diff Transformer", AttentionSpec("grouped")),
}
#: variant → label
MODELS: dict[str, str] = {name: label for name, (label, _) in VARIANT_ATTENTION.items()}
#: the variants a needles or recall config runs when it names none: the four models of the module docstring
DEFAULT_VARIANTS: tuple[str, ...] = ("standard", "diff", "diff_v2", "gated")


def attention_for(kind: str) -> AttentionSpec:
    """The attention of variant ``kind`` (module docstring)."""
    if kind not in VARIANT_ATTENTION:
        raise ValueError(f"kind must be one of {list(MODELS)}, got {kind!r}")
    return VARIANT_ATTENTION[kind][1]


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _lm(spec: AttentionSpec, vocab_size: int, dim: int, depth: int, num_heads: int, max_seq_len: int,
        mlp_hidden: int | None) -> CausalLM:
    return CausalLM(vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads, attention=spec,
                    max_seq_len=max_seq_len, mlp_hidden=mlp_hidden)


def build_model(kind: str, *, vocab_size: int, dim: int, depth: int, num_heads: int, max_seq_len: int,
                seed: int, attention: AttentionSpec | Mapping[str, Any] | None = None,
                baseline_heads: int | None = None) -> CausalLM:
    """The ``kind`` model (module docstring) initialised from ``seed``, its SwiGLU width chosen so that its
    parameter count is the closest to the standard model's of the same sizes (with ``baseline_heads`` heads, by
    default ``num_heads``). ``attention``: the settings of an ablation, a dict that updates the variant's spec
    (:func:`attention_for`; ``{"sub_norm": False}`` keeps the rest, :meth:`~diffattn.layers.AttentionSpec.updated`),
    or a whole other spec, which ``kind`` then only names."""
    spec = attention_for(kind) if attention is None else attention_for(kind).updated(attention)
    std_heads = num_heads if baseline_heads is None else baseline_heads
    with torch.device("meta"):  # counts only: no memory, no initialisation
        target = param_count(_lm(attention_for("standard"), vocab_size, dim, depth, std_heads, max_seq_len, None))
        probe = _lm(spec, vocab_size, dim, depth, num_heads, max_seq_len, None)
    per_unit = 3 * dim * depth  # a SwiGLU of width w has 3 · dim · w weights per block (no bias)
    hidden = max(1, probe.mlp_hidden - round((param_count(probe) - target) / per_unit))
    torch.manual_seed(seed)
    return _lm(spec, vocab_size, dim, depth, num_heads, max_seq_len, hidden)


def _answer_logits(model: torch.nn.Module, batch: SyntheticBatch) -> torch.Tensor:
    logits = model(batch.ids)  # (B, L, V)
    idx = batch.answer_pos[..., None].expand(-1, -1, logits.shape[-1])  # (B, R, V)
    return logits.gather(1, idx)  # (B, R, V)


def answer_loss(model: torch.nn.Module, batch: SyntheticBatch) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens: −log p(answers | ids[: answer_pos + 1])."""
    logits = _answer_logits(model, batch)  # (B, R, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.answers.flatten())


@torch.no_grad()
def answer_accuracy(model: torch.nn.Module, batch: SyntheticBatch, chunk: int = 128) -> torch.Tensor:
    """(B,) the fraction of each sample's answers predicted exactly (argmax of the next-token logits at the
    answer positions, the earlier answers in the prompt as given)."""
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, batch.ids.shape[0], chunk):
        part = SyntheticBatch(batch.ids[i:i + chunk], batch.answer_pos[i:i + chunk], batch.answers[i:i + chunk],
                              batch.answer_span[i:i + chunk], batch.context)
        pred = _answer_logits(model, part).argmax(-1)  # (b, R)
        out.append((pred == part.answers).double().mean(-1))
    model.train(was_training)
    return torch.cat(out)


def train_model(model: torch.nn.Module, batches: Iterator[SyntheticBatch], *, steps: int, lr: float,
                weight_decay: float, warmup_steps: int, eval_every: int,
                evaluate: Callable[[torch.nn.Module], float],
                probe: Callable[[torch.nn.Module], Any] | None = None) -> dict[str, Any]:
    """``steps`` optimizer steps on ``batches`` (module docstring), ``evaluate(model)`` after every
    ``eval_every`` steps and at the end. Returns ``{"final_loss", "curve": [[step, value], ...],
    "train_seconds"}`` (the loss is the mean of the last 5 % of steps; the time excludes the evaluations), and with
    ``probe`` ``"probe": [[step, probe(model)], ...]`` at the same points (a probe must not change the training:
    no random draws, no gradient left behind; :func:`.probe.block_probe`)."""
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warmup_steps))
    losses: list[float] = []
    curve: list[list[float]] = []
    probed: list[list[Any]] = []
    seconds = 0.0
    while len(losses) < steps:
        k = min(eval_every, steps - len(losses))
        t0 = time.perf_counter()
        losses += fit(model, opt, sched, (next(batches) for _ in range(k)), answer_loss, grad_clip=1.0, total=steps)
        seconds += time.perf_counter() - t0
        curve.append([len(losses), float(evaluate(model))])
        if probe is not None:
            probed.append([len(losses), probe(model)])
    tail = losses[-max(1, steps // 20):]
    out = {"final_loss": sum(tail) / len(tail), "curve": curve, "train_seconds": round(seconds, 1)}
    return out if probe is None else {**out, "probe": probed}


def steps_to_control_lines(reached: dict[str, list[int | None]], steps: int) -> list[str]:
    """One markdown line per model: on how many seeds it reached the control level and at which step (mean ± std
    over those seeds), from ``reached`` (model label → per-seed step or None); ``steps`` is the training budget."""
    out = []
    for lab, per_seed in reached.items():
        hit = [x for x in per_seed if x is not None]
        if hit:
            m, sd = mean_std(hit)
            out.append(f"- {lab}: reached on {len(hit)} of {len(per_seed)} seeds, at step {m:.0f} ± {sd:.0f} "
                       f"(mean ± std over those seeds; per seed {per_seed})")
        else:
            out.append(f"- {lab}: never reached it within {steps} steps on any seed")
    return out


def steps_to_control_tests(reached: dict[str, list[int | None]], steps: int,
                           claim: PaperEffect | None = FEWER_STEPS, *,
                           control_passed: bool = True) -> tuple[list[str], list[dict[str, Any]]]:
    """The paired test of steps-to-threshold of every model against the first (the baseline), a seed that never
    reached the level counted as censored at the budget ``steps``
    (:func:`~diffattn.studies.stats.censored_paired_test`: exact paired permutation p on the restricted steps,
    paired Gehan scores), Holm-adjusted over the models; with ``claim`` each model's verdict, the restricted mean
    difference and its interval taken in % of the baseline's restricted mean steps (``inconclusive`` when the
    baseline failed its control). Returns the markdown lines and one dict per model."""
    labels = list(reached)
    base = labels[0]
    tests = {lab: censored_paired_test(reached[lab], reached[base], steps) for lab in labels[1:]}
    if not tests:
        return [], []
    for lab, p in zip(tests, holm([t["p"] for t in tests.values()])):
        tests[lab]["p_holm"] = p
    base_mean = sum(tests[labels[1]]["restricted_y"]) / len(tests[labels[1]]["restricted_y"])
    lines = [f"Paired test of the steps to the control level, each model against {base}: a seed that never "
             f"reached it counts as censored at the budget ({steps} steps); exact paired permutation p on the "
             f"restricted steps (Fisher 1935; Pitman 1937), Holm-adjusted over the {len(tests)} models, and the "
             f"paired Gehan scores (Gehan 1965; Woolson & Lachenbruch 1980) with their sign-test p; "
             f"differences in steps and in % of {base}'s restricted mean ({base_mean:.0f} steps):", ""]
    out = []
    for lab, t in tests.items():
        rel = [100.0 * v / base_mean for v in (t["mean_diff"], *t["ci95"])] if base_mean > 0 else [math.nan] * 3
        entry = {"variant": lab, **t, "relative": rel}
        text = ""
        if claim is not None:
            verdict = derive_verdict(rel[0], rel[1:], t["p_holm"], claim, control_passed=control_passed)
            entry["verdict"] = verdict.value
            text = f" → **{verdict_text(verdict, claim)}**"
        lines.append(f"- {lab} − {base}: {t['mean_diff']:+.0f} steps [95 % CI {t['ci95'][0]:+.0f}, "
                     f"{t['ci95'][1]:+.0f}] ({rel[0]:+.0f} % [{rel[1]:+.0f}, {rel[2]:+.0f}]); reached on "
                     f"{t['reached_x']} vs {t['reached_y']} of {t['n']} seeds; later on {t['wins']}, earlier on "
                     f"{t['losses']}, order unknown or equal on {t['ties']} (Gehan sign p {t['p_gehan']:.3f}); "
                     f"permutation p {t['p']:.4f}, Holm p {t['p_holm']:.4f}{text}")
        out.append(entry)
    n = len(next(iter(reached.values())))
    lines += ["", f"With {n} seeds neither test can go below p = {2 / 2 ** n:.4g}."]
    return lines, out


def steps_to_reach(curve: Sequence[Sequence[float]], level: float) -> int | None:
    """The first evaluated step at which the curve's value reaches ``level`` (None: never)."""
    for step, value in curve:
        if value >= level and not math.isnan(value):
            return int(step)
    return None
