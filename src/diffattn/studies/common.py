"""The code more than one study runs, in one place: the MQAR training stream, the one "data not installed" error, and
the needle prompts of the LM studies (their training stream, loss, budget constraints and probe).

- :func:`mqar_stream`: the MQAR training stream of the synthetic studies (:mod:`.needles`, :mod:`.recall`,
  :mod:`.recall_ablation`) and ``scripts/recall_crosscheck_hf.py`` (Arora et al. 2023);
- :func:`require_datasets`: the error a study raises when an offline dataset it reads is not installed;
- :func:`minimum_errors`: the messages of the budget counts (steps, batch sizes, samples, threads) below their least
  value, with which every study's :meth:`~diffattn.studies.base.Study.check` starts; :func:`increasing_ints` and
  :func:`vocab_errors`: the checks of the MQAR budgets' lists and vocabulary (:mod:`.recall`, :mod:`.recall_ablation`);
- :func:`vlm_metrics`, :func:`pope_control`: the report rows and the positive control of the VLM studies
  (:mod:`.llava`, :mod:`.paligemma`): VQA, POPE (Li et al. 2023), MMNeedle (Wang et al. 2024) and the decoder's
  attention on the image tokens;
- :func:`needle_batches`, :func:`needle_lm_loss`, :func:`needle_budget_errors`: byte-level LM training windows of
  which a share are needle prompts (:func:`diffattn.eval.language.needle_prompt`: "The magic number of {city} is
  {number}." inside filler text, then the question) followed by their answer, scored on the text and on the
  answers (:mod:`.noise`, :mod:`.retrofit`);
- :func:`needle_attention`, :func:`needle_scores`: needle prompts in held-out text through a trained causal LM:
  answer vs context attention mass (Ye et al. 2024, §3.4, Table 3), accuracy and answer NLL.

Figures: :func:`diffattn.diagnostics.plots.pyplot` and :func:`~diffattn.diagnostics.plots.save_figure`; metric
directions: :func:`diffattn.directions.higher_is_better`; the ``--set`` parser: :func:`diffattn.configs.apply_sets`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..data import SETUP_COMMAND, DatasetNotInstalledError, dataset_info, default_root
from ..data.synthetic import SyntheticBatch, SyntheticVocab, mqar_batch
from ..data.vqa import POPE_SPLITS
from ..diagnostics import answer_attention, capture_attention
from ..eval.language import greedy_continuation, needle_prompt
from ..eval.text_models import get_text_tokenizer, lm_logits
from .report import Control, Metric
from .verdict import PaperEffect

__all__ = ["mqar_stream", "require_datasets", "minimum_errors", "increasing_ints", "vocab_errors", "vlm_metrics",
           "pope_control", "MIN_NEEDLE_LENGTH", "ANSWER_BYTES", "needle_budget_errors", "needle_batches",
           "needle_lm_loss", "needle_attention", "needle_scores"]


def mqar_stream(pairs: Sequence[int], batch_size: int, vocab: SyntheticVocab, seed: int) -> Iterator[SyntheticBatch]:
    """The MQAR training stream of a seed (Arora et al. 2023; :func:`diffattn.data.synthetic.mqar_batch`): endless
    batches of ``batch_size`` samples, the number of pairs P drawn uniformly from ``pairs`` per batch, everything from
    one generator seeded with ``seed`` (so every model of a seed sees the same batches in the same order)."""
    pairs = list(pairs)
    g = torch.Generator().manual_seed(seed)
    while True:
        p = pairs[int(torch.randint(len(pairs), (1,), generator=g))]
        yield mqar_batch(batch_size, pairs=p, generator=g, vocab=vocab)


def require_datasets(names: Sequence[str], what: str) -> None:
    """Raise :class:`~diffattn.data.DatasetNotInstalledError` naming ``what`` needs them, the missing ones among the
    offline datasets ``names``, the data folder and the install command; nothing when all are installed."""
    missing = [n for n in names if not dataset_info(n).installed()]
    if missing:
        raise DatasetNotInstalledError(
            f"{what} needs {', '.join(names)}; not installed under {str(default_root())!r}: {', '.join(missing)}. "
            f"Install them with `{SETUP_COMMAND} {' '.join(missing)}` (`make data` in a source checkout), or set "
            f"DIFFATTN_DATA to the folder holding them.")


def minimum_errors(cfg: Mapping[str, Any], keys: Sequence[str], where: str, minimum: int = 1) -> list[str]:
    """One message per key of ``keys`` whose value in ``cfg`` is below ``minimum``, naming the key, ``where`` and the
    value, in the order of ``keys``; empty when none is."""
    return [f"{key} in {where} must be >= {minimum}, got {cfg[key]}" for key in keys if cfg[key] < minimum]


def increasing_ints(values: Sequence[Any]) -> bool:
    """Whether ``values`` is a non-empty list of distinct integers >= 1 (not bools) in increasing order."""
    return bool(values) and not any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values) and \
        values == sorted(set(values))


def vocab_errors(vocab: Mapping[str, Any], names: Sequence[str], where: str) -> list[str]:
    """The message when ``vocab`` (a :class:`~diffattn.data.synthetic.SyntheticVocab`'s sizes) does not map exactly
    ``names`` to integers >= 1; empty when it does."""
    if set(vocab) != set(names) or not all(isinstance(v, int) and v >= 1 for v in vocab.values()):
        return [f"vocab in {where} must map exactly {sorted(names)} to integers >= 1, got {vocab!r}"]
    return []


def vlm_metrics(layers: int, needles: Sequence[str], loss: str, *, vqa_claim: PaperEffect | None = None,
                pope_claim: PaperEffect | None = None) -> list[Metric]:
    """The report rows of a VLM study, in %: the VQA scores of the two question kinds, accuracy (chance 0.5: yes /
    no), F1 and yes-ratio on every POPE split (Li et al. 2023), MMNeedle's ``needles`` scores and its two-step
    location (Wang et al. 2024), the decoder's attention on the image tokens in each of ``layers`` layers; then the
    final loss, labelled ``loss``. ``vqa_claim`` and ``pope_claim``: the paper claims the "what is this?" score and
    the POPE accuracy test."""
    ms = [Metric("VQA score, what is this? (%)", "vqa.what", 100.0, 1, claim=vqa_claim),
          Metric("VQA score, category (%)", "vqa.category", 100.0, 1)]
    for s in POPE_SPLITS:
        ms += [Metric(f"POPE {s}: accuracy (%)", f"pope.{s}.accuracy", 100.0, 1, chance=0.5, claim=pope_claim),
               Metric(f"POPE {s}: F1 (%)", f"pope.{s}.f1", 100.0, 1),
               Metric(f"POPE {s}: yes-ratio (%)", f"pope.{s}.yes_ratio", 100.0, 1, None)]
    ms += [Metric(f"MMNeedle {n} (%)", f"mmneedle.{n}", 100.0, 1) for n in needles]
    ms += [Metric("MMNeedle two-step location (%)", "mmneedle.location", 100.0, 1)]
    ms += [Metric(f"decoder attention on image tokens, layer {i} (%)", f"image_attention.{i}", 100.0, 1, None)
           for i in range(layers)]
    ms += [Metric(loss, "final_loss", 1.0, 3, False)]
    return ms


def pope_control(split: str) -> Control:
    """The positive control of a VLM study: the baseline's POPE accuracy on ``split`` at least 60 % (chance and the
    always-yes prior: 50 %)."""
    return Control(f"baseline POPE {split} accuracy (%; chance and always-yes 50 %)", f"pope.{split}.accuracy", 60.0,
                   scale=100.0)


# ---------------------------------------------------------------------------------------------- needle prompts

#: the shortest needle prompt in bytes: the longest needle sentence and question (106 bytes) plus some filler
MIN_NEEDLE_LENGTH = 112
#: the answer's length in bytes: " " and a 4-digit number
ANSWER_BYTES = 5


def needle_budget_errors(cfg: dict[str, Any], length_key: str, where: str) -> list[str]:
    """The constraints of a budget that mixes needle prompts of ``cfg[length_key]`` bytes into training windows of
    ``cfg["block_size"]`` bytes at the share ``cfg["needle_fraction"]`` (the noise and retrofit studies)."""
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


def _span(seq: list[int], sub: list[int]) -> int:
    """Start of the last occurrence of ``sub`` in ``seq``."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    raise ValueError(f"the answer tokens {sub} do not occur in the prompt")


