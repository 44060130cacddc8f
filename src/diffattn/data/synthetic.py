"""Synthetic retrieval tasks with their own small vocabulary: multi-needle retrieval and multi-query associative
recall. Everything is generated from a seed; no external data.

    vocab = SyntheticVocab()
    g = torch.Generator().manual_seed(0)
    b = needle_batch(8, length=64, needles=4, queried=2, depth=0.5, generator=g, vocab=vocab)
    b.ids            # (8, 64) token ids
    b.answer_pos     # (8, 2) positions whose next-token prediction is an answer
    b.answers        # (8, 2) the answer tokens: ids[answer_pos + 1]
    b.answer_span    # (8, 2) where each answer stands in the context

Vocabulary (:class:`SyntheticVocab`): ``PAD`` 0 (reserved for padding; the generators never emit it), ``NEEDLE``
1, ``QUERY`` 2, then ``num_keys`` key tokens, ``num_values`` value tokens and ``num_filler`` distractor tokens, four
disjoint ranges.

**Multi-needle retrieval** (:func:`needle_batch`; the protocol of Ye et al. 2024, "Differential Transformer", §3.4
and Table 2, shrunk to single tokens): a context of ``length − 3R`` tokens of random distractor tokens holds N
needles ``NEEDLE key value`` (N distinct keys, values drawn with replacement) in non-overlapping 3-token slots; the
first needle's slot sits at relative depth ``depth`` (0 = first slot, 1 = last; None: a random slot) and the others
at random free slots. R of the needles (the first R) are then asked for, one ``QUERY key value`` triple each: the
model reads ``QUERY key`` and must predict ``value``.

**Multi-query associative recall** (:func:`mqar_batch`; MQAR of Arora et al. 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models", §3): P key–value pairs ``k1 v1 … kP vP`` (distinct keys), then
every key once more in a random order, each followed by its value: ``length = 4P``; the value after each queried
key is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SyntheticVocab", "SyntheticBatch", "needle_batch", "mqar_batch"]

PAD, NEEDLE, QUERY = 0, 1, 2


@dataclass(frozen=True)
class SyntheticVocab:
    """Token ranges of the synthetic tasks (module docstring): 3 special tokens, then keys, values, distractors."""

    num_keys: int = 32
    num_values: int = 32
    num_filler: int = 64

    def __post_init__(self) -> None:
        for name in ("num_keys", "num_values", "num_filler"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")

    @property
    def first_key(self) -> int:
        return 3

    @property
    def first_value(self) -> int:
        return 3 + self.num_keys

    @property
    def first_filler(self) -> int:
        return 3 + self.num_keys + self.num_values

    @property
    def size(self) -> int:
        """The vocabulary size a model needs."""
        return 3 + self.num_keys + self.num_values + self.num_filler

    def is_value(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= self.first_value) & (ids < self.first_filler)


@dataclass
class SyntheticBatch:
    """ids (B, L); answer_pos (B, R): the positions whose next token is an answer; answers (B, R) = ids at
    answer_pos + 1; answer_span (B, R): the context position of each answer's value (its needle or pair);
    context: the number of leading positions that form the context (before the first query)."""

    ids: torch.Tensor
    answer_pos: torch.Tensor
    answers: torch.Tensor
    answer_span: torch.Tensor
    context: int


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (seeded by the caller), got {type(generator).__name__}")
    return generator


def needle_batch(n: int, *, length: int, needles: int, queried: int, depth: float | None,
                 generator: torch.Generator, vocab: SyntheticVocab = SyntheticVocab()) -> SyntheticBatch:
    """``n`` multi-needle samples of ``length`` tokens (module docstring): ``needles`` key–value needles in the
    distractor context, the first ``queried`` of them asked for at the end; the first needle at relative ``depth``
    in [0, 1] (None: anywhere)."""
    _int("n", n, 1)
    _int("needles", needles, 1)
    _int("queried", queried, 1)
    _int("length", length, 1)
    g = _generator(generator)
    if queried > needles:
        raise ValueError(f"queried must be <= needles ({needles}), got {queried}")
    if needles > vocab.num_keys:
        raise ValueError(f"needles must be <= vocab.num_keys ({vocab.num_keys}: the keys are distinct), got {needles}")
    context = length - 3 * queried
    slots = context // 3
    if slots < needles:
        raise ValueError(f"length must leave at least 3 · needles context tokens after the {queried} queries "
                         f"(>= {3 * (needles + queried)} for needles={needles}, queried={queried}), got {length}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1):
        raise ValueError(f"depth must be None or a number in [0, 1], got {depth!r}")
    offset = context - 3 * slots  # leading distractor tokens when the context is not a multiple of 3
    ids = vocab.first_filler + torch.randint(vocab.num_filler, (n, length), generator=g)  # (n, L)
    answer_pos = torch.empty(n, queried, dtype=torch.long)
    answers = torch.empty(n, queried, dtype=torch.long)
    span = torch.empty(n, queried, dtype=torch.long)
    for i in range(n):
        keys = vocab.first_key + torch.randperm(vocab.num_keys, generator=g)[:needles]  # (N,)
        values = vocab.first_value + torch.randint(vocab.num_values, (needles,), generator=g)  # (N,)
        first = round(depth * (slots - 1)) if depth is not None else int(torch.randint(slots, (1,), generator=g))
        others = [s for s in torch.randperm(slots, generator=g).tolist() if s != first][:needles - 1]
        for j, s in enumerate([first, *others]):
            p = offset + 3 * s
            ids[i, p], ids[i, p + 1], ids[i, p + 2] = NEEDLE, keys[j], values[j]
            if j < queried:
                span[i, j] = p + 2
        for r in range(queried):
            q = context + 3 * r
            ids[i, q], ids[i, q + 1], ids[i, q + 2] = QUERY, keys[r], values[r]
            answer_pos[i, r], answers[i, r] = q + 1, values[r]
    return SyntheticBatch(ids, answer_pos, answers, span, context)


def mqar_batch(n: int, *, pairs: int, generator: torch.Generator,
               vocab: SyntheticVocab = SyntheticVocab()) -> SyntheticBatch:
    """``n`` MQAR samples of ``4 · pairs`` tokens (module docstring): the pairs, then every key queried once."""
    _int("n", n, 1)
    _int("pairs", pairs, 1)
    g = _generator(generator)
    if pairs > vocab.num_keys:
        raise ValueError(f"pairs must be <= vocab.num_keys ({vocab.num_keys}: the keys are distinct), got {pairs}")
    keys = vocab.first_key + torch.argsort(torch.rand(n, vocab.num_keys, generator=g), dim=1)[:, :pairs]  # (n, P)
    values = vocab.first_value + torch.randint(vocab.num_values, (n, pairs), generator=g)  # (n, P)
    order = torch.argsort(torch.rand(n, pairs, generator=g), dim=1)  # (n, P): which pair each query asks for
    ids = torch.empty(n, 4 * pairs, dtype=torch.long)
    ids[:, 0:2 * pairs:2], ids[:, 1:2 * pairs:2] = keys, values
    ids[:, 2 * pairs::2], ids[:, 2 * pairs + 1::2] = keys.gather(1, order), values.gather(1, order)
    answer_pos = (2 * pairs + 2 * torch.arange(pairs)).expand(n, pairs).clone()  # (n, P)
    return SyntheticBatch(ids, answer_pos, values.gather(1, order), 2 * order + 1, 2 * pairs)
