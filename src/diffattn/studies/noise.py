"""Attention noise on the needle task: standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3).

Ye et al. 2024 (Table 3) report that in key-information retrieval the Diff Transformer puts more attention on the
answer span and less on the rest of the context ("attention noise") than a Transformer. The question only means
something for models that retrieve the needle, so the LMs are trained on the retrieval task itself: causal LMs of
the same size that differ only in their attention (the library's ``lm_tiny`` family, byte-level) are trained from
scratch with the same recipe, seed, batches and budget on the State of the Union train split, where a share
``needle_fraction`` of every batch is needle prompts (:func:`diffattn.eval.language.needle_prompt`: "The magic
number of {city} is {number}." inside State of the Union text at a random depth, then the question) followed by
their answer (:func:`needle_batches`; the loss, :func:`needle_lm_loss`, is the next-byte cross-entropy of the text
windows plus that of the answers, so retrieval is not drowned by the 120-odd filler bytes around each answer). Then
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

import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..data import get_dataset
from ..diagnostics import answer_attention, capture_attention
from ..eval.language import greedy_continuation, needle_prompt, perplexity
from ..eval.text_models import get_text_tokenizer, lm_logits
from ..factory import create_model, from_pretrained
from ..train.loop import fit
from ..train.optim import warmup_cosine
from . import claims
from .base import module_study, require_datasets
from .protocol import PROTOCOL_DEFAULTS, lr_text, protocol_errors
from .report import Control, Metric, run_seeds, write_study

__all__ = ["STUDY",
           "VARIANTS", "DEFAULTS", "CONTROL", "run", "needle_attention", "needle_scores", "needle_batches",
           "needle_lm_loss", "train_lm"]

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

#: the shortest needle prompt in bytes: the longest needle sentence and question (106 bytes) plus some filler
MIN_NEEDLE_LENGTH = 112
#: the answer's length in bytes: " " and a 4-digit number
ANSWER_BYTES = 5


def needle_budget_errors(cfg: dict[str, Any], length_key: str, where: str) -> list[str]:
    """The constraints of a budget that mixes needle prompts of ``cfg[length_key]`` bytes into training windows of
    ``cfg["block_size"]`` bytes at the share ``cfg["needle_fraction"]`` (this study and the retrofit study)."""
    errors, length = [], cfg[length_key]
    if length < MIN_NEEDLE_LENGTH:
        errors.append(f"{length_key} in {where} must be >= {MIN_NEEDLE_LENGTH} (a needle and the question take up "
                      f"to {MIN_NEEDLE_LENGTH - 6} bytes), got {length}")
    if length + ANSWER_BYTES > cfg["block_size"] + 1:
        errors.append(f"{length_key} in {where} must be <= block_size - {ANSWER_BYTES - 1} "
                      f"({cfg['block_size'] - ANSWER_BYTES + 1}: a training window holds the prompt and its "
                      f"{ANSWER_BYTES}-byte answer), got {length}")
    if not 0.0 <= cfg["needle_fraction"] <= 1.0:
        errors.append(f"needle_fraction in {where} must be in [0, 1] (the share of each batch that is needle "
                      f"prompts), got {cfg['needle_fraction']}")
    return errors


def check_config(cfg: dict[str, Any], where: str) -> None:
    errors: list[str] = []  # every constraint the config breaks, reported together
    for key in ("steps", "batch_size", "block_size", "prompt_length", "trials", "ppl_bytes", "threads"):
        if cfg[key] < 1:
            errors.append(f"{key} in {where} must be >= 1, got {cfg[key]}")
    errors += needle_budget_errors(cfg, "prompt_length", where)
    if not cfg["depths"] or any(not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in cfg["depths"]):
        errors.append(f"depths in {where} must be a non-empty list of numbers in [0, 1], got {cfg['depths']!r}")
    errors += protocol_errors(cfg, where)
    if errors:
        raise ValueError("; ".join(errors))


def needle_batches(text: str, *, steps: int, batch_size: int, block_size: int, needle_fraction: float,
                   prompt_length: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (input, target) batches, each (batch_size, block_size), of UTF-8 bytes of ``text``, shifted by one.
    The first round(needle_fraction · batch_size) rows of a batch end with a needle prompt of ``prompt_length``
    bytes (its filler taken from ``text`` at a random place, the needle at a depth uniform in [0, 1]) and its
    answer, after the bytes of ``text`` that precede the filler; their targets are -100 (ignored) except the
    answer's :data:`ANSWER_BYTES`. The other rows are random windows of ``text``, every byte a target. Drawn from
    ``random.Random(seed)`` alone: every model trained with a seed sees the same batches."""
    tok = get_text_tokenizer("bytes")
    ids = list(text.encode("utf-8"))
    n = block_size + 1
    pre = n - prompt_length - ANSWER_BYTES  # text before the prompt, so that every row has n bytes
    if pre < 0 or len(ids) < 2 * n + pre:
        raise ValueError(f"text must hold at least {2 * n + pre} bytes and prompt_length + {ANSWER_BYTES} <= "
                         f"block_size + 1, got {len(ids)} bytes, prompt_length {prompt_length}, block_size "
                         f"{block_size}")
    rng = random.Random(seed)
    needles = round(needle_fraction * batch_size)
    for _ in range(steps):
        rows = []
        for b in range(batch_size):
            if b < needles:
                s = rng.randrange(pre, len(ids) - n)
                prompt, answer = needle_prompt(tok, ids[s:s + n], length=prompt_length, depth=rng.random(), rng=rng)
                rows.append(ids[s - pre:s] + prompt + answer)
            else:
                s = rng.randrange(0, len(ids) - n)
                rows.append(ids[s:s + n])
        x = torch.tensor(rows)  # (B, block_size + 1)
        y = x[:, 1:].clone()  # (B, block_size)
        y[:needles, :-ANSWER_BYTES] = -100  # a needle row is scored on its answer only
        yield x[:, :-1], y


