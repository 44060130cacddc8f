"""Text encoder classifiers with a switchable attention: Transformer, DT and DGT (M-DGSA 2025, §4.3, §5.2, App. B.3).

    ids (B, N) ─ tok_embed ─ [CLS; tokens] + pos_embed ─ blocks ─ norm ─ pool ─ head ─ logits (B, C)
    block:  x = x + attn(norm1(x), padding mask);   x = x + mlp(norm2(x))          (pre-norm, LayerNorm)

One class, :class:`TextClassifier`; the attention's kind (``attention={"kind": "standard" | "diff" | "gated"}``)
picks the layer and everything else is shared (the blocks are :class:`diffattn.layers.Block`), so the switch
changes only ``blocks.*.attn``.
Padding never leaks: the padding mask (B, 1, 1, N) is passed to every attention layer and mean pooling averages
real tokens only. Words come from a :class:`Vocabulary` built from the training texts (M-DGSA 2025, Tables 5–6:
minimum frequency 2, at most 60,000 words; 30,000 for MNLI; sequences truncated to 256 tokens).

Registered: the table :data:`TEXT_CONFIGS`, each name's arguments from the paper size and kind it spells
(``create_model(name, vocab_size=len(vocab), num_classes=C)``):

- ``t_{tiny,rt,base,mnli}``: the Transformer baseline, GELU MLP ×4 (M-DGSA 2025, App. B.4: "GeLU over the full
  hidden dimension").
- ``dt_{size}_x{2,4,16_3}``: DT, differential attention + SwiGLU; ``dgt_{size}_x{2,4,16_3}``: DGT, M-DGSA
  without the [Q⁺; Q⁻] residual (§4.3: "did not improve convergence so we omit it in DGT") + SwiGLU.
  ``dt_tiny`` and ``dgt_tiny`` (×4) are for tests and CPU runs.

Sizes (App. B.3): ``rt`` Rotten Tomatoes, 4 layers × 256; ``base`` AG News / IMDB / 20 Newsgroups, 6 × 256;
``mnli`` 6 × 512 with 3 classes and a 30,000-word vocabulary; all with "8 heads", dropout 0.1.

Choices (said, never guessed):

- Heads: M-DGSA (2025) counts *differential* heads, so its "8 heads" are ``num_heads=16`` (h, the standard count;
  head width d = 16 at width 256) for DT/DGT and 8 for the Transformer, as in ``diffattn.models.vit`` (whose
  docstring derives it from M-DGSA (2025) Table 9). Attention parameter counts do not depend on h.
- SwiGLU expansion r is the width of the fused first projection (gate and up halves of r·D/2 each), which is
  what reproduces Table 7's differences: ×2 → ×4 adds 4 layers × 1.5·2·256² ≈ 0.8M for Rotten Tomatoes, and
  Transformer − DT×2 = 6 × (8 − 3)·256² ≈ 1.9M for AG News (15.1M − 13.2M).
- λ_init is 0.8 for DT and DGT (App. B.5: "holding it fixed at 0.8 outperforms"); pass ``lambda_init="ye"``
  for the depth schedule (0-based layer index). ``lambda_form`` and ``sub_norm`` choose the λ form and the
  per-head sub-norm of the differential layers (None: each layer's default, as in ``diffattn.models.vit``).
- Pooling: the paper does not say how its text models pool; we use a learnable CLS token (as its DGViT, and
  BERT) and offer ``pool="mean"`` (masked mean over real tokens). Positions: learned absolute embeddings.
- Dropout 0.1 (App. B.3) after the embeddings, on the attention output and in the MLP; attention-map dropout
  is ``attn_drop_rate`` (default 0, which keeps the O(N) kernels).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from ..layers import MLP_TYPES, AttentionSpec, Block, LooseAttention
from .base import DiffattnModel
from .config import check_args, check_choice
from .registry import ModelFamily, register_family

__all__ = ["Vocabulary", "TextClassifier", "POOLS", "TEXT_CONFIGS"]

POOLS = ("cls", "mean")
#: the default attention of :class:`TextClassifier`: standard, dropout 0.1 on its output (M-DGSA 2025, App. B.3)
TEXT_ATTENTION = AttentionSpec(proj_drop=0.1)
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


# ------------------------------------------------------------------------------------------- vocabulary


class Vocabulary:
    """Word-level vocabulary built from data (M-DGSA 2025, App. B.3: minimum frequency, maximum size).

    Tokens are lower-cased (``lowercase=True``) words ``\\w+`` and single punctuation marks. Id 0 is ``<pad>``,
    id 1 is ``<unk>``; the other ids go to words by decreasing count, ties broken alphabetically (deterministic).
    """

    pad_token, unk_token = "<pad>", "<unk>"
    pad_id, unk_id = 0, 1

    def __init__(self, tokens: Sequence[str], *, lowercase: bool = True):
        tokens = list(tokens)
        if tokens[:2] != [self.pad_token, self.unk_token]:
            raise ValueError(f"tokens must start with {[self.pad_token, self.unk_token]}, got {tokens[:2]}")
        if len(set(tokens)) != len(tokens):
            dup = sorted(t for t, c in Counter(tokens).items() if c > 1)[:5]
            raise ValueError(f"tokens must be unique, got duplicates {dup}")
        self.tokens, self.lowercase = tokens, lowercase
        self.index = {t: i for i, t in enumerate(tokens)}

    @classmethod
    def build(cls, texts: Iterable[str], min_freq: int = 2, max_size: int | None = 60000, *,
              lowercase: bool = True) -> Vocabulary:
        """Words seen at least ``min_freq`` times, the ``max_size − 2`` most frequent (``max_size`` counts the
        two special tokens; None: no limit)."""
        if not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an integer >= 1, got {min_freq!r}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 2):
            raise ValueError(f"max_size must be None or an integer >= 2 (it counts <pad> and <unk>), got "
                             f"{max_size!r}")
        if isinstance(texts, str):
            raise ValueError("texts must be an iterable of strings, got a single string")
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(cls._split(text, lowercase))
        counts.pop(cls.pad_token, None)
        counts.pop(cls.unk_token, None)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size - 2]
        return cls([cls.pad_token, cls.unk_token, *words], lowercase=lowercase)

    @staticmethod
    def _split(text: str, lowercase: bool) -> list[str]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return _TOKEN_RE.findall(text.lower() if lowercase else text)

    def tokenize(self, text: str) -> list[str]:
        return self._split(text, self.lowercase)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """Ids of ``text``, unknown words → ``unk_id``, truncated to ``max_length`` tokens."""
        ids = [self.index.get(t, self.unk_id) for t in self.tokenize(text)]
        return ids if max_length is None else ids[:max_length]

    def encode_batch(self, texts: Sequence[str], max_length: int = 256, *,
                     padding: str = "longest") -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask), each (B, N) long: truncated to ``max_length``, right-padded with ``pad_id`` to the longest
        text (``padding="longest"``) or to ``max_length`` (``"max_length"``); mask is 1 for tokens, 0 for padding.
        An empty text keeps one ``<unk>`` so that every row has a token."""
        if padding not in ("longest", "max_length"):
            raise ValueError(f"padding must be 'longest' or 'max_length', got {padding!r}")
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings, got a single string")
        rows = [self.encode(t, max_length) or [self.unk_id] for t in texts]
        n = max_length if padding == "max_length" else max((len(r) for r in rows), default=1)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        return ids, mask

    __call__ = encode_batch

    def decode(self, ids: Iterable[int]) -> str:
        """Space-joined tokens, padding skipped."""
        return " ".join(self.tokens[int(i)] for i in ids if int(i) != self.pad_id)

    def save(self, path: str | Path) -> None:
        """Write JSON: ``{"tokens": [...], "lowercase": bool}``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tokens": self.tokens, "lowercase": self.lowercase}, f, ensure_ascii=False)

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or "tokens" not in data:
            raise ValueError(f"{path} is not a vocabulary written by Vocabulary.save (no 'tokens' entry)")
        return cls(data["tokens"], lowercase=bool(data.get("lowercase", True)))


# ---------------------------------------------------------------------------------------------- model


class TextClassifier(DiffattnModel):
    """Transformer encoder classifier with attention of kind ``"standard" | "diff" | "gated"`` (module docstring).

    ``forward(input_ids (B, N), attention_mask (B, N) | None) → logits (B, num_classes)``; the mask defaults to
    ``input_ids != pad_id``. N ≤ ``max_len``.

    ``attention`` is an :class:`~diffattn.layers.AttentionSpec` or its dict: every attention setting in one value
    (default: standard attention with dropout 0.1 on its output, App. B.3). ``drop_rate`` is the dropout after the
    embeddings and in the MLP. The loose keywords of before (:data:`LOOSE`) are deprecated
    (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="diff", lambda_init=…``, where ``drop_rate`` was ``proj_drop`` too
    LOOSE = LooseAttention("TextClassifier", ("lambda_init", "lambda_form", "sub_norm", "qkv_bias", "q_residual",
                                              "attn_drop_rate", "backend"), fill={"proj_drop": "drop_rate"})

    def __init__(self, vocab_size: int = 60000, num_classes: int = 2, max_len: int = 256, embed_dim: int = 256,
                 depth: int = 6, num_heads: int = 8, *, attention: AttentionSpec | Mapping = TEXT_ATTENTION,
                 mlp: str = "gelu", mlp_ratio: float = 4.0, mlp_dropouts: int = 2, pool: str = "cls",
                 drop_rate: float = 0.1, norm_eps: float = 1e-5, pad_id: int = 0, **loose):
        super().__init__()
        check_args("TextClassifier", vocab_size=vocab_size, num_classes=num_classes, max_len=max_len,
                   embed_dim=embed_dim, depth=depth, num_heads=num_heads, norm_eps=norm_eps, drop_rate=drop_rate,
                   pad_id=pad_id)
        if num_classes < 1:
            raise ValueError(f"TextClassifier: num_classes must be an integer >= 1, got {num_classes!r}")
        if pad_id >= vocab_size:
            raise ValueError(f"TextClassifier: pad_id must be an id in [0, {vocab_size}), got {pad_id!r}")
        check_choice("pool", pool, POOLS)
        check_choice("mlp", mlp, MLP_TYPES)
        spec = self.LOOSE.resolve(attention, loose, {"drop_rate": drop_rate})
        self.vocab_size, self.num_classes, self.max_len = vocab_size, num_classes, max_len
        self.embed_dim, self.attention, self.pool, self.pad_id = embed_dim, spec.kind, pool, pad_id
        self.attention_spec = spec
        self.num_prefix_tokens = 1 if pool == "cls" else 0
        self.tok_embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.zeros(1, max_len + self.num_prefix_tokens, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, depth=i, attention=spec, mlp=mlp, mlp_ratio=mlp_ratio,
                  mlp_dropouts=mlp_dropouts, norm_eps=norm_eps, drop=drop_rate)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.head = nn.Linear(embed_dim, num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated normal (std 0.02) for linear layers, embeddings and positions; zero biases and padding row;
        λ vectors and sub-norms keep their own init (docs/design.md)."""
        if self.pos_embed.device.type == "meta":
            return
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.tok_embed.weight, std=0.02)
        self.tok_embed.weight[self.pad_id].zero_()
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor of shape (B, N), got {got}")
        B, N = input_ids.shape
        if N > self.max_len:
            raise ValueError(f"input_ids has {N} tokens, more than max_len={self.max_len}; truncate when encoding")
        if attention_mask is None:
            keep = input_ids != self.pad_id  # (B, N)
        elif attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must have the shape of input_ids {(B, N)} (1 = token, 0 = padding), "
                             f"got {tuple(attention_mask.shape)}")
        else:
            keep = attention_mask.bool()
        x = self.tok_embed(input_ids)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1 + N, D)
            keep = torch.cat([keep.new_ones(B, 1), keep], dim=1)  # (B, 1 + N)
        x = self.pos_drop(x + self.pos_embed[:, :x.shape[1]])
        return x, keep

    def forward_features(self, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """→ (normalised tokens (B, P + N, D), token mask (B, P + N) bool), P = 1 with a CLS token."""
        x, keep = self._embed(input_ids, attention_mask)
        attn_mask = keep[:, None, None, :]  # (B, 1, 1, P + N): keys that may be attended
        for blk in self.blocks:
            x = blk(x, attn_mask)
        return self.norm(x), keep

    def forward_head(self, x: torch.Tensor, keep: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens → logits (B, C), or pooled features (B, D) with ``pre_logits``."""
        if self.pool == "cls":
            x = x[:, 0]
        else:
            w = keep.to(x.dtype).unsqueeze(-1)  # (B, N, 1)
            x = (x * w).sum(1) / w.sum(1).clamp(min=1.0)
        return x if pre_logits else self.head(x)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, N), mask (B, N) → logits (B, num_classes)."""
        return self.forward_head(*self.forward_features(input_ids, attention_mask))

    @torch.no_grad()
    def attention_maps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list:
        """Per block :class:`~diffattn.functional.AttentionWeights` (A1, A2, combined; (B, heads, P+N, P+N)),
        for rollout (M-DGSA 2025, §5.3) and attention-noise diagnostics."""
        x, keep = self._embed(input_ids, attention_mask)
        maps = []
        for blk in self.blocks:
            x, w = blk(x, keep[:, None, None, :], need_weights=True)
            maps.append(w)
        return maps


# --------------------------------------------------------------------------------------------- registry

# Sizes (M-DGSA 2025, App. B.3): rt = Rotten Tomatoes 4 × 256; base = AG News / IMDB / 20 Newsgroups 6 × 256;
# mnli 6 × 512, 3 classes, 30,000 words; tiny for tests. num_heads is the Transformer's (the paper's "8 heads");
# DT/DGT count differential heads, so theirs is twice that (h = 16).
_SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=1000, embed_dim=64, depth=2, num_heads=4, max_len=128),
    "rt": dict(vocab_size=60000, embed_dim=256, depth=4, num_heads=8, max_len=256),
    "base": dict(vocab_size=60000, embed_dim=256, depth=6, num_heads=8, max_len=256),
    "mnli": dict(vocab_size=30000, embed_dim=512, depth=6, num_heads=8, max_len=256, num_classes=3),
}
# name prefix → attention: dropout 0.1 on the attention output as everywhere else (App. B.3); DGT omits the [Q⁺; Q⁻]
# residual (the default)
_ATTENTION: dict[str, dict] = {prefix: dict(kind=kind, proj_drop=0.1)
                               for prefix, kind in (("t", "standard"), ("dt", "diff"), ("dgt", "gated"))}
# name suffix → DT/DGT's SwiGLU expansion (M-DGSA 2025's ×2, ×4 and ×16/3); the Transformer's GELU MLP is ×4
_RATIOS: dict[str, float] = {"x2": 2.0, "x4": 4.0, "x16_3": 16 / 3}


def _text_config(name: str) -> dict:
    """The constructor arguments that the registered ``name`` spells, ``{t,dt,dgt}_{size}[_x{2,4,16_3}]``: the
    Transformer (``t``) with a GELU MLP ×4 and the size's heads, DT (``dt``) and DGT (``dgt``) with SwiGLU of the
    named expansion (×4 when none is named) and twice the heads."""
    prefix, size, *ratio = name.split("_", 2)
    standard = prefix == "t"
    num_heads = _SIZES[size]["num_heads"] * (1 if standard else 2)
    return dict(_SIZES[size], num_heads=num_heads, attention=_ATTENTION[prefix], mlp="gelu" if standard else "swiglu",
                mlp_ratio=_RATIOS[ratio[0]] if ratio else 4.0)


TEXT_CONFIGS: dict[str, dict] = {name: _text_config(name) for name in (
    "t_tiny", "dt_tiny", "dgt_tiny",  # for tests and CPU runs
    "t_rt", "dt_rt_x2", "dt_rt_x4", "dt_rt_x16_3", "dgt_rt_x2", "dgt_rt_x4", "dgt_rt_x16_3",
    "t_base", "dt_base_x2", "dt_base_x4", "dt_base_x16_3", "dgt_base_x2", "dgt_base_x4", "dgt_base_x16_3",
    "t_mnli", "dt_mnli_x2", "dt_mnli_x4", "dt_mnli_x16_3", "dgt_mnli_x2", "dgt_mnli_x4", "dgt_mnli_x16_3",
)}

register_family(ModelFamily(TextClassifier, TEXT_CONFIGS, __name__, "text classifier (M-DGSA 2025, App. B.3)."))
