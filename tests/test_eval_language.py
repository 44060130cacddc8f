"""Sliding-window perplexity, LAMBADA last-word accuracy and needle prompts against hand-computed cases."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from diffattn.eval.language import lambada_accuracy, needle_grid, needle_prompt, perplexity
from diffattn.eval.text_models import get_text_tokenizer


class Bigram(torch.nn.Module):
    """logits[t] = table[ids[t]]: the prediction depends on the last token only, so windowing cannot change it."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, ids):
        return self.table[ids]


def test_perplexity_uniform_model_is_vocab_size():
    model = Bigram(torch.zeros(50, 50))
    r = perplexity(model, torch.randint(0, 50, (37,)), context_length=8, stride=3)
    assert r["ppl"] == pytest.approx(50.0) and r["tokens"] == 36


@pytest.mark.parametrize("context_length, stride", [(64, None), (8, None), (8, 7), (8, 3), (5, 1), (2, 1)])
def test_perplexity_scores_every_token_once(context_length, stride):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(11, 11, generator=g)
    ids = torch.randint(0, 11, (30,), generator=g)
    ref = -F.log_softmax(table.double()[ids[:-1]], -1).gather(1, ids[1:, None]).mean().item()
    r = perplexity(Bigram(table), ids, context_length=context_length, stride=stride)
    assert r["tokens"] == 29
    assert r["nll"] == pytest.approx(ref, rel=1e-9)
    assert r["ppl"] == pytest.approx(math.exp(ref), rel=1e-9)


def test_perplexity_window_context_matters_for_a_real_lm():
    from diffattn.models import create_model

    model = create_model("diff_lm_tiny", vocab_size=32, dim=32, depth=1, num_heads=4).eval()
    ids = torch.randint(0, 32, (20,))
    full = perplexity(model, ids, context_length=20)
    with torch.no_grad():
        ref = F.cross_entropy(model(ids[None])[0, :-1].double(), ids[1:]).item()
    assert full["nll"] == pytest.approx(ref, rel=1e-6)
    assert perplexity(model, ids, context_length=4)["nll"] != pytest.approx(ref, rel=1e-6)
    with pytest.raises(ValueError, match="stride must be <= context_length - 1"):
        perplexity(model, ids, context_length=4, stride=4)


def test_lambada_greedy_whole_word():
    tok = get_text_tokenizer("bytes")
    table = torch.zeros(256, 256)
    for a, b in [("e", " "), (" ", "c"), ("c", "a"), ("a", "t")]:
        table[ord(a), ord(b)] = 5.0
    r = lambada_accuracy(Bigram(table), tok, ["the cat", "the cab", "one the cat"], progress=False)
    assert r["accuracy"] == pytest.approx(2 / 3)  # "cab": the last token is predicted as "t"
    # ppl over the 4·3 word tokens: per token −log softmax; the hit tokens have p = e^5 / (e^5 + 255)
    p_hit = math.exp(5) / (math.exp(5) + 255)
    nll = -(11 * math.log(p_hit) + math.log(1 / (math.exp(5) + 255)))
    assert r["ppl"] == pytest.approx(math.exp(nll / 12))
    with pytest.raises(ValueError, match="context and a last word"):
        lambada_accuracy(Bigram(table), tok, ["word"], progress=False)


FILLER = ("Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, "
          "and nothing particular to interest me on shore, I thought I would sail about a little and see the watery "
          "part of the world.")


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_needle_prompt_places_the_needle(depth):
    tok = get_text_tokenizer("bytes")  # one byte per token: character offsets are token offsets
    prompt, answer = needle_prompt(tok, tok.encode(FILLER), length=600, depth=depth, rng=random.Random(1))
    text = tok.decode(prompt)
    assert len(prompt) == 600
    q = text[text.rindex("\nWhat is the magic number of "):]
    city = q.split("of ")[1].split("?")[0]
    needle = f" The magic number of {city} is{tok.decode(answer)}. "
    budget = 600 - len(q) - len(needle)  # filler tokens
    assert text.index(needle) == round(depth * budget)
    assert tok.decode(answer).strip().isdigit() and len(tok.decode(answer).strip()) == 4
    assert text[:20] == (FILLER[:20] if depth > 0 else needle[:20])


def test_needle_prompt_multi_needle_distinct_cities():
    tok = get_text_tokenizer("bytes")
    prompt, answer = needle_prompt(tok, tok.encode(FILLER), length=800, depth=0.3, n_needles=4, rng=random.Random(2))
    text = tok.decode(prompt)
    assert text.count("The magic number of") == 4 + 1  # four needles and the question
    cities = [t.split(" is")[0] for t in text.split("The magic number of ")[1:5]]
    assert len(set(cities)) == 4


def test_needle_grid_runs_on_a_tiny_lm():
    from diffattn.models import create_model

    model = create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=1, num_heads=4).eval()
    grid = needle_grid(model, get_text_tokenizer("bytes"), FILLER, lengths=(160,), depths=(0.0, 1.0), trials=1,
                       progress=False)
    assert set(grid) == {160} and set(grid[160]) == {0.0, 1.0}
    assert all(v in (0.0, 1.0) for v in grid[160].values())
    with pytest.raises(ValueError, match="too short"):
        needle_grid(model, get_text_tokenizer("bytes"), FILLER, lengths=(20,), depths=(0.0,), trials=1,
                    progress=False)
