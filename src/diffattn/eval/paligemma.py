"""A trained PaliGemma (:mod:`diffattn.train.tasks.vlm`'s ``paligemma`` recipe) reloaded from its run, its greedy
answers and its decoder's attention on the image tokens.

    model, tok = load_paligemma("runs/tiny_paligemma")      # base from config.yaml + adapter + LoRA, exactly
    answer_paligemma(model, tok, images, ["what is this?"])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .. import adapters as A
from ..adapters.core import HF_CONFIG_KEY
from ..adapters.hf import from_pretrained_retrofit, install_load_warning
from ..models.paligemma import MODEL_KEYS, build_paligemma, num_image_tokens, paligemma_batch
from .vlm_bench import image_token_share

__all__ = ["load_paligemma", "answer_paligemma", "paligemma_image_attention"]


def _check_images(images, questions: Sequence[str]) -> None:
    if not (isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[0] == len(questions)):
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a (B, 3, H, W) tensor with one image per question (B = {len(questions)}), "
                         f"got {got}")


def _pg_core(model):
    """The PaliGemma inside a peft model, or the model itself."""
    from peft import PeftModel

    return model.base_model.model if isinstance(model, PeftModel) else model


def load_paligemma(run_dir: str | Path, base: dict | None = None) -> tuple[nn.Module, object]:
    """(model, tokenizer) of a trained ``paligemma`` run, in eval mode: the base model of its ``config.yaml`` (or
    ``base``), retrofitted from ``adapter/`` and with ``lora/`` loaded; a full fine-tuning run (``lora_r: 0``)
    loads ``model/`` (:func:`diffattn.from_pretrained_retrofit` when it was retrofitted)."""
    import yaml
    from peft import PeftModel
    from transformers import AutoTokenizer

    run_dir = Path(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    if not (run_dir / "lora").is_dir() and (run_dir / "model" / "config.json").is_file():
        import transformers as T

        install_load_warning()
        path = run_dir / "model"
        retrofitted = getattr(T.AutoConfig.from_pretrained(path), HF_CONFIG_KEY, None) is not None
        model = from_pretrained_retrofit(path) if retrofitted else \
            T.PaliGemmaForConditionalGeneration.from_pretrained(path)
        return model.eval(), tokenizer
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    base = base or cfg["task"]["base"]
    base = {k: v for k, v in base.items() if k in MODEL_KEYS}  # the rest chose the training questions
    model = build_paligemma(base, None if base.get("path") else len(tokenizer))
    if (run_dir / "adapter").is_dir():
        model = A.load_adapter(model, run_dir / "adapter")
    model = PeftModel.from_pretrained(model, run_dir / "lora")
    return model.eval(), tokenizer


@torch.no_grad()
def answer_paligemma(model, tokenizer, images: torch.Tensor, questions: Sequence[str],
                     max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of a PaliGemma to ``questions`` about ``images`` (B, 3, H, W), generated in groups of equal
    prompt length (no padding, so positions are exact)."""
    _check_images(images, questions)
    cfg = _pg_core(model).config
    batch = paligemma_batch(tokenizer, cfg.image_token_index, num_image_tokens(cfg), list(questions))
    lengths = batch["attention_mask"].sum(-1).tolist()
    out: list[str] = [""] * len(questions)
    for n in sorted(set(lengths)):
        rows = [i for i, k in enumerate(lengths) if k == n]
        ids = batch["input_ids"][rows, :n]
        gen = model.generate(input_ids=ids, pixel_values=images[rows], attention_mask=torch.ones_like(ids),
                             token_type_ids=torch.zeros_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for r, g in zip(rows, gen[:, n:]):
            out[r] = tokenizer.decode(g, skip_special_tokens=True).strip()
    return out


@torch.no_grad()
def paligemma_image_attention(model, tokenizer, images: torch.Tensor, questions: Sequence[str]) -> list[float]:
    """Per decoder layer of a PaliGemma (bare, retrofitted or with LoRA): the mean share of attention (signed
    combined map, averaged over heads and samples) that the last prompt position, the one predicting the first
    answer token, puts on the image tokens, Σ_image a / Σ_all a (as :func:`diffattn.eval.vlm_bench.image_attention`
    for the LLaVA-style model). The maps come from ``output_attentions``: the model runs eager attention for this
    call (SDPA returns no maps), and a retrofitted layer returns its combined map A1 − λA2."""

    _check_images(images, questions)
    core = _pg_core(model)
    cfg = core.config
    P = num_image_tokens(cfg)
    batch = paligemma_batch(tokenizer, cfg.image_token_index, P, list(questions))
    before = cfg.text_config._attn_implementation
    core.set_attn_implementation("eager")
    try:
        out = model(pixel_values=images, **batch, output_attentions=True)
    finally:
        core.set_attn_implementation(before)
    last = batch["attention_mask"].sum(-1) - 1  # (B,) the last prompt position
    return [image_token_share(a, last, P) for a in out.attentions]  # each a (B, heads, N, N)
