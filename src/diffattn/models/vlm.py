"""A LLaVA-style vision-language model: a CLIP / DiffCLIP image tower, a 2-layer MLP projector and a causal LM.

    image (B, 3, H, W) ─ vision tower ─ patch features (B, P, Dv) ─ projector ─ (B, P, D) ┐
    "<bos> question <sep> answer <eos>" ─ tok_embed ─ (B, N, D) ─────────────────────────┴─ concat ─ LM ─ logits

Liu et al. 2023 (LLaVA, "Visual Instruction Tuning", §4.1) and its 1.5 revision: the image tower's patch features
(no CLS token) of layer ``vision_feature_layer`` go through a 2-layer GELU MLP into the LM's embedding space and
are placed before the text; training has two stages, (1) the projector alone on image–caption pairs ("feature
alignment") and (2) the projector and the LM on instructions (here: questions), the image tower frozen in both
(:meth:`VisionLanguageModel.set_stage`). DiffCLIP (Hammoud & Ghanem 2025, §5.1) puts its differential image tower
in this place and measures POPE; :meth:`VisionLanguageModel.load_vision_tower` takes the tower of any diffattn CLIP
checkpoint (``diffattn train`` with ``task.name: clip`` writes one under ``<run>/model``).

The vision tower is :class:`~diffattn.models.vit.VisionTransformer` and the LM
:class:`~diffattn.models.causal_lm.CausalLM`, configured like the registered CLIP towers and LMs; the text is
split into words by :func:`split_words` and mapped through the word list ``vocab`` (saved in ``config.json``
with the model), after the special tokens :data:`SPECIAL_TOKENS`.

Registered: ``llava_clip_tiny`` (``clip_tiny``'s image tower), ``llava_diffclip_tiny`` (``diffclip_tiny``'s), both
with ``lm_tiny``'s sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.tokenizers import split_words
from .base import DiffattnModel, from_pretrained, load_state_dict_exact
from .causal_lm import LM_CONFIGS, CausalLM
from .clip import image_transform as clip_image_transform
from .config import is_int
from .registry import ModelFamily, register_family
from .vit import VisionTransformer

__all__ = ["VisionLanguageModel", "VLM_CONFIGS", "SPECIAL_TOKENS", "split_words", "IGNORE_INDEX"]

#: ids 0–4 of every VLM vocabulary: padding, unknown word, begin / end of text, question–answer separator
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>", "<sep>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID = range(5)
#: the label of positions that carry no loss (image tokens, the prompt, padding), as in PyTorch's cross_entropy
IGNORE_INDEX = -100


class VisionLanguageModel(DiffattnModel):
    """LLaVA-style VLM (module docstring).

    Args:
        vision: :class:`VisionTransformer` arguments of the image tower (``num_classes`` is forced to 0).
        lm: :class:`CausalLM` arguments of the language model (``vocab_size`` is set from ``vocab``).
        vocab: the words of the vocabulary (:func:`split_words` tokens, unique); ids start after
            :data:`SPECIAL_TOKENS`. None keeps the LM's ``vocab_size`` with no word table (ids only).
        vision_feature_layer: which block's output feeds the projector: -1 the last (after the tower's final
            norm), -2 the penultimate (LLaVA-1.5's choice), … ; patch tokens only, no CLS.
        projector_hidden: hidden width of the projector MLP (default: the LM width, as LLaVA-1.5).
    """

    tower_classes = {"vision": VisionTransformer, "lm": CausalLM}

    def __init__(self, vision: dict | None = None, lm: dict | None = None, vocab: list[str] | None = None,
                 vision_feature_layer: int = -1, projector_hidden: int | None = None):
        super().__init__()
        for name, cfg in (("vision", vision), ("lm", lm)):
            if cfg is not None and not isinstance(cfg, dict):
                raise TypeError(f"{name} must be a dict of tower arguments or None, got {type(cfg).__name__}")
        lm = dict(lm or {})
        if vocab is not None:
            if isinstance(vocab, str) or not all(isinstance(w, str) for w in vocab):
                raise TypeError(f"vocab must be a list of str words, got {type(vocab).__name__}")
            dup = sorted({w for w in vocab if vocab.count(w) > 1} | (set(vocab) & set(SPECIAL_TOKENS)))
            if dup:
                raise ValueError(f"vocab must hold unique words other than {SPECIAL_TOKENS}, got repeats {dup[:5]}")
            lm["vocab_size"] = len(SPECIAL_TOKENS) + len(vocab)
        self.vocab = None if vocab is None else list(vocab)
        self.word_to_id = {} if vocab is None else {w: i + len(SPECIAL_TOKENS) for i, w in enumerate(vocab)}
        self.visual = VisionTransformer(**{**(vision or {}), "num_classes": 0})
        self.lm = CausalLM(**lm)
        depth = len(self.visual.blocks)
        if not is_int(vision_feature_layer) or not -depth <= vision_feature_layer <= -1:
            raise ValueError(f"vision_feature_layer must be an int in [-{depth}, -1] (the tower has {depth} blocks), "
                             f"got {vision_feature_layer!r}")
        self.vision_feature_layer = vision_feature_layer
        hidden = self.lm.dim if projector_hidden is None else projector_hidden
        if not is_int(hidden) or hidden < 1:
            raise ValueError(f"projector_hidden must be None or an integer >= 1, got {projector_hidden!r}")
        dv = self.visual.embed_dim
        self.projector = nn.Sequential(nn.Linear(dv, hidden), nn.GELU(), nn.Linear(hidden, self.lm.dim))

    # ------------------------------------------------------------------------------------------ text
    @property
    def img_size(self) -> int:
        return self.visual.patch_embed.img_size

    @property
    def num_image_tokens(self) -> int:
        return self.visual.patch_embed.num_patches

    def image_transform(self, train: bool = False):
        """The CLIP image transform of the tower at its input size (the transform a diffattn CLIP trained with)."""
        return clip_image_transform(self.img_size, train)

    def encode_text(self, text: str) -> list[int]:
        """Word ids of ``text`` (unknown words → ``<unk>``)."""
        if self.vocab is None:
            raise ValueError("this model was built with vocab=None: it has no word table; pass ids")
        return [self.word_to_id.get(w, UNK_ID) for w in split_words(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """Words of ``ids`` up to the first ``<eos>``, special tokens dropped, joined by spaces."""
        if self.vocab is None:
            raise ValueError("this model was built with vocab=None: it has no word table to decode with")
        words = []
        for i in (int(t) for t in ids):
            if i == EOS_ID:
                break
            if i >= len(SPECIAL_TOKENS):
                words.append(self.vocab[i - len(SPECIAL_TOKENS)])
        return " ".join(words)

    def prompt_ids(self, question: str) -> list[int]:
        """``<bos> question <sep>``: the prompt the answer follows."""
        return [BOS_ID, *self.encode_text(question), SEP_ID]

    def collate(self, questions: Sequence[str], answers: Sequence[str] | None = None,
                max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Right-padded text batch: ``input_ids`` (B, N) of ``<bos> q <sep> a <eos>``, ``attention_mask`` (B, N)
        and, with ``answers``, ``labels`` (B, N): the next token at each position whose next token is the answer
        or its ``<eos>`` (:data:`IGNORE_INDEX` elsewhere), so the loss is on the answer only (LLaVA §4.2)."""
        if isinstance(questions, str) or (answers is not None and len(answers) != len(questions)):
            raise ValueError(f"questions must be a list of str and answers None or a list of the same length, got "
                             f"{type(questions).__name__} and {None if answers is None else len(answers)}")
        seqs, labels = [], []
        for k, q in enumerate(questions):
            prompt = self.prompt_ids(q)
            ans = [] if answers is None else [*self.encode_text(answers[k]), EOS_ID]
            ids = (prompt + ans)[:max_length] if max_length else prompt + ans
            lab = [IGNORE_INDEX] * (len(prompt) - 1) + ans + [IGNORE_INDEX]  # label[t] = ids[t + 1] on the answer
            seqs.append(ids)
            labels.append(lab[:len(ids)])
        n = max(len(s) for s in seqs)
        out = {"input_ids": torch.tensor([s + [PAD_ID] * (n - len(s)) for s in seqs]),
               "attention_mask": torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])}
        if answers is not None:
            out["labels"] = torch.tensor([la + [IGNORE_INDEX] * (n - len(la)) for la in labels])
        return out

    # ----------------------------------------------------------------------------------------- model
    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) → projected patch features (B, P, D) of block ``vision_feature_layer``."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a (B, 3, H, W) tensor, got {got}")
        v = self.visual
        x = v._embed(images)  # (B, 1 + P, Dv)
        last = len(v.blocks) + self.vision_feature_layer
        for blk in v.blocks[:last + 1]:
            x = blk(x)
        if self.vision_feature_layer == -1:
            x = v.norm(x)
        return self.projector(x[:, v.num_prefix_tokens:])  # (B, P, D)

    def _run_lm(self, x: torch.Tensor, mask: torch.Tensor, caches=None, positions=None) -> torch.Tensor:
        """LM blocks on embeddings x (B, N, D); mask (B, past + N) 1 = token; positions (B, N)."""
        attn_mask = mask.bool()[:, None, None, :]  # (B, 1, 1, past + N)
        for i, blk in enumerate(self.lm.blocks):
            x = blk(x, attn_mask, position_ids=positions, kv_cache=None if caches is None else caches[i])
        return self.lm.lm_head(self.lm.norm(x))  # (B, N, V)

    def _inputs(self, images, input_ids, attention_mask):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor of shape (B, N), got {got}")
        img = self.image_features(images)  # (B, P, D)
        if img.shape[0] != input_ids.shape[0]:
            raise ValueError(f"images and input_ids must have the same batch size, got {img.shape[0]} and "
                             f"{input_ids.shape[0]}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got "
                             f"{tuple(attention_mask.shape)}")
        x = torch.cat([img, self.lm.tok_embed(input_ids)], dim=1)  # (B, P + N, D)
        mask = torch.cat([torch.ones(img.shape[:2], dtype=attention_mask.dtype, device=img.device),
                          attention_mask], dim=1)  # (B, P + N)
        return x, mask

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """images (B, 3, H, W), input_ids (B, N) → ``{"logits": (B, P + N, V)}``, plus ``"loss"`` (mean
        cross-entropy over the labelled text positions) when ``labels`` (B, N) from :meth:`collate` is given."""
        x, mask = self._inputs(images, input_ids, attention_mask)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P + N): padding does not advance the position
        logits = self._run_lm(self.lm.drop(x), mask, positions=positions)
        out = {"logits": logits}
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got "
                                 f"{tuple(labels.shape)}")
            P = logits.shape[1] - input_ids.shape[1]
            out["loss"] = F.cross_entropy(logits[:, P:].flatten(0, 1).float(), labels.flatten(),
                                          ignore_index=IGNORE_INDEX)
        return out

    @torch.no_grad()
    def generate(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int = 8) -> torch.Tensor:
        """Greedy answers: (B, new) ids after the prompts ``input_ids`` (B, N), right-padded as :meth:`collate`
        returns them (they are re-packed left-padded here); rows that emitted ``<eos>`` keep emitting it. The image
        tokens and the prompt go through the LM once, then one token per step with a KV cache."""
        if not is_int(max_new_tokens) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(-1)  # (B,)
        n = int(lengths.max())
        left = torch.full_like(input_ids[:, :n], PAD_ID)
        left_mask = torch.zeros_like(left)
        for b in range(input_ids.shape[0]):  # right padding → left padding, so every prompt ends at column n
            k = int(lengths[b])
            left[b, n - k:] = input_ids[b, :k][attention_mask[b, :k].bool()]
            left_mask[b, n - k:] = 1
        x, mask = self._inputs(images, left, left_mask)
        caches = self.lm.new_kv_caches()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._run_lm(x, mask, caches, positions)[:, -1]  # (B, V)
        pos = positions[:, -1:]
        out, done = [], torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for step in range(max_new_tokens):
            nxt = logits.float().argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, EOS_ID), nxt)
            done |= nxt == EOS_ID
            out.append(nxt)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos + 1
            logits = self._run_lm(self.lm.tok_embed(nxt[:, None]), mask, caches, pos)[:, -1]
        return torch.stack(out, dim=1)  # (B, new)

    @torch.no_grad()
    def answer(self, images: torch.Tensor, questions: Sequence[str], max_new_tokens: int = 8) -> list[str]:
        """The greedy answer text to each question about its image (images (B, 3, H, W), already transformed)."""
        batch = self.collate(list(questions))
        dev = images.device
        ids = self.generate(images, batch["input_ids"].to(dev), batch["attention_mask"].to(dev), max_new_tokens)
        return [self.decode(row.tolist()) for row in ids]

    # -------------------------------------------------------------------------------------- training
    def set_stage(self, stage: int) -> None:
        """LLaVA's training stages (Liu et al. 2023, §4.2): 1 trains the projector only, 2 the projector and the
        LM; the image tower stays frozen in both."""
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 (projector) or 2 (projector + LM), got {stage!r}")
        self.requires_grad_(False)
        self.projector.requires_grad_(True)
        if stage == 2:
            self.lm.requires_grad_(True)

    @torch.no_grad()
    def load_vision_tower(self, clip: str | Path | nn.Module) -> VisionLanguageModel:
        """Copy the image tower of a diffattn CLIP (a model or a ``save_pretrained`` folder, e.g. ``<run>/model``)
        into this model, strictly: the tower configurations must agree (build this model with the CLIP's
        ``vision`` arguments, :meth:`from_clip` does)."""
        if not isinstance(clip, nn.Module):
            clip = from_pretrained(clip)
        visual = getattr(clip, "visual", None)
        if not isinstance(visual, VisionTransformer):
            raise TypeError(f"clip must be a diffattn CLIP (with a VisionTransformer .visual), got "
                            f"{type(clip).__name__}")
        load_state_dict_exact(self.visual, visual.state_dict(), f"the image tower of {type(clip).__name__}")
        return self

    @classmethod
    def from_clip(cls, clip: str | Path | nn.Module, lm: dict, vocab: list[str] | None = None,
                  **kwargs) -> VisionLanguageModel:
        """A VLM whose image tower is the trained tower of ``clip`` (a diffattn CLIP or its folder)."""
        if not isinstance(clip, nn.Module):
            clip = from_pretrained(clip)
        vision = dict(type(clip).upgrade_config(dict(clip._hub_mixin_config)).get("vision") or {})
        return cls(vision=vision, lm=lm, vocab=vocab, **kwargs).load_vision_tower(clip)


# --------------------------------------------------------------------------------------------- registry

# The image towers of clip_tiny / diffclip_tiny (32×32, patch 4, width 64, 2 blocks; tests check they agree) and
# lm_tiny's LM, so that the towers of `diffattn train diffattn/configs/demo/*.yaml` load into them.
_TOWER_TINY = dict(img_size=32, patch_size=4, mlp="gelu", norm_eps=1e-5, embed_dim=64, depth=2, num_heads=4)
_LM_TINY = dict(LM_CONFIGS["lm_tiny"])  # vocab_size 512 without a word list; a vocab sets it
VLM_CONFIGS: dict[str, dict] = {
    "llava_clip_tiny": dict(vision=dict(_TOWER_TINY, attention=dict(kind="standard")), lm=dict(_LM_TINY)),
    "llava_diffclip_tiny": dict(vision=dict(_TOWER_TINY, attention=dict(kind="diff")), lm=dict(_LM_TINY)),
}

register_family(ModelFamily(VisionLanguageModel, VLM_CONFIGS, __name__, "LLaVA-style VLM (Liu et al. 2023).",
                            towers={"vision": VisionTransformer, "lm": CausalLM}))
