"""Attention noise on the needle task: standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3).

Ye et al. 2024 (Table 3) report that in key-information retrieval the Diff Transformer puts more attention on the
answer span and less on the rest of the context ("attention noise") than a Transformer. The question only means
something for models that retrieve the needle, so the LMs are trained on the retrieval task itself: causal LMs of
the same size that differ only in their attention (the library's ``lm_tiny`` family, byte-level) are trained from
scratch with the same recipe, seed, batches and budget on the State of the Union train split, where a share
``needle_fraction`` of every batch is needle prompts (:func:`diffattn.eval.language.needle_prompt`: "The magic
number of {city} is {number}." inside State of the Union text at a random depth, then the question) followed by
their answer (:func:`~.common.needle_batches`; the loss, :func:`~.common.needle_lm_loss`, is the next-byte
cross-entropy of the text windows plus that of the answers, so retrieval is not drowned by the 120-odd filler bytes
around each answer). Then
needle prompts of the trained length in *held-out* State of the Union text, at several depths, measure:

- attention mass on the answer span (the needle's number) vs the rest of the context, from the last query position
  (the one that predicts the answer), mean over prompts, heads and layers
  (:func:`diffattn.diagnostics.answer_attention` on the maps :func:`diffattn.diagnostics.capture_attention`
  records). ``signed``: the map as the layer applies it to V (w1 ⊙ A1 − λ ⊙ A2 for differential attention, what
  Table 3 reports); ``abs``: |A|, which counts negative (cancelling) mass as attention too;
- needle accuracy (the greedy continuation reproduces the number) and the answer's mean negative log-likelihood
  per token given the prompt (teacher-forced);
- held-out perplexity (bytes) on the State of the Union test split.

Control (:data:`CONTROL`, stated before any comparison): the baseline (the first variant, a Transformer) must
retrieve at least 80 % of the held-out needles at the trained length; below that the attention of models that do
not retrieve would be compared, and the report says inconclusive.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..data import get_dataset
from ..eval.language import perplexity
from ..factory import create_model, from_pretrained
from ..train.optim import warmup_cosine
from ..train.step import fit
from . import claims
from .base import Study, StudyConfig
from .common import (
    minimum_errors,
    needle_attention,
    needle_batches,
    needle_budget_errors,
    needle_lm_loss,
    require_datasets,
)
from .protocol import PROTOCOL_DEFAULTS, lr_text, protocol_errors
from .report import Control, Metric, run_seeds

__all__ = ["NoiseStudy", "VARIANTS", "DEFAULTS", "CONTROL", "train_lm"]

#: variant → (registered model, label)
VARIANTS: dict[str, tuple[str, str]] = {
    "lm": ("lm_tiny", "Transformer"),
    "diff_lm": ("diff_lm_tiny", "Diff Transformer"),
    "dg_lm": ("dg_lm_tiny", "DG Transformer"),
}
#: the variants a config without ``variants`` compares (``dg_lm`` on request)
DEFAULT_VARIANTS = ["lm", "diff_lm"]
#: the positive control: the baseline retrieves at least 80 % of the needles at the trained prompt length
CONTROL = Control("baseline needle accuracy at the trained length (%)", "accuracy", 80.0, scale=100.0)
#: the budget (diffattn/configs/studies/noise.yaml)
DEFAULTS: dict[str, Any] = {
    "steps": 2400, "batch_size": 16, "block_size": 128, "lr": 3.0e-3, "weight_decay": 0.1, "warmup_steps": 30,
    "needle_fraction": 0.5,
    "model": {"vocab_size": 256, "dim": 64, "depth": 2, "num_heads": 4, "num_kv_heads": 4},
    "prompt_length": 124, "depths": [0.25, 0.5, 0.75], "trials": 6, "ppl_bytes": 8000, "threads": 1,
    **PROTOCOL_DEFAULTS,
}


def train_lm(cfg: dict[str, Any], model_name: str, seed: int, run_dir: Path, text: str,
             progress: bool = True) -> dict:
    """``model_name`` (registered, with ``cfg["model"]``) trained from scratch on :func:`~.common.needle_batches` of
    ``text`` with :func:`~.common.needle_lm_loss` (AdamW, linear warm-up then cosine decay to 0.1 · lr, gradients
    clipped at 1); saved to ``<run_dir>/model``. Returns ``{"final_loss" (mean of the last 10 steps), "seconds"}``."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    sizes = dict(cfg["model"])  # the config's num_kv_heads is an attention setting: it updates the registered spec
    attention = {"num_kv_heads": sizes.pop("num_kv_heads")} if "num_kv_heads" in sizes else {}
    model = create_model(model_name, **sizes, attention=attention, max_seq_len=cfg["block_size"])
    steps, warm = cfg["steps"], cfg["warmup_steps"]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"], betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warm, 0.1))
    batches = needle_batches(text, steps=steps, batch_size=cfg["batch_size"], block_size=cfg["block_size"],
                             needle_fraction=cfg["needle_fraction"], prompt_length=cfg["prompt_length"], seed=seed)
    losses = fit(model, opt, sched, batches, lambda m, b: needle_lm_loss(m(b[0]), b[1]), total=steps,
                 log=print if progress else None, log_every=max(1, steps // 10), desc=f"{model_name} step")
    model.eval()
    model.save_pretrained(run_dir / "model")
    return {"final_loss": sum(losses[-10:]) / len(losses[-10:]), "mean_loss": sum(losses) / len(losses),
            "seconds": round(time.perf_counter() - t0, 1)}


def _byte_perplexity(model, text: str, tokens: int, context: int) -> float:
    ids = torch.tensor(list(text.encode("utf-8"))[:tokens])
    return perplexity(model, ids, context_length=context, stride=context // 2)["ppl"]


class NoiseStudy(Study, name="noise", title="Study: attention noise, standard vs differential LM", variants=VARIANTS,
                 default_variants=DEFAULT_VARIANTS, defaults=DEFAULTS, control=CONTROL):
    """The noise study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("steps", "batch_size", "block_size", "prompt_length", "trials", "ppl_bytes",
                                      "threads"), where)
        errors += needle_budget_errors(cfg, "prompt_length", where)
        if not cfg["depths"] or any(not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in cfg["depths"]):
            errors.append(f"depths in {where} must be a non-empty list of numbers in [0, 1], got {cfg['depths']!r}")
        errors += protocol_errors(cfg, where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every variant at every seed (``<out>/seed<k>/<variant>/`` run folders), aggregated."""
        require_datasets(["state_of_the_union"], "the noise study")
        torch.set_num_threads(cfg["threads"])
        train_text = "\n\n".join(get_dataset("state_of_the_union", split="train").texts)
        held_out = "\n\n".join(get_dataset("state_of_the_union", split="test").texts)

        def one_seed(seed: int, folder: Path) -> dict:
            res = {}
            for v in cfg["variants"]:
                name, label = VARIANTS[v]
                print(f"[study noise] seed {seed}: {label} ({name}) -> {folder / v}", flush=True)
                trained = train_lm(cfg, name, seed, folder / v, train_text, progress)
                model = from_pretrained(folder / v / "model").eval()
                r = needle_attention(model, held_out, length=cfg["prompt_length"], depths=cfg["depths"],
                                     trials=cfg["trials"], seed=seed)
                r.update(final_loss=trained["final_loss"], mean_train_loss=trained["mean_loss"],
                         train_seconds=trained["seconds"],
                         ppl=_byte_perplexity(model, held_out, cfg["ppl_bytes"], cfg["block_size"]),
                         params=sum(p.numel() for p in model.parameters()))
                res[label] = r
                print(f"[study noise] {label}: answer/context share {r['answer_share']:.3f}/"
                      f"{r['noise_share']:.3f}, needle acc {r['accuracy']:.2f}, ppl {r['ppl']:.2f}, "
                      f"{trained['seconds']:.0f} s training", flush=True)
            return res

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        first = next(iter(next(iter(per_seed.values())).values()))
        m = cfg["model"]
        intro = (f"Standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3): {m['depth']} layers, width "
                 f"{m['dim']}, {m['num_heads']} heads, byte-level ({first['params']:,} parameters for the first "
                 f"variant), trained from scratch on the State of the Union train split for {cfg['steps']} steps of "
                 f"{cfg['batch_size']} × {cfg['block_size']} bytes (AdamW {lr_text(cfg)}), "
                 f"{100 * cfg['needle_fraction']:.0f} % of each batch needle prompts of {cfg['prompt_length']} bytes "
                 f"with their answers. Probe: needle prompts of the trained length ({cfg['prompt_length']} bytes) in "
                 f"held-out State of the Union text, depths {cfg['depths']}, {cfg['trials']} prompts per depth. "
                 f"Attention mass from the last query position, mean over prompts, heads and layers: share = |map| "
                 f"over its row's Σ|map| (primary: one scale for every kind, where a differential row's signed sum is "
                 f"1 − λ), signed = the map the layer applies to V, abs = |map|. Perplexity: bytes of the test split "
                 f"({cfg['ppl_bytes']:,}).")
        metrics = [Metric("answer-span attention share (|·| over its row)", "answer_share", 1.0, 4,
                          claim=claims.ANSWER_MASS),
                   Metric("context attention share outside the answer (|·| over its row)", "noise_share", 1.0, 4,
                          False, claim=claims.CONTEXT_MASS),
                   Metric("answer / context ratio (share)", "ratio_share", 1.0, 3),
                   Metric("answer-span attention mass (signed)", "answer_signed", 1.0, 4),
                   Metric("context attention mass outside the answer (signed)", "noise_signed", 1.0, 4, False),
                   Metric("answer / context ratio (signed)", "ratio_signed", 1.0, 3),
                   Metric("answer-span attention mass (|·|)", "answer_abs", 1.0, 4),
                   Metric("context attention mass outside the answer (|·|)", "noise_abs", 1.0, 4, False),
                   Metric("answer / context ratio (|·|)", "ratio_abs", 1.0, 3),
                   Metric("needle accuracy (%)", "accuracy", 100.0, 1),
                   Metric("answer NLL (nats / byte)", "answer_nll", 1.0, 3, False),
                   Metric("held-out perplexity (bytes)", "ppl", 1.0, 3, False, claim=claims.LM_PERPLEXITY),
                   Metric("final train loss", "final_loss", 1.0, 3, False)]
        return self.write_report(cfg, intro, per_seed, metrics, seconds)

    def tuning_score(self, cfg: StudyConfig, result: Mapping[str, Any]) -> tuple[float, float]:
        """Protocol (b)'s ranking of one run (:func:`.protocol.select_lr`), from the training stream alone (the probe's
        held-out text is the same for every seed): minus the area under the training-loss curve (its mean over the
        steps) and minus the final training loss."""
        return -result["mean_train_loss"], -result["final_loss"]

