"""A probe of the recall plateau: what each block's residual stream, attention branch and gradients do while a model
learns (or fails to learn) multi-query associative recall.

At every evaluation point of a recall-ablation run (:mod:`.recall_ablation`), on one fixed probe batch, per block
of the pre-norm decoder (x ← x + attn(norm1(x)); x ← x + mlp(norm2(x))):

- ``rms_in``: the residual stream's RMS entering the block, √mean(x²) over every token and channel;
- ``attn_ratio``: RMS of the attention branch's output over ``rms_in`` (how much the branch moves the stream);
- ``attn_share``: RMS(attn) / (RMS(attn) + RMS(mlp)), the attention branch's share of the block's update;
- ``grad_attn``, ``grad_mlp``: the L2 norms of the gradients of the answer loss on the probe batch with respect to
  the attention and the MLP parameters of the block.

The probe neither draws random numbers nor leaves a gradient behind (the previous ``.grad`` are restored), so a
probed run trains exactly as the unprobed one: its areas under the curve equal the committed study's at the same
seeds (the test checks this). Why: Ye et al. (2024, §2.1) scale the sub-normed differential output by
(1 − λ_init) so that the gradient flow matches a Transformer's; the recall factorial finds the scale, not λ, carries
V1's gain at depth 2. The probe shows how the scale enters: the attention branch's size and gradients per block.

    python scripts/plateau_probe.py --from studies/results/recall_factorial_scale_w64/results.json \\
        --variants standard diff_lambda0.8 diff_lambda0.8_fixed diff_lambda0.2 --seeds 200 201 202
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.synthetic import SyntheticBatch, SyntheticVocab, mqar_batch
from ..io import atomic_write_file
from .recall_ablation import DEFAULTS, VARIANTS, run_one
from .stats import mean_std
from .synthetic import answer_loss

__all__ = ["PROBE_KEYS", "block_probe", "probe_runs", "render_probe", "PROBE_START", "PROBE_END", "PROBE_RESULTS"]

PROBE_START = "<!-- probe:start (rendered by `diffattn study-summary` from studies/exploratory/) -->"
PROBE_END = "<!-- probe:end -->"
#: where the committed probe results live: exploratory, so not under studies/results/ (registered questions only)
PROBE_RESULTS = Path("studies") / "exploratory" / "plateau_probe"
#: what the probe measures per block (module docstring)
PROBE_KEYS = ("rms_in", "attn_ratio", "attn_share", "grad_attn", "grad_mlp")


def _rms(x: torch.Tensor) -> float:
    return x.detach().float().pow(2).mean().sqrt().item()


def _norm(params: Sequence[torch.nn.Parameter]) -> float:
    return math.sqrt(sum(p.grad.detach().float().pow(2).sum().item() for p in params if p.grad is not None))


def block_probe(model: torch.nn.Module, batch: SyntheticBatch) -> list[dict[str, float]]:
    """The probe's measures (module docstring) for every block of ``model`` (a model with ``blocks``, each with
    ``attn`` and ``mlp``) on ``batch``; the model's gradients are left as they were."""
    blocks = list(model.blocks)
    seen: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    for i, blk in enumerate(blocks):
        hooks.append(blk.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__((i, "in"), args[0])))
        hooks.append(blk.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__((i, "attn"), out)))
        hooks.append(blk.mlp.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__((i, "mlp"), out)))
    saved = {p: p.grad for p in model.parameters()}
    try:
        for p in saved:
            p.grad = None
        answer_loss(model, batch).backward()
        out = []
        for i, blk in enumerate(blocks):
            rms_in, a, m = _rms(seen[(i, "in")]), _rms(seen[(i, "attn")]), _rms(seen[(i, "mlp")])
            out.append({"rms_in": rms_in, "attn_ratio": a / rms_in, "attn_share": a / (a + m),
                        "grad_attn": _norm(list(blk.attn.parameters())),
                        "grad_mlp": _norm(list(blk.mlp.parameters()))})
    finally:
        for h in hooks:
            h.remove()
        for p, g in saved.items():
            p.grad = g
    return out