#: the attention-mass modes the needle probes report (:data:`diffattn.diagnostics.noise.MODES`)
_MASS_MODES = ("signed", "abs", "share")


@torch.no_grad()
def needle_attention(model, filler_text: str, *, length: int, depths, trials: int, seed: int = 0,
                     attention: bool = True) -> dict:
    """Needle prompts of ``length`` bytes in ``filler_text`` (:func:`diffattn.eval.language.needle_prompt`, the
    needle at each of ``depths``, ``trials`` prompts per depth, drawn from ``random.Random(seed)``) through ``model``
    (a byte-level causal LM): answer vs context attention mass from the last query position (signed, |·| and the
    share of the row's |·|, :func:`~diffattn.diagnostics.noise.transform`; only with ``attention``), accuracy and
    answer NLL, means over ``len(depths) · trials`` prompts."""
    tok = get_text_tokenizer("bytes")
    filler = tok.encode(filler_text)
    rng = random.Random(seed)
    sums = {f"{part}_{mode}": 0.0 for mode in _MASS_MODES for part in ("answer", "noise")}
    sums.update(accuracy=0.0, answer_nll=0.0)
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
                for mode in _MASS_MODES:
                    r = answer_attention(maps, ans, context, query=-1, mode=mode)
                    sums[f"answer_{mode}"] += r["answer"]
                    sums[f"noise_{mode}"] += r["noise"]
            sums["accuracy"] += float(greedy_continuation(model, prompt, len(answer)) == answer)
            full = torch.tensor([prompt + answer])  # (1, N + len(answer))
            logp = F.log_softmax(lm_logits(model, full)[0, N - 1:-1].double(), dim=-1)
            sums["answer_nll"] -= logp.gather(1, torch.tensor(answer)[:, None]).mean().item()
            n += 1
    out = {k: v / n for k, v in sums.items() if attention or k in ("accuracy", "answer_nll")}
    for mode in _MASS_MODES if attention else ():
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
