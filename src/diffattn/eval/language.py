"""Language-model evaluations: sliding-window perplexity, LAMBADA-style last-word accuracy and the Diff
Transformer's multi-needle retrieval over a depth × context-length grid.

Perplexity (the strided sliding window of Hugging Face's perplexity guide): windows of at most ``context_length``
tokens advance by ``stride``; each window scores only the tokens no earlier window scored, so every token after the
first is scored exactly once, with at least ``context_length − stride`` tokens of left context.
PPL = exp(mean NLL) over the scored tokens (DAA (2025) §5 reports it for its retrofits).

LAMBADA (Paperno et al. 2016): the context is the passage up to its last word; the model decodes greedily as many
tokens as the last word (with its leading space) has, and is right only when all of them match.

Multi-needle retrieval (Ye et al. 2024 §3.3, Fig. 4): N needles "The magic number of {city} is {number}." are
placed in real filler text; the needle asked about sits at a fractional depth d of the context, the others at
random depths; the prompt ends with "What is the magic number of {city}? The magic number of {city} is" and the
answer counts when the greedy continuation reproduces the number's tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..progress import progress as progress_bar
from ._checks import check_int
from .text_models import Tokenizer, lm_logits

__all__ = ["perplexity", "lambada_accuracy", "greedy_continuation", "NEEDLE_CITIES", "needle_prompt",
           "needle_grid"]


@torch.no_grad()
def perplexity(model, ids, *, context_length: int = 1024, stride: int | None = None) -> dict[str, float]:
    """``{"nll", "ppl", "tokens"}`` of a 1-D token sequence ``ids`` with strided windows (module docstring).

    Each window scores the next ``stride`` not-yet-scored tokens and ends at the last of them, so it holds at most
    ``context_length`` tokens and every scored token sees at least ``context_length − stride`` tokens of context
    (its whole prefix in the first window). Every token after the first is scored exactly once. ``stride``
    defaults to ``context_length − 1`` (consecutive windows share one token) and must be at most that.
    """
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.dtype.is_floating_point or len(ids) < 2:
        raise ValueError(f"ids must be a 1-D integer sequence of at least 2 tokens, got shape {tuple(ids.shape)} "
                         f"dtype {ids.dtype}")
    check_int("context_length", context_length, 2)
    stride = context_length - 1 if stride is None else stride
    check_int("stride", stride)
    if stride > context_length - 1:
        raise ValueError(f"stride must be <= context_length - 1 ({context_length - 1}): a window of "
                         f"context_length tokens predicts at most that many, got {stride}")
    device = next(model.parameters()).device
    N = len(ids)
    total, count = 0.0, 0
    for first in range(1, N, stride):  # score targets first .. end-1
        end = min(first + stride, N)
        start = max(0, end - context_length)
        window = ids[start:end].to(device)[None]  # (1, L), L <= context_length
        logp = F.log_softmax(lm_logits(model, window)[0].double(), dim=-1)  # row j predicts ids[start + j + 1]
        rows = torch.arange(first - 1 - start, end - 1 - start, device=device)
        total -= logp[rows].gather(1, ids[first:end].to(device)[:, None]).sum().item()
        count += end - first
    nll = total / count
    return {"nll": nll, "ppl": math.exp(nll), "tokens": count}


@torch.no_grad()
def greedy_continuation(model, ids: list[int], n: int) -> list[int]:
    """The ``n`` tokens a model appends to ``ids`` by greedy (argmax) decoding, recomputing the prefix each step
    (works for any model that maps (1, N) ids to logits)."""
    device = next(model.parameters()).device
    seq = list(ids)
    for _ in range(n):
        logits = lm_logits(model, torch.tensor([seq], device=device))[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(ids):]


def _split_last_word(text: str) -> tuple[str, str]:
    text = text.rstrip()
    cut = text.rfind(" ")
    if cut <= 0:
        raise ValueError(f"each LAMBADA passage needs a context and a last word separated by a space, got {text!r}")
    return text[:cut], text[cut:]


@torch.no_grad()
def lambada_accuracy(model, tokenizer: Tokenizer, texts: Sequence[str], *, max_context: int | None = None,
                     progress: bool = True) -> dict[str, float]:
    """``{"accuracy", "ppl", "examples"}``: greedy whole-last-word accuracy and the perplexity of the last word's
    tokens given the context (Paperno et al. 2016; module docstring). ``max_context`` keeps the last tokens."""
    if isinstance(texts, str) or not len(texts):
        raise ValueError("texts must be a non-empty sequence of passages")
    device = next(model.parameters()).device
    hits, nll, n_tok = 0, 0.0, 0
    for text in progress_bar(texts, desc="LAMBADA", disable=not progress, leave=False):
        context, word = _split_last_word(text)
        c, w = tokenizer.encode(context), tokenizer.encode(word)
        if max_context is not None:
            c = c[-(max_context - len(w)):]
        seq = torch.tensor([c + w], device=device)
        logp = F.log_softmax(lm_logits(model, seq)[0, len(c) - 1:-1].double(), dim=-1)  # predicts the word's tokens
        target = torch.tensor(w, device=device)
        nll -= logp.gather(1, target[:, None]).sum().item()
        n_tok += len(w)
        hits += bool((logp.argmax(-1) == target).all())  # teacher-forced argmax = greedy decoding when all match
    return {"accuracy": hits / len(texts), "ppl": math.exp(nll / n_tok), "examples": len(texts)}


#: Cities for the needles (Ye et al. 2024 §3.3 uses "the magic number of {city}").
NEEDLE_CITIES: tuple[str, ...] = (
    "Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Delhi", "Quito", "Dakar", "Hanoi", "Riga", "Perth", "Austin",
    "Boston", "Madrid", "Nairobi", "Seoul", "Vienna", "Dublin", "Prague", "Lisbon",
)


def needle_prompt(tokenizer: Tokenizer, filler: list[int], *, length: int, depth: float, n_needles: int = 1,
                  rng: random.Random) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids): ``length`` tokens of filler (cycled from ``filler``) with ``n_needles`` needle
    sentences inserted, the queried one at fraction ``depth`` of the filler and the rest at random depths, then
    the question. Numbers are 4-digit, cities distinct."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    check_int("n_needles", n_needles)
    if n_needles > len(NEEDLE_CITIES):
        raise ValueError(f"n_needles must be <= {len(NEEDLE_CITIES)}, got {n_needles}")
    cities = rng.sample(NEEDLE_CITIES, n_needles)
    numbers = [rng.randrange(1000, 10000) for _ in cities]
    city, number = cities[0], numbers[0]
    question = tokenizer.encode(f"\nWhat is the magic number of {city}? The magic number of {city} is")
    needles = [tokenizer.encode(f" The magic number of {c} is {n}. ") for c, n in zip(cities, numbers)]
    budget = length - len(question) - sum(len(n) for n in needles)
    if budget < 1:
        raise ValueError(f"length={length} is too short for {n_needles} needles and the question")
    reps = -(-budget // len(filler))
    body = (filler * reps)[:budget]
    positions = [round(depth * budget)] + [rng.randrange(0, budget + 1) for _ in needles[1:]]
    for pos, needle in sorted(zip(positions, needles), key=lambda t: -t[0]):  # insert from the back
        body[pos:pos] = needle
    return body + question, tokenizer.encode(f" {number}")


@torch.no_grad()
def needle_grid(model, tokenizer: Tokenizer, filler_text: str, *, lengths: Sequence[int] = (256, 512, 1024),
                depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), n_needles: int = 1, trials: int = 5,
                seed: int = 0, progress: bool = True) -> dict[int, dict[float, float]]:
    """``{length: {depth: accuracy}}`` of multi-needle retrieval (module docstring) over ``trials`` random
    needle sets per cell. ``filler_text`` is real prose (e.g. a corpus from :func:`diffattn.data.get_dataset`)."""
    filler = tokenizer.encode(filler_text)
    if len(filler) < 16:
        raise ValueError(f"filler_text must hold real text (at least 16 tokens), got {len(filler)} tokens")
    check_int("trials", trials)
    rng = random.Random(seed)
    grid: dict[int, dict[float, float]] = {}
    cells = [(n, d) for n in lengths for d in depths]
    for n, d in progress_bar(cells, desc="needles", disable=not progress, leave=False):
        hits = 0
        for _ in range(trials):
            prompt, answer = needle_prompt(tokenizer, filler, length=n, depth=d, n_needles=n_needles, rng=rng)
            hits += greedy_continuation(model, prompt, len(answer)) == answer
        grid.setdefault(int(n), {})[float(d)] = hits / trials
    return grid
