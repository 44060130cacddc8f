"""Attention noise on the needle task: standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3).

Ye et al. 2024 (Table 3) report that in key-information retrieval the Diff Transformer puts more attention on the
answer span and less on the rest of the context ("attention noise") than a Transformer. Here causal LMs of the same
size that differ only in their attention (the library's ``lm_tiny`` family, byte-level) are trained from scratch
with the same recipe, seed and budget on the State of the Union addresses through ``diffattn train`` (task
``lm``), then probed with needle prompts (:func:`diffattn.eval.language.needle_prompt`: "The magic number of
{city} is {number}." inside held-out State of the Union text, at several depths, then the question):

- attention mass on the answer span (the needle's number) vs the rest of the context, from the last query position
  (the one that predicts the answer), mean over prompts, heads and layers
  (:func:`diffattn.diagnostics.answer_attention` on the maps :func:`diffattn.diagnostics.capture_attention`
  records). ``signed``: the map as the layer applies it to V (w1 ⊙ A1 − λ ⊙ A2 for differential attention, what
  Table 3 reports); ``abs``: |A|, which counts negative (cancelling) mass as attention too;
- needle accuracy (the greedy continuation reproduces the number) and the answer's mean negative log-likelihood
  per token given the prompt (teacher-forced; more sensitive than accuracy for small models);
- held-out perplexity (bytes) on the State of the Union test split.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .report import Control, Metric, run_seeds, write_study

__all__ = ["VARIANTS", "DEFAULTS", "CONTROL", "run", "needle_attention", "needle_scores", "train_lm"]

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
    "steps": 250, "batch_size": 16, "block_size": 128, "lr": 3.0e-3, "weight_decay": 0.1, "warmup_steps": 30,
    "model": {"vocab_size": 256, "dim": 64, "depth": 2, "num_heads": 4, "num_kv_heads": 4},
    "prompt_length": 128, "depths": [0.25, 0.5, 0.75], "trials": 6, "ppl_bytes": 8000, "threads": 1,
}

#: the shortest needle prompt in bytes: the longest needle sentence and question (106 bytes) plus some filler
MIN_NEEDLE_LENGTH = 112


def check_config(cfg: dict[str, Any], where: str) -> None:
    errors: list[str] = []  # every constraint the config breaks, reported together
    for key in ("steps", "batch_size", "block_size", "prompt_length", "trials", "ppl_bytes", "threads"):
        if cfg[key] < 1:
            errors.append(f"{key} in {where} must be >= 1, got {cfg[key]}")
    if cfg["prompt_length"] < MIN_NEEDLE_LENGTH:
        errors.append(f"prompt_length in {where} must be >= {MIN_NEEDLE_LENGTH} (a needle and the question take up "
                      f"to {MIN_NEEDLE_LENGTH - 6} bytes), got {cfg['prompt_length']}")
    if cfg["prompt_length"] > cfg["block_size"]:
        errors.append(f"prompt_length in {where} must be <= block_size ({cfg['block_size']}, the context the "
                      f"models are trained on), got {cfg['prompt_length']}")
    if not cfg["depths"] or any(not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in cfg["depths"]):
        errors.append(f"depths in {where} must be a non-empty list of numbers in [0, 1], got {cfg['depths']!r}")
    if errors:
        raise ValueError("; ".join(errors))


def train_lm(cfg: dict[str, Any], model_name: str, seed: int, run_dir: Path, progress: bool = True) -> dict:
    """``diffattn train`` (task ``lm``) of ``model_name`` on the State of the Union addresses as UTF-8 bytes."""
    from ..train.config import config_from_dict
    from ..train.loop import train

    tc = config_from_dict({
        "task": {"name": "lm"},
        "model": {"name": model_name, "overrides": {**cfg["model"], "max_seq_len": cfg["block_size"]}},
        "data": {"name": "state_of_the_union", "tokenizer": "bytes", "block_size": cfg["block_size"]},
        "optim": {"lr": cfg["lr"], "weight_decay": cfg["weight_decay"], "warmup_steps": cfg["warmup_steps"]},
        "run": {"steps": cfg["steps"], "batch_size": cfg["batch_size"], "seed": seed, "threads": cfg["threads"],
                "log_every": max(1, cfg["steps"] // 10), "ckpt_every": cfg["steps"], "keep_last": 1,
                "progress": progress},
    })
    return train(tc, out=run_dir, overwrite=True)  # a seed without results is trained again


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
    from ..diagnostics import answer_attention, capture_attention
    from ..eval.language import greedy_continuation, needle_prompt
    from ..eval.text_models import get_text_tokenizer, lm_logits

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
    from ..eval.language import perplexity

    ids = torch.tensor(list(text.encode("utf-8"))[:tokens])
    return perplexity(model, ids, context_length=context, stride=context // 2)["ppl"]


def run(cfg: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Every variant at every seed (``<out>/seed<k>/<variant>/`` run folders), aggregated."""
    from ..data import dataset_info, get_dataset
    from ..data._common import SETUP_COMMAND, DatasetNotInstalledError
    from ..models import from_pretrained

    if not dataset_info("state_of_the_union").installed():
        raise DatasetNotInstalledError(f"the noise study needs the State of the Union addresses; install them with "
                                       f"`{SETUP_COMMAND} state_of_the_union` or set DIFFATTN_DATA to the folder "
                                       f"holding them")
    held_out = "\n\n".join(get_dataset("state_of_the_union", split="test").texts)
    out = Path(cfg["out"])
    t0 = time.perf_counter()

    def one_seed(seed: int, folder: Path) -> dict:
        res = {}
        for v in cfg["variants"]:
            name, label = VARIANTS[v]
            print(f"[study noise] seed {seed}: {label} ({name}) -> {folder / v}", flush=True)
            t1 = time.perf_counter()
            result = train_lm(cfg, name, seed, folder / v, progress)
            train_s = time.perf_counter() - t1
            model = from_pretrained(folder / v / "model").eval()
            r = needle_attention(model, held_out, length=cfg["prompt_length"], depths=cfg["depths"],
                                 trials=cfg["trials"], seed=seed)
            r.update(final_loss=result["final_loss"], train_seconds=round(train_s, 1),
                     ppl=_byte_perplexity(model, held_out, cfg["ppl_bytes"], cfg["block_size"]),
                     params=sum(p.numel() for p in model.parameters()))
            res[label] = r
            print(f"[study noise] {label}: answer/context mass (signed) {r['answer_signed']:.3f}/"
                  f"{r['noise_signed']:.3f}, needle acc {r['accuracy']:.2f}, ppl {r['ppl']:.2f}, "
                  f"{train_s:.0f} s training", flush=True)
        return res

    per_seed = run_seeds(cfg, one_seed)
    first = next(iter(next(iter(per_seed.values())).values()))
    m = cfg["model"]
    intro = (f"Standard vs differential causal LMs (Ye et al. 2024, §3.4, Table 3): {m['depth']} layers, width "
             f"{m['dim']}, {m['num_heads']} heads, byte-level ({first['params']:,} parameters for the first variant), "
             f"trained from scratch on the State of the Union train split for {cfg['steps']} steps of "
             f"{cfg['batch_size']} × {cfg['block_size']} bytes (AdamW lr {cfg['lr']:g}). Needle prompts of "
             f"{cfg['prompt_length']} bytes in held-out State of the Union text, depths {cfg['depths']}, "
             f"{cfg['trials']} prompts per depth. Attention mass from the last query position, mean over prompts, "
             f"heads and layers: signed = the map the layer applies to V, abs = |map|. Perplexity: bytes of the "
             f"test split ({cfg['ppl_bytes']:,}).")
    metrics = [Metric("answer-span attention mass (signed)", "answer_signed", 1.0, 4),
               Metric("context attention mass outside the answer (signed)", "noise_signed", 1.0, 4, False),
               Metric("answer / context ratio (signed)", "ratio_signed", 1.0, 3),
               Metric("answer-span attention mass (|·|)", "answer_abs", 1.0, 4),
               Metric("context attention mass outside the answer (|·|)", "noise_abs", 1.0, 4, False),
               Metric("answer / context ratio (|·|)", "ratio_abs", 1.0, 3),
               Metric("needle accuracy (%)", "accuracy", 100.0, 1),
               Metric("answer NLL (nats / byte)", "answer_nll", 1.0, 3, False),
               Metric("held-out perplexity (bytes)", "ppl", 1.0, 3, False),
               Metric("final train loss", "final_loss", 1.0, 3, False)]
    return write_study(out, cfg, "Study: attention noise, standard vs differential LM", intro, per_seed, metrics,
                       time.perf_counter() - t0, control=CONTROL)
