"""Causal language models: sliding-window perplexity and last-word accuracy on held-out text (DAA (2025) §5);
multi-needle retrieval over depth × context length and the attention mass on the needle vs the rest of the context,
signed and ReLU (Ye et al. 2024 §3.3, §3.4, Table 3); attention diagnostics.

A model with ``new_kv_caches`` (diffattn's ``CausalLM``, released DiffLlama and Motif models converted to it) is
one, and so is the transformers causal LM of a retrofit run (its adapters and LoRA on).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...data import get_dataset
from ...diagnostics import answer_attention, capture_attention
from ...diagnostics.plots import plot_needle_grid
from ..language import lambada_accuracy, needle_grid, needle_prompt, perplexity
from ..text_models import get_text_tokenizer
from .base import EvalContext, EvalKind, attention_diagnostics, bare_model

__all__ = ["LM"]

#: the dataset a causal LM is evaluated on when neither a dataset nor a text file is given
DEFAULT_DATASET = "moby_dick"


def recognises(model: nn.Module, layout: str) -> bool:
    """A causal LM: ``new_kv_caches``, or the model of a retrofit run (layout ``retrofit*``)."""
    return layout.startswith("retrofit") or hasattr(model, "new_kv_caches")


def _sizes(model) -> tuple[int, int]:
    """(vocabulary, context length) of a diffattn causal LM or a transformers one (peft-wrapped or not)."""
    vocab, ctx = getattr(model, "vocab_size", None), getattr(model, "max_seq_len", None)
    config = getattr(bare_model(model), "config", None)
    if not isinstance(vocab, int):
        vocab = getattr(config, "vocab_size", None)
    if not isinstance(ctx, int):
        ctx = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None) or 2048
    return int(vocab), int(ctx)


def _text(text: str | None, dataset: str | None) -> tuple[str, str]:
    """(the held-out text, where it came from): the file ``text``, else the test split of ``dataset``."""
    if text:
        return Path(text).read_text(encoding="utf-8"), str(text)

    name = dataset or DEFAULT_DATASET
    ds = get_dataset(name, split="test")
    return "\n\n".join(ds[i]["text"] for i in range(len(ds))), f"{name} (test split)"


def _find(seq: list[int], sub: list[int]) -> int:
    """Start of the last occurrence of ``sub`` in ``seq``."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    raise ValueError("the needle's number was not found in the prompt")


def run(ctx: EvalContext) -> dict:
    """The language suite on ``ctx.text`` (a file), else the test split of ``ctx.dataset`` (default
    :data:`DEFAULT_DATASET`), tokenised with the run's tokenizer."""
    model, p, out, seed, progress, device = ctx.model, ctx.protocol, ctx.out, ctx.seed, ctx.progress, ctx.device
    vocab, max_len = _sizes(model)
    tok = get_text_tokenizer(None, model_dir=ctx.model_dir, vocab_size=vocab)
    corpus, source = _text(ctx.text, ctx.dataset)
    ids = torch.tensor(tok.encode(corpus)[:p["ppl_tokens"]])
    context = min(max_len, 1024)
    res: dict[str, Any] = {"text": source, "tokenizer": tok.name}
    res["perplexity"] = perplexity(model, ids, context_length=context)
    passages = [s.strip() for s in corpus.replace("\n", " ").split(". ") if len(s.split()) >= 12]
    rng = random.Random(seed)
    passages = rng.sample(passages, min(p["lambada"], len(passages)))
    res["last_word"] = lambada_accuracy(model, tok, passages, max_context=context, progress=progress)
    # a model with learned absolute positions (GPT-2's wpe) cannot read past its context: the prompt leaves room
    # for the answer it generates
    margin = 8 if getattr(getattr(bare_model(model), "config", None), "n_positions", None) else 0
    lengths = [n for n in p["needle_lengths"] if n <= max_len - margin] or [max_len - margin]
    grid = needle_grid(model, tok, corpus[:20000], lengths=lengths, depths=p["needle_depths"],
                       trials=p["needle_trials"], seed=seed, progress=progress)
    res["needle"] = {str(n): {str(d): a for d, a in row.items()} for n, row in grid.items()}
    who = f"{ctx.who} on {source}"
    plots = [plot_needle_grid(grid, out / "needle_grid.png", title=f"needle retrieval\n{who}").name]
    # attention on the needle's number vs the rest of the context (Ye et al. 2024 Table 3), signed and ReLU
    filler = tok.encode(corpus[:20000])
    noise = {"signed": [], "relu": []}
    for _ in range(4):
        prompt, answer = needle_prompt(tok, filler, length=min(lengths), depth=rng.random(), rng=rng)
        pos = _find(prompt, answer)  # the needle's number inside the prompt
        a_mask = torch.zeros(len(prompt), dtype=torch.bool)
        a_mask[pos:pos + len(answer)] = True
        c_mask = torch.ones(len(prompt), dtype=torch.bool)
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.tensor([prompt], device=device))
        maps = [m.combined for m in cap.layers]
        for mode in noise:
            noise[mode].append(answer_attention(maps, a_mask, c_mask, mode=mode))
    res["attention_noise"] = {mode: {k: float(np.mean([r[k] for r in v])) for k in ("answer", "noise")}
                              for mode, v in noise.items()}
    for v in res["attention_noise"].values():
        v["ratio"] = v["answer"] / v["noise"] if v["noise"] else math.inf
    sample_ids = torch.tensor([tok.encode(corpus[:200])[:32]])
    diag, _ = attention_diagnostics(model, model, sample_ids, out, "lm", tokens=None, device=device, who=who)
    res["diagnostics"] = diag
    res["plots"] = plots + diag.pop("plots")
    return res


def sample(protocol: dict) -> str:
    """The tokens the protocol measures perplexity on, in words."""
    return f"{protocol['ppl_tokens']:,} perplexity tokens"


#: the causal LM kind (registered by :mod:`diffattn.eval.kinds`)
LM = EvalKind(
    name="lm", label="causal language model", suite="language",
    groups=("perplexity", "last_word", "needle", "attention_noise"),
    datasets=("moby_dick", "state_of_the_union", "spamassassin"), recognises=recognises, run=run, sample=sample)