def _probe_batch(cfg: Mapping[str, Any], vocab: SyntheticVocab, seed: int) -> SyntheticBatch:
    g = torch.Generator().manual_seed(7_919 * (seed + 1))  # its own generator: the training draws are untouched
    return mqar_batch(cfg["curve_samples"], pairs=cfg["pairs"][0], generator=g, vocab=vocab)


def probe_runs(results: Mapping[str, Any], variants: Sequence[str], seeds: Sequence[int], out: str | Path, *,
               width: str | None = None, source: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Retrain ``variants`` at ``seeds`` with the config and chosen lrs of a recall-ablation ``results`` (its first
    width unless ``width``, e.g. ``"w64"``), probing every evaluation point; writes and returns
    ``<out>/results.json`` (``source``: where ``results`` was read, recorded): ``{"source", "width", "variants",
    "seeds", "runs": {variant: {seed: {"auc", "curve", "probe": [[step, [per block]], ...]}}}}``."""
    cfg = {**DEFAULTS, **results["config"]}
    width = width or next(iter(results["reported"]))
    unknown = [v for v in variants if v not in results["chosen_lr"][width]]
    if unknown:
        raise ValueError(f"variants must be among the results' {list(results['chosen_lr'][width])} at {width}, got "
                         f"{unknown}")
    torch.set_num_threads(cfg["threads"])
    vocab = SyntheticVocab(**cfg["vocab"])
    out = Path(out)
    runs: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for v in variants:
        lr = results["chosen_lr"][width][v]
        runs[v] = {}
        for s in seeds:
            batch = _probe_batch(cfg, vocab, s)
            r = run_one(cfg, vocab, v, int(width[1:]), lr, s, out / "runs", progress, "probed",
                        probe=lambda m, b=batch: block_probe(m, b))
            runs[v][str(s)] = {"auc": r["auc"], "accuracy": r["accuracy"], "curve": r["curve"], "probe": r["probe"],
                               "lr": lr}
    found = {"source": source, "width": width, "variants": list(variants), "labels": {v: VARIANTS[v] for v in variants},
             "seeds": list(seeds), "depth": cfg["depth"], "runs": runs, "seconds": round(time.perf_counter() - t0, 1)}
    with atomic_write_file(out / "results.json", "w") as f:
        json.dump(found, f, indent=1)
    return found


def _at(run: Mapping[str, Any], step: int) -> list[dict[str, float]]:
    return next(p for s, p in run["probe"] if s == step)


def render_probe(root: str | Path) -> str:
    """The probe's table for docs/studies.md from ``studies/exploratory/plateau_probe/`` (module docstring): per variant
    and block, each measure's mean over the seeds at the first evaluation point, the middle one and the last."""
    folder = Path(root) / PROBE_RESULTS
    if not (folder / "results.json").is_file():
        return "The plateau probe has no committed results yet."
    res = json.loads((folder / "results.json").read_text())
    run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {}
    first = next(iter(next(iter(res["runs"].values())).values()))
    steps = [s for s, _ in first["probe"]]
    shown = [steps[0], steps[len(steps) // 2 - 1], steps[-1]]
    lines = [f"Width {res['width'][1:]}, depth {res['depth']}, seeds {res['seeds']}, each variant at the lr it chose "
             f"in the factorial; trained at {str(run.get('library_commit', '?'))[:7]}: `{run.get('command', '?')}`"
             f" ({run.get('wall_minutes', '?')} min). Mean over the seeds at steps {shown}, per block:", "",
             "| variant (AUC %) | block | RMS of the stream in | attention / stream | attention's share | "
             "‖∇ attention‖ | ‖∇ MLP‖ |", "|---|---:|---|---|---|---|---|"]
    for v in res["variants"]:
        per_seed = list(res["runs"][v].values())
        auc, _ = mean_std([100.0 * r["auc"] for r in per_seed])
        for b in range(len(first["probe"][0][1])):
            cells = []
            for key in PROBE_KEYS:
                vals = [mean_std([_at(r, s)[b][key] for r in per_seed])[0] for s in shown]
                cells.append(" → ".join(f"{x:.3g}" for x in vals))
            lines.append(f"| {res['labels'][v]} ({auc:.1f}) | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
