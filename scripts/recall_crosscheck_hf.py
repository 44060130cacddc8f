"""Cross-check of the recall and needles studies' finding that differential attention learns in-context recall more
slowly at this size, with independent implementations: transformers' ``LlamaForCausalLM`` and
``DiffLlamaForCausalLM`` (Ye et al. 2024, §2.1) at the studies' size (width 64, 2 layers, 4 heads of 16, SwiGLU
192), trained with the needles study's recipe on multi-query associative recall (Arora et al. 2023): the same
generator, stream, answer-only loss, optimizer and schedule (``diffattn.studies.synthetic.train_model``).

    python scripts/recall_crosscheck_hf.py --seeds 0 1 --steps 600

Prints, per model and seed, the recall accuracy with 2 / 4 / 8 pairs on 200 held-out samples each. Offline: the
models are built from configs, nothing is downloaded.
"""

from __future__ import annotations

import argparse

import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM

from diffattn.data.synthetic import SyntheticVocab, mqar_batch
from diffattn.studies.common import mqar_stream
from diffattn.studies.synthetic import answer_accuracy, train_model

PAIRS = (2, 4, 8)


class LogitsOnly(torch.nn.Module):
    """``ids (B, L) -> logits (B, L, V)``, the interface ``train_model`` and ``answer_accuracy`` use."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def build(kind: str, vocab: SyntheticVocab, seed: int) -> torch.nn.Module:
    kw = dict(vocab_size=vocab.size, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, head_dim=16, max_position_embeddings=128, attn_implementation="eager")
    torch.manual_seed(seed)
    net = DiffLlamaForCausalLM(DiffLlamaConfig(**kw)) if kind == "DiffLlama" else LlamaForCausalLM(LlamaConfig(**kw))
    return LogitsOnly(net)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocab = SyntheticVocab(num_keys=16, num_values=16, num_filler=8)  # the needles study's vocabulary
    g = torch.Generator().manual_seed(99)
    test = [mqar_batch(200, pairs=p, generator=g, vocab=vocab) for p in PAIRS]
    for seed in args.seeds:
        for kind in ("Llama", "DiffLlama"):
            model = build(kind, vocab, seed)
            out = train_model(model, mqar_stream(PAIRS, 32, vocab, seed), steps=args.steps, lr=1e-3, weight_decay=0.1,
                              warmup_steps=50, eval_every=args.steps, evaluate=lambda m: 0.0)
            acc = [100 * answer_accuracy(model, b).mean().item() for b in test]
            accs = ", ".join(f"{p} pairs {a:.1f} %" for p, a in zip(PAIRS, acc))
            print(f"seed {seed} {kind}: recall accuracy {accs}; final train loss {out['final_loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
