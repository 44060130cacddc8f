"""The comment at the top of every packaged recipe states the numbers the recipe runs with: every number the header
states for a setting (lr, warm-up, weight decay, epochs, batch, steps, width, depth, heads, patch, image size, λ_init,
LoRA r and α, …) equals the value in the YAML below it (for a model, the registered config with the recipe's
overrides). Sentences about earlier budgets, dry runs or alternatives (``--set …``, "the paper uses") are not the
recipe's settings and are left out."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from diffattn.configs import CONFIG_DIR

RECIPES = sorted(p.relative_to(CONFIG_DIR).with_suffix("").as_posix() for p in CONFIG_DIR.rglob("*.yaml"))
#: a sentence with one of these describes another setting than the file's own
OTHER_SETTING = ("--set", "dry run", "earlier", "first run", "first full run", "old budget", "raised", "paper uses",
                 "scales the study up", "left ViT", "instead")
NUM = r"(\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)"
#: recipes whose header is a pre-registered design: it names the levels of each factor ("V1 with 8 heads", "width
#: 64 for all variants"), which are not settings of the YAML; a number the YAML does have is still checked
PREREGISTERED = {"studies/recall_ablation"}


def header(path: Path) -> str:
    """The leading comment lines of ``path`` joined into one text, without the command lines (``#   diffattn …``)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("#   "):
            lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def sentences(text: str) -> list[str]:
    """``text`` cut at sentence ends and list items, without the sentences (or the brackets inside one) about other
    settings."""
    parts = re.split(r"(?<=[.:])\s+(?=[A-Za-z(-])|\s-\s", text)
    parts = [re.sub(r"\([^()]*\)", lambda m: "" if any(w in m[0] for w in OTHER_SETTING) else m[0], s) for s in parts]
    return [s for s in parts if not any(w in s for w in OTHER_SETTING)]


def number(text: str) -> float:
    return float(text.replace(",", ""))


def _get(d: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def model_args(cfg: dict) -> dict | None:
    """The arguments the recipe's model is built with: the registered config, its overrides on top; for a CLIP or a
    VLM, its vision tower's."""
    from diffattn.models import model_config
    from diffattn.models.registry import _with_defaults, model_family

    name = _get(cfg, "model.name")
    if not name and "study" in cfg:  # a study whose variants are registered models: the baseline's
        from diffattn.models import is_model

        variants = getattr(importlib.import_module(f"diffattn.studies.{cfg['study']}"), "VARIANTS", {})
        first = variants.get(cfg["variants"][0]) if isinstance(variants, dict) else None
        name = first[0] if isinstance(first, tuple) and is_model(first[0]) else None
        cfg = {"model": {"name": name, "overrides": cfg.get("model") or {}}}
    if not name:
        return None
    family = model_family(name)
    args = model_config(name)
    over = _get(cfg, "model.overrides") or {}
    if family.towers:
        vision = _with_defaults(family.towers["vision"], args["vision"])
        vision.update({k.removeprefix("vision_"): v for k, v in over.items() if k.startswith("vision_")})
        return vision
    return _with_defaults(family.cls, {**args, **over})


def demo_value(key: str) -> Any:
    """What a study's null budget key falls back to: the demo recipes' value."""
    demo = yaml.safe_load((CONFIG_DIR / "demo" / "clip.yaml").read_text())
    return {"steps": demo["run"]["steps"], "batch_size": demo["run"]["batch_size"],
            "warmup_steps": demo["optim"]["warmup_steps"]}[key]


def resolve(cfg: dict, *keys: str) -> Any:
    """The first of ``keys`` the recipe sets (a study's null falls back to the demo recipes)."""
    for key in keys:
        if key.startswith("model:"):
            args = model_args(cfg)
            v = None if args is None else args.get(key.removeprefix("model:"))
        else:
            v = _get(cfg, key)
            if v is None and cfg.get("study") == "diffclip" and key in ("steps", "batch_size", "warmup_steps"):
                v = demo_value(key)
        if v is not None:
            return v
    return None


def _found(tree, key: str) -> list:
    """Every value of ``key`` at any depth of nested dicts and lists."""
    if isinstance(tree, dict):
        return ([tree[key]] if key in tree else []) + [v for x in tree.values() for v in _found(x, key)]
    if isinstance(tree, (list, tuple)):
        return [v for x in tree for v in _found(x, key)]
    return []


def _lambda_init(cfg: dict):
    """The recipe's λ_init: its own setting, else the registered model's attention spec's, else the spec's default
    (registered configs list only the settings that differ from it)."""
    from diffattn.lambdas import DEFAULT_LAMBDA_INIT
    from diffattn.layers import AttentionSpec

    v = resolve(cfg, "task.lambda_init", "lambda_init", "model:lambda_init")
    if v is not None:
        return v
    specs = _found(model_args(cfg) or {}, "attention")
    values = {s.lambda_init if isinstance(s, AttentionSpec) else s.get("lambda_init", DEFAULT_LAMBDA_INIT)
              for s in specs if isinstance(s, (dict, AttentionSpec))}
    return values.pop() if len(values) == 1 else None


#: (pattern, what the captured number must equal: a function of the recipe's YAML)
Rule = tuple[str, Callable[[dict, list[float]], list[tuple[float, Any]]]]


def _one(*keys: str, scale: float = 1.0) -> Callable:
    return lambda cfg, got: [(got[0], None if (v := resolve(cfg, *keys)) is None else v * scale
                              if isinstance(v, (int, float)) else v)]


RULES: list[Rule] = [
    (rf"\blr {NUM}", _one("optim.lr", "lr")),
    (rf"\bweight decay {NUM}", _one("optim.weight_decay", "weight_decay")),
    (rf"\bwarm-up {NUM}\b", _one("optim.warmup_steps", "warmup_steps")),
    (rf"\b{NUM} warm-up steps", _one("optim.warmup_steps", "warmup_steps")),
    (rf"\b{NUM} epochs\b", _one("run.epochs", "epochs")),
    (rf"\bbatch (?:size )?{NUM}\b", _one("run.batch_size", "batch_size")),
    (rf"\b{NUM} (?:AdamW )?steps of {NUM}\b",
     lambda cfg, got: [(got[0], resolve(cfg, "run.steps", "steps")),
                       (got[1], resolve(cfg, "run.batch_size", "batch_size"))]),
    (rf"\bsteps of \d+ × {NUM} bytes", _one("block_size", "data.block_size")),
    (rf"\bsequence length {NUM}", _one("data.block_size")),
    (rf"\bpadded to {NUM} tokens", _one("data.block_size")),
    (rf"\bgradient clipping {NUM}", _one("optim.grad_clip")),
    (rf"\bLoRA r {NUM}, α {NUM}|\br {NUM}, α {NUM}",
     lambda cfg, got: [(got[0], resolve(cfg, "task.lora_r", "model.lora_r", "lora_r")),
                       (got[1], resolve(cfg, "task.lora_alpha", "model.lora_alpha", "lora_alpha"))]),
    (r"λ_init (?:= )?(\d+(?:\.\d+)?)(?!\d|\.\d| −)", lambda cfg, got: [(got[0], _lambda_init(cfg))]),
    (rf"λ annealed over {NUM} optimizer steps", _one("task.anneal_steps")),
    (rf"\bwidth[- ]{NUM}\b",
     _one("model:embed_dim", "model:dim", "model.dim", "task.base.config.n_embd", "lm.hidden_size")),
    (rf"\bembedding {NUM}\b", _one("model:embed_dim")),
    (rf"\b{NUM}(?: |-)(?:layers?|blocks?)\b(?! MLP)",
     _one("model:depth", "model.depth", "depth", "task.base.config.n_layer",
          "lm.num_hidden_layers")),
    (rf"\b{NUM} differential heads", _one("model:num_heads", scale=0.5)),
    (rf"\b{NUM} (?:standard )?heads", _one("model:num_heads", "model.num_heads", "num_heads")),
    (rf"\bpatch {NUM}\b", _one("model:patch_size", "model.patch_size")),
    (rf"\b{NUM}×{NUM} (?:grey )?images",
     lambda cfg, got: [(got[0], resolve(cfg, "model:img_size", "model.img_size",
                                        "task.base.config.vision_config.image_size"))]),
    (rf"\bat {NUM}×{NUM}\b", _one("model:img_size")),
    (rf"\bdropout {NUM}", _one("model:drop_rate")),
    (rf"\bthe {NUM} most frequent", _one("model:vocab_size")),
    (rf"\b{NUM} query heads, {NUM} key/value head",
     lambda cfg, got: [(got[0], resolve(cfg, "task.base.config.text_config.num_attention_heads")),
                       (got[1], resolve(cfg, "task.base.config.text_config.num_key_value_heads"))]),
    (rf"\b{NUM} test images", _one("test_images")),
    (rf"prompts of {NUM} bytes", _one("prompt_length", "needle_length")),
]
NUMBER_WORDS = {"five seeds": 5, "three seeds": 3}


def checks(name: str) -> list[tuple[str, float, Any]]:
    """Every (phrase, number stated, value in the YAML) of recipe ``name``'s header."""
    path = CONFIG_DIR / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for sentence in sentences(header(path)):
        for pattern, expected in RULES:
            for m in re.finditer(pattern, sentence):
                got = [number(g) for g in m.groups() if g is not None]
                for stated, value in expected(cfg, got):
                    out.append((m.group(0), stated, value))
        for words, n in NUMBER_WORDS.items():
            if words in sentence and "seeds" in cfg:
                out.append((words, n, len(cfg["seeds"])))
    return out


@pytest.mark.parametrize("name", RECIPES)
def test_header_numbers_match_the_recipe(name):
    wrong = [f"{phrase!r} states {stated:g}, the recipe has {value!r}" for phrase, stated, value in checks(name)
             if not (value is None and name in PREREGISTERED)
             and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                     and abs(float(value) - stated) <= 1e-9 * max(1.0, abs(stated)))]
    assert not wrong, f"{name}.yaml: " + "; ".join(wrong)


def test_the_rules_read_the_headers():
    """The rules find the settings the headers state (a rule that matches nothing checks nothing)."""
    found = {name: {phrase for phrase, _, _ in checks(name)} for name in RECIPES}
    assert {"lr 3e-5", "weight decay 0.01", "500 warm-up steps", "3 epochs", "batch 32",
            "sequence length 512", "λ_init 0.8"} <= found["daa_gpt2_owt"]
    assert {"patch 4", "width 64", "2 blocks", "32×32 images"} <= found["demo/clip"]
    assert "600 AdamW steps of 32" in found["studies/dgvit"] and "five seeds" in found["studies/dgvit"]
    assert "2,400 AdamW steps of 16" in found["studies/noise"]
    assert "600 steps of 64" in found["studies/diffclip"]
    assert {"lr 1e-3", "warm-up 10"} <= found["tiny/clip"]
    assert "LoRA r 32, α 64" in found["tiny/paligemma"]
    assert {"LoRA r 16, α 32", "500 steps of 8", "sequence length 256"} <= found["finetune/motif"]
    assert "8 differential heads" in found["dgt_text"]
    assert sum(len(v) for v in found.values()) >= 80
