"""Differential PaliGemma: LoRA fine-tuning with and without a differential decoder (Li et al. 2025, §4, Table 1).

Li et al. 2025 fine-tune a pretrained PaliGemma with LoRA after turning its Gemma decoder's attention differential
(shared-QK: one query/key projection, the second map from the same scores; split-heads: the heads' channels split
into the two maps), and compare with LoRA fine-tuning of the unchanged model on VQA and on the multimodal
needle-in-a-haystack. No PaliGemma weights can be fetched offline, so each seed builds its own "pretrained" model:

1. **pretraining** (once per seed): a ``PaliGemmaForConditionalGeneration`` from the ``model`` config (SigLIP tower,
   Gemma decoder), every weight trained (``diffattn train``, task ``paligemma``, ``lora_r: 0``) on the Tux Paint
   questions of ``pretrain_kinds`` (:mod:`diffattn.data.vqa`: "what is this?", "what category is this?"), saved as
   a transformers checkpoint with its tokenizer (``<out>/seed<k>/pretrained/model``);
2. **transfer** (per variant): that checkpoint loaded as a user loads google/paligemma-3b-pt-224
   (``task.base.path``), its decoder retrofitted (``lora``: unchanged; ``shared_qk``; ``split_heads``; exact at
   step 0, λ(t) annealed from 0 to ``lambda_init`` over ``anneal_steps``, DAA (2025) eq. 3) and fine-tuned with peft
   LoRA (r ``lora_r``, α ``lora_alpha`` on q/k/v/o) plus λ and the sub-norms, on the ``finetune_kinds`` questions,
   which add POPE existence questions and MMNeedle 2×2 grids the pretraining never saw;
3. **evaluation** on the test split (images, captions and needle distractors never seen in training):
   :func:`diffattn.eval.vlm_bench.evaluate_vlm` (VQA score, POPE per split, MMNeedle) through
   :func:`diffattn.eval.paligemma.answer_paligemma`, and the decoder's attention share on the image tokens
   (:func:`diffattn.eval.paligemma.paligemma_image_attention`).

Every variant of a seed starts from the same checkpoint with the same questions, batches, optimizer and schedule.

Control (:func:`control`, stated before any comparison): the baseline (LoRA) must answer at least 60 % of the POPE
questions of the first split it was fine-tuned on right; POPE asks one yes and one no question per image, so
chance and the answer prior (always "yes") both give 50 %. Below that the variants are not compared.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ..adapters import adapters, lambda_summary
from ..data.vqa import POPE_SPLITS, QUESTION_KINDS, VQADataset
from ..eval.paligemma import answer_paligemma, load_paligemma, paligemma_image_attention
from ..eval.vlm_bench import evaluate_vlm
from ..io import atomic_write_file
from ..models.paligemma import paligemma_transform
from ..train.config import config_from_dict
from ..train.loop import train
from ..utils import device_errors
from . import claims
from .base import Study, StudyConfig
from .common import minimum_errors, pope_control, require_datasets, vlm_metrics
from .report import Control, run_seeds

__all__ = ["PaliGemmaStudy", "VARIANTS", "DEFAULTS", "control", "pretrain", "transfer"]

#: variant → (the paligemma task's ``method``, label); the first is the baseline
VARIANTS: dict[str, tuple[str, str]] = {
    "lora": ("none", "LoRA"),
    "shared_qk": ("shared_qk", "shared-QK + LoRA"),
    "split_heads": ("split_heads", "split-heads + LoRA"),
}
#: the budget (diffattn/configs/studies/paligemma.yaml)
DEFAULTS: dict[str, Any] = {
    "model": {"projection_dim": 64, "hidden_size": 64,
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 32,
                                "patch_size": 8, "projection_dim": 64},
              "text_config": {"model_type": "gemma", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                              "head_dim": 16}},
    "pretrain_kinds": ["what", "category"], "pretrain_steps": 1500, "pretrain_lr": 1.0e-3,
    "finetune_kinds": ["what", "category", "pope", "needle"], "pope_splits": ["random"], "needle_count": 400,
    "finetune_steps": 300, "finetune_lr": 4.0e-4, "lora_r": 32, "lora_alpha": 64, "lambda_init": 0.8,
    "anneal_steps": 150, "batch_size": 16, "warmup_steps": 10, "test_needle_count": 100, "max_new_tokens": 6,
    "attention_questions": 64, "threads": 1, "device": None,
}


def _train_config(cfg: dict[str, Any], seed: int, base: dict, kinds: list[str], *, method: str, lora_r: int,
                  steps: int, lr: float, progress: bool):
    return config_from_dict({
        "task": {"name": "paligemma", "method": method, "lambda_init": cfg["lambda_init"],
                 "anneal_steps": cfg["anneal_steps"], "lora_r": lora_r, "lora_alpha": cfg["lora_alpha"],
                 "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
                 "base": {**base, "kinds": list(kinds), "needle_count": cfg["needle_count"],
                          "pope_splits": list(cfg["pope_splits"])}},
        "optim": {"lr": lr, "weight_decay": 1.0e-9, "warmup_steps": cfg["warmup_steps"], "min_lr_ratio": 0.1},
        "run": {"steps": steps, "batch_size": cfg["batch_size"], "seed": seed, "threads": cfg["threads"],
                "log_every": max(1, steps // 10), "ckpt_every": steps, "keep_last": 1, "progress": progress,
                "device": cfg["device"]},
    })


def pretrain(cfg: dict[str, Any], seed: int, run_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Step 1 (module docstring): the full model trained on ``pretrain_kinds``; ``run_dir/model`` is the
    checkpoint every variant of the seed starts from. A finished pretraining is read back, not redone."""
    done = run_dir / "model" / "config.json"
    if done.is_file() and (run_dir / "pretrain_loss.txt").is_file():
        return {"final_loss": float((run_dir / "pretrain_loss.txt").read_text())}
    t0 = time.perf_counter()
    res = train(_train_config(cfg, seed, {"type": "paligemma", "config": cfg["model"]}, cfg["pretrain_kinds"],
                              method="none", lora_r=0, steps=cfg["pretrain_steps"], lr=cfg["pretrain_lr"],
                              progress=progress), out=run_dir, overwrite=True)
    with atomic_write_file(run_dir / "pretrain_loss.txt", "w") as f:  # last: it marks the pretraining finished
        f.write(f"{res['final_loss']:.6f}\n")
    print(f"[study paligemma] seed {seed}: pretrained on {cfg['pretrain_kinds']}, loss {res['final_loss']:.3f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"final_loss": res["final_loss"]}


def transfer(cfg: dict[str, Any], variant: str, seed: int, pretrained: Path, run_dir: Path, test,
             progress: bool = True) -> dict[str, Any]:
    """Steps 2 and 3 (module docstring) for one variant: LoRA fine-tuning from ``pretrained`` into ``run_dir``,
    then the test-split evaluation of the reloaded run."""
    method = VARIANTS[variant][0]
    t0 = time.perf_counter()
    res = train(_train_config(cfg, seed, {"type": "paligemma", "path": str(pretrained)}, cfg["finetune_kinds"],
                              method=method, lora_r=cfg["lora_r"], steps=cfg["finetune_steps"],
                              lr=cfg["finetune_lr"], progress=progress), out=run_dir, overwrite=True)
    train_s = time.perf_counter() - t0
    model, tok = load_paligemma(run_dir)
    size = int(model.base_model.model.config.vision_config.image_size)
    tf = paligemma_transform(size)

    def answer(images: torch.Tensor, questions) -> list[str]:
        return answer_paligemma(model, tok, images, questions, cfg["max_new_tokens"])

    out = evaluate_vlm(answer, test, tf)
    pope_qs = [q for q in test.questions if q["kind"] == "pope"][:cfg["attention_questions"]]
    images = torch.stack([tf(test.image(q)) for q in pope_qs])
    shares = paligemma_image_attention(model, tok, images, [q["question"] for q in pope_qs])
    out["image_attention"] = {str(i): share for i, share in enumerate(shares)}
    out.pop("answers")
    lams = [r["lambda"] for r in lambda_summary(model)] if adapters(model) else []
    return {**out, "final_loss": res["final_loss"], "lambda": lams, "train_seconds": round(train_s, 1),
            "seconds": round(time.perf_counter() - t0, 1)}


def control(cfg: dict[str, Any]) -> Control:
    """The positive control: the baseline's POPE accuracy on the first fine-tuning split (``pope_splits``) at
    least 60 % (chance and the always-yes prior: 50 %)."""
    return pope_control(cfg["pope_splits"][0])


class PaliGemmaStudy(Study, name="paligemma", title="Study: Differential PaliGemma vs LoRA fine-tuning",
                     variants=VARIANTS, defaults=DEFAULTS, control=control):
    """The paligemma study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("pretrain_steps", "finetune_steps", "lora_r", "lora_alpha", "anneal_steps",
                                      "batch_size", "needle_count", "test_needle_count", "max_new_tokens",
                                      "attention_questions", "threads"), where)
        for key in ("pretrain_kinds", "finetune_kinds"):
            if not cfg[key] or any(k not in QUESTION_KINDS for k in cfg[key]):
                errors.append(f"{key} in {where} must be a non-empty list from {list(QUESTION_KINDS)}, got "
                              f"{cfg[key]!r}")
        if not cfg["pope_splits"] or any(s not in POPE_SPLITS for s in cfg["pope_splits"]):
            errors.append(f"pope_splits in {where} must be a non-empty list from {list(POPE_SPLITS)}, got "
                          f"{cfg['pope_splits']!r}")
        errors += device_errors(cfg, where)
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every seed (``<out>/seed<k>/``: ``pretrained/`` then one run folder per variant), aggregated."""
        require_datasets(["tuxpaint_captions"], "the paligemma study")
        torch.set_num_threads(cfg["threads"])
        test = VQADataset("test", QUESTION_KINDS, seed=0, needle_count=cfg["test_needle_count"])

        def one_seed(seed: int, folder: Path) -> dict:
            pre = pretrain(cfg, seed, folder / "pretrained", progress)
            results = {}
            for v in cfg["variants"]:
                r = transfer(cfg, v, seed, folder / "pretrained" / "model", folder / v, test, progress)
                r["pretrain_loss"] = pre["final_loss"]
                results[VARIANTS[v][1]] = r
                print(f"[study paligemma] seed {seed} {VARIANTS[v][1]}: VQA {r['vqa']}, POPE adversarial accuracy "
                      f"{r['pope']['adversarial']['accuracy']:.3f}, MMNeedle exact {r['mmneedle']['exact']:.3f} "
                      f"({r['seconds']:.0f} s)", flush=True)
            return results

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        test = VQADataset("test", QUESTION_KINDS, seed=0, needle_count=cfg["test_needle_count"])
        m, v = cfg["model"], cfg["model"]["vision_config"]
        t = m["text_config"]
        intro = (
            f"LoRA fine-tuning of a PaliGemma with its Gemma decoder unchanged, shared-QK or split-heads (Li et al. "
            f"2025, §4). Model: SigLIP {v['num_hidden_layers']} × {v['hidden_size']} on {v['image_size']}² images "
            f"(patch {v['patch_size']}, {(v['image_size'] // v['patch_size']) ** 2} image tokens), Gemma "
            f"{t['num_hidden_layers']} × {t['hidden_size']} ({t['num_attention_heads']} query heads, "
            f"{t['num_key_value_heads']} key/value). Per seed: pretrained {cfg['pretrain_steps']} steps (all weights, "
            f"lr {cfg['pretrain_lr']:g}) on {', '.join(cfg['pretrain_kinds'])} questions of the training images, "
            f"then each variant fine-tuned from that checkpoint {cfg['finetune_steps']} steps (LoRA r {cfg['lora_r']}, "
            f"α {cfg['lora_alpha']} on q/k/v/o, plus λ and sub-norms; lr {cfg['finetune_lr']:g}, weight decay 1e-9, "
            f"λ_init {cfg['lambda_init']} reached after {cfg['anneal_steps']} steps) on "
            f"{', '.join(cfg['finetune_kinds'])} questions (POPE {', '.join(cfg['pope_splits'])} negatives, "
            f"{cfg['needle_count']} needle grids); batch {cfg['batch_size']}. Test split: {len(test.questions)} "
            f"questions ({cfg['test_needle_count']} needle grids), greedy answers of at most "
            f"{cfg['max_new_tokens']} tokens.")
        return self.write_report(cfg, intro, per_seed,
                                 vlm_metrics(t["num_hidden_layers"], ("existence", "exact"), "final fine-tuning loss",
                                             vqa_claim=claims.PALIGEMMA_VQA), seconds)