def needle_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss of a :func:`needle_batches` batch: the mean next-byte cross-entropy over the text rows (no ignored
    target) plus the mean over the answer bytes of the needle rows (the targets that are not -100); either term is
    left out when its batch has no such row. logits (B, N, V), targets (B, N)."""
    needle = (targets == -100).any(dim=1)  # (B,)
    terms = [F.cross_entropy(logits[rows].float().flatten(0, 1), targets[rows].flatten(), ignore_index=-100)
             for rows in (~needle, needle) if rows.any()]
    return sum(terms)


def train_lm(cfg: dict[str, Any], model_name: str, seed: int, run_dir: Path, text: str,
             progress: bool = True) -> dict:
    """``model_name`` (registered, with ``cfg["model"]``) trained from scratch on :func:`needle_batches` of
    ``text`` with :func:`needle_lm_loss` (AdamW, linear warm-up then cosine decay to 0.1 · lr, gradients clipped at
    1); saved to ``<run_dir>/model``. Returns ``{"final_loss" (mean of the last 10 steps), "seconds"}``."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = create_model(model_name, **cfg["model"], max_seq_len=cfg["block_size"])
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


def _span(seq: list[int], sub: list[int]) -> int:
    """Start of the last occurrence of ``sub`` in ``seq``."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    raise ValueError(f"the answer tokens {sub} do not occur in the prompt")


@torch.no_grad()
def needle_attention(model, filler_text: str, *, length: int, depths, trials: int, seed: int = 0,
                     attention: bool = True) -> dict:
    """Needle prompts (module docstring) through ``model`` (a byte-level causal LM): answer vs context attention
    mass (signed and |·|; only with ``attention``), accuracy and answer NLL, means over ``len(depths) · trials``
    prompts."""
    tok = get_text_tokenizer("bytes")
    filler = tok.encode(filler_text)
    rng = random.Random(seed)
    sums = {"answer_signed": 0.0, "noise_signed": 0.0, "answer_abs": 0.0, "noise_abs": 0.0, "accuracy": 0.0,
            "answer_nll": 0.0}
    n = 0
    for depth in depths:
        for _ in range(trials):
            prompt, answer = needle_prompt(tok, filler, length=length, depth=float(depth), rng=rng)
            q = _question_index(prompt, tok)  # the body (filler + needle) is prompt[:q]
            start = _span(prompt[:q], answer)
            N = len(prompt)
            if attention:
                with capture_attention(model) as cap:
                    lm_logits(model, torch.tensor([prompt]))  # (1, N)
                maps = cap.combined()  # per layer (1, heads, N, N)
                context = torch.zeros(N, dtype=torch.bool)
                context[:q] = True
                ans = torch.zeros(N, dtype=torch.bool)
                ans[start:start + len(answer)] = True
                for mode in ("signed", "abs"):
                    r = answer_attention(maps, ans, context, query=-1, mode=mode)
                    sums[f"answer_{mode}"] += r["answer"]
                    sums[f"noise_{mode}"] += r["noise"]
            sums["accuracy"] += float(greedy_continuation(model, prompt, len(answer)) == answer)
            full = torch.tensor([prompt + answer])  # (1, N + len(answer))
            logp = F.log_softmax(lm_logits(model, full)[0, N - 1:-1].double(), dim=-1)
            sums["answer_nll"] -= logp.gather(1, torch.tensor(answer)[:, None]).mean().item()
            n += 1
    out = {k: v / n for k, v in sums.items() if attention or k in ("accuracy", "answer_nll")}
    for mode in ("signed", "abs") if attention else ():
        out[f"ratio_{mode}"] = out[f"answer_{mode}"] / out[f"noise_{mode}"] if out[f"noise_{mode}"] else math.inf
    out["prompts"] = n
    return out


def needle_scores(model, filler_text: str, *, length: int, depths, trials: int, seed: int = 0) -> dict:
    """``{"accuracy", "answer_nll", "prompts"}`` of the needle prompts, without attention maps (any causal LM that
    :func:`diffattn.eval.text_models.lm_logits` runs)."""
    return needle_attention(model, filler_text, length=length, depths=depths, trials=trials, seed=seed,
                            attention=False)


def _question_index(prompt: list[int], tok) -> int:
    """Index where the question ("\\nWhat is the magic number of …") starts."""
    return _span(prompt, tok.encode("\nWhat is the magic number of "))


def _byte_perplexity(model, text: str, tokens: int, context: int) -> float:
    ids = torch.tensor(list(text.encode("utf-8"))[:tokens])
    return perplexity(model, ids, context_length=context, stride=context // 2)["ppl"]


def _per_seed(cfg: dict[str, Any], progress: bool = True) -> dict[int, dict]:
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
            print(f"[study noise] {label}: answer/context mass (signed) {r['answer_signed']:.3f}/"
                  f"{r['noise_signed']:.3f}, needle acc {r['accuracy']:.2f}, ppl {r['ppl']:.2f}, "
                  f"{trained['seconds']:.0f} s training", flush=True)
        return res

    return run_seeds(cfg, one_seed)


def _report(cfg: dict[str, Any], per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
    """The tables of ``per_seed`` (:func:`~diffattn.studies.report.write_study`)."""
    out = Path(cfg["out"])
    first = next(iter(next(iter(per_seed.values())).values()))
    m = cfg["model"]
    intro = (f"Standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3): {m['depth']} layers, width "
             f"{m['dim']}, {m['num_heads']} heads, byte-level ({first['params']:,} parameters for the first variant), "
             f"trained from scratch on the State of the Union train split for {cfg['steps']} steps of "
             f"{cfg['batch_size']} × {cfg['block_size']} bytes (AdamW {lr_text(cfg)}), "
             f"{100 * cfg['needle_fraction']:.0f} % of each batch needle prompts of {cfg['prompt_length']} bytes with "
             f"their answers. Probe: needle prompts of the trained length ({cfg['prompt_length']} bytes) in held-out "
             f"State of the Union text, depths {cfg['depths']}, {cfg['trials']} prompts per depth. Attention mass "
             f"from the last query position, mean over prompts, heads and layers: signed = the map the layer applies "
             f"to V, abs = |map|. Perplexity: bytes of the test split ({cfg['ppl_bytes']:,}).")
    metrics = [Metric("answer-span attention mass (signed)", "answer_signed", 1.0, 4, claim=claims.ANSWER_MASS),
               Metric("context attention mass outside the answer (signed)", "noise_signed", 1.0, 4, False,
                      claim=claims.CONTEXT_MASS),
               Metric("answer / context ratio (signed)", "ratio_signed", 1.0, 3),
               Metric("answer-span attention mass (|·|)", "answer_abs", 1.0, 4),
               Metric("context attention mass outside the answer (|·|)", "noise_abs", 1.0, 4, False),
               Metric("answer / context ratio (|·|)", "ratio_abs", 1.0, 3),
               Metric("needle accuracy (%)", "accuracy", 100.0, 1),
               Metric("answer NLL (nats / byte)", "answer_nll", 1.0, 3, False),
               Metric("held-out perplexity (bytes)", "ppl", 1.0, 3, False, claim=claims.LM_PERPLEXITY),
               Metric("final train loss", "final_loss", 1.0, 3, False)]
    return write_study(out, cfg, "Study: attention noise, standard vs differential LM", intro, per_seed, metrics,
                       seconds, control=CONTROL)


def tuning_score(cfg: dict[str, Any], result: dict[str, Any]) -> tuple[float, float]:
    """Protocol (b)'s ranking of one run (:func:`.protocol.select_lr`), from the training stream alone (the probe's
    held-out text is the same for every seed): minus the area under the training-loss curve (its mean over the
    steps) and minus the final training loss."""
    return -result["mean_train_loss"], -result["final_loss"]


STUDY = module_study("noise", variants=VARIANTS, defaults=DEFAULTS, check_config=check_config,
                     control=CONTROL, per_seed=_per_seed, report=_report,
                     default_variants=DEFAULT_VARIANTS, tuning_score=tuning_score)


def run(cfg: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Every variant at every seed, aggregated (module docstring). The 0.1.0 entry point, kept as an alias of
    ``STUDY.execute``; removed in 0.3.0."""
    return STUDY.execute(cfg, progress)
