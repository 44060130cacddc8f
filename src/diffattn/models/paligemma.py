"""PaliGemma (Beyer et al. 2024) from transformers: the model a user has or a tiny one built offline, its
word-level tokenizer for the offline questions, its prefix-LM inputs and its image preprocessing.

``base`` mappings: ``{type: paligemma, path: DIR}`` loads the weights a user has (e.g. google/paligemma-3b-pt-224);
``{type: paligemma, config: {...}}`` builds a ``PaliGemmaConfig`` with seed 0. Inputs follow PaliGemma's prefix-LM
format (Beyer et al. 2024, §3): ``<image>``×P ``<bos>`` question ``\\n`` | answer ``<eos>``, full attention on the
prefix (``token_type_ids`` 0) and the loss on the answer (1). Training recipe: :mod:`diffattn.train.tasks.vlm`;
answers and attention of a trained model: :mod:`diffattn.eval.paligemma`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..adapters.hf import install_load_warning

__all__ = ["PALIGEMMA_SPECIAL", "MODEL_KEYS", "word_tokenizer", "paligemma_batch", "build_paligemma",
           "paligemma_transform", "num_image_tokens"]

#: the tokens of the word tokenizer before the words (PaliGemma's own tokenizer has them too)
PALIGEMMA_SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>", "\n")
#: the keys of a ``base`` mapping that choose the model
MODEL_KEYS = ("type", "config", "path")


def word_tokenizer(words: Sequence[str]):
    """A word-level ``tokenizers`` tokenizer (as ``transformers.PreTrainedTokenizerFast``) over ``words``: text is
    lower-cased, quotes dropped, split into :func:`diffattn.models.vlm.split_words` tokens and newlines; ids 0–5
    are ``<pad> <eos> <bos> <unk> <image> \\n``. Saved and loaded with ``save_pretrained`` / ``from_pretrained``."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(PALIGEMMA_SPECIAL)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(),
                                           normalizers.Replace(Regex("[\"\u201c\u201d\u2018\u2019']"), "")])
    pattern = Regex(r"[a-z0-9\u00c0-\u024f]+(?:-[a-z0-9\u00c0-\u024f]+)*|\?|\n")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern, behavior="removed", invert=True)  # keep the matches
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return fast


def _text_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def paligemma_batch(tokenizer, image_token_id: int, num_image_tokens: int, questions: Sequence[str],
                    answers: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """PaliGemma's prefix-LM inputs (Beyer et al. 2024, §3; transformers' PaliGemmaProcessor): per sample
    ``<image>``×P ``<bos>`` question ``\\n`` [answer ``<eos>``]; ``token_type_ids`` 0 on the prefix, 1 on the
    answer; ``labels`` the answer ids (−100 elsewhere). Right-padded with ``attention_mask`` 0 (training);
    prompts alone (``answers=None``) are for generation, which :func:`diffattn.eval.paligemma.answer_paligemma`
    groups by length."""
    newline = _text_ids(tokenizer, "\n")
    rows = []
    for k, q in enumerate(questions):
        prefix = [image_token_id] * num_image_tokens + [tokenizer.bos_token_id] + _text_ids(tokenizer, q) + newline
        suffix = [] if answers is None else _text_ids(tokenizer, answers[k]) + [tokenizer.eos_token_id]
        rows.append((prefix, suffix))
    n = max(len(p) + len(s) for p, s in rows)
    pad = tokenizer.pad_token_id
    ids, mask, tt, labels = [], [], [], []
    for p, s in rows:
        fill = n - len(p) - len(s)
        ids.append(p + s + [pad] * fill)
        mask.append([1] * (len(p) + len(s)) + [0] * fill)
        tt.append([0] * len(p) + [1] * len(s) + [0] * fill)
        labels.append([-100] * len(p) + s + [-100] * fill)
    out = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "token_type_ids": torch.tensor(tt)}
    if answers is not None:
        out["labels"] = torch.tensor(labels)
    return out


def build_paligemma(base: dict, vocab_size: int | None = None, *, extra_keys: Sequence[str] = (),
                    where: str = "task.base") -> nn.Module:
    """``{type: paligemma, path: DIR}``: the pretrained model a user has; ``{type: paligemma, config: {...}}``: a
    ``PaliGemmaConfig`` (``vision_config`` / ``text_config`` dicts) built with seed 0 (the stand-in for pretrained
    weights is the same in every run); ``vocab_size`` sets the text vocabulary of a config-built model.
    ``extra_keys`` are keys of ``base`` that the caller reads (not the model's); ``where`` names ``base`` in
    errors."""
    import transformers as T

    if base.get("type") != "paligemma":
        raise ValueError(f"{where}.type must be 'paligemma', got {base.get('type')!r}")
    unknown = sorted(set(base) - {*MODEL_KEYS, *extra_keys})
    if unknown:
        raise ValueError(f"unknown config keys {where}.{unknown[0]}; valid: {', '.join((*MODEL_KEYS, *extra_keys))}")
    if base.get("path"):
        if not Path(base["path"]).is_dir():
            raise ValueError(f"{where}.path {base['path']!r} is not a directory holding a PaliGemma checkpoint")
        install_load_warning()
        return T.PaliGemmaForConditionalGeneration.from_pretrained(base["path"])
    cfg = dict(base.get("config") or {})
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
        cfg.setdefault("text_config", {})["vocab_size"] = vocab_size
        cfg["image_token_index"] = PALIGEMMA_SPECIAL.index("<image>")
        cfg["text_config"].update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return T.PaliGemmaForConditionalGeneration(T.PaliGemmaConfig(**cfg))


def num_image_tokens(cfg) -> int:
    """The image tokens P of a ``PaliGemmaConfig``: its ``num_image_tokens``, else (image size / patch size)²."""
    n = getattr(cfg.text_config, "num_image_tokens", None) or getattr(cfg, "num_image_tokens", None)
    if n is None:
        v = cfg.vision_config
        n = (v.image_size // v.patch_size) ** 2
    return int(n)


def paligemma_transform(size: int):
    """PaliGemma's image preprocessing (SigLIP): resize to ``size``², scale to [−1, 1] (mean = std = 0.5)."""
    from torchvision import transforms as T

    return T.Compose([T.Lambda(lambda im: im.convert("RGB")), T.Resize((size, size)), T.ToTensor(),
                      T.Normalize([0.5] * 3, [0.5] * 3)])
