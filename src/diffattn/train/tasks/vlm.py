"""Vision-language recipes: a LLaVA-style VLM in LLaVA's two stages (``vlm``) and Differential PaliGemma with LoRA
(``paligemma``), both on the offline questions of :mod:`diffattn.data.vqa` (real Tux Paint stamps).

``vlm`` (Liu et al. 2023 (LLaVA), §4.2): ``task.train: projector`` is stage 1 (the projector alone, on the stamps'
captions: "describe the image." → the caption), ``task.train: all`` is stage 2 (projector + LM on the questions);
the image tower is frozen in both. ``task.base`` names the starting weights: ``{clip: DIR}`` takes the image tower
of a trained diffattn CLIP (``<run>/model``; Hammoud & Ghanem 2025 §5.1 puts DiffCLIP's tower in LLaVA),
``{init: DIR}`` continues from a saved VLM (stage 2 from stage 1's ``<run>/model``). :func:`train_llava` runs both
stages in one call.

``paligemma`` (Li et al. 2025, §4): a transformers ``PaliGemmaForConditionalGeneration`` (``task.base``:
``{type: paligemma, config: {...}}`` builds a tiny one offline, ``{type: paligemma, path: DIR}`` loads the weights
a user has, e.g. google/paligemma-3b-pt-224) whose Gemma decoder is retrofitted with ``task.method`` (``shared_qk``
or ``split_heads``; ``none`` keeps standard attention, the LoRA-only baseline) and fine-tuned with peft LoRA
(``lora_r`` 32, ``lora_alpha`` 64 on the decoder's ``lora_targets``, q/k/v/o by default) plus λ and the sub-norms.
Inputs follow PaliGemma's prefix-LM format (Beyer et al. 2024): ``<image>``×P ``<bos>`` question ``\\n`` | answer
``<eos>``, full attention on the prefix (``token_type_ids`` 0) and the loss on the answer (1). Built from a config,
its tokenizer is a word-level ``tokenizers`` tokenizer over the questions' words (:func:`word_tokenizer`), saved
beside the adapter; :func:`load_paligemma` rebuilds the trained model from the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ...io import atomic_write_dir
from .base import Task

__all__ = ["VLMTask", "PaliGemmaTask", "QuestionImages", "vlm_vocabulary", "word_tokenizer", "build_paligemma",
           "paligemma_batch", "load_paligemma", "answer_paligemma", "paligemma_image_attention", "train_llava",
           "llava_compare", "llava_table", "CAPTION_QUESTION", "SPLITS_ALL", "DATA_KEYS"]

CAPTION_QUESTION = "describe the image."
#: the ``task.base`` keys that choose the training questions (:class:`~diffattn.data.vqa.VQADataset`'s arguments)
DATA_KEYS = ("kinds", "needle_count", "pope_splits")
SPLITS_ALL = ("train", "val", "test")
_CACHE: dict = {}


def _image_tensor(ds, q: dict, transform) -> torch.Tensor:
    key = (id(ds), tuple(q["images"]), id(transform))
    if key not in _CACHE:
        _CACHE[key] = transform(ds.image(q))
    return _CACHE[key]


class QuestionImages(Dataset):
    """(image tensor, question, answer) triples of a :class:`~diffattn.data.vqa.VQADataset`, images transformed
    once and kept in memory; ``captions=True`` gives stage-1 pairs ("describe the image." → caption) instead."""

    def __init__(self, vqa, transform, captions: bool = False) -> None:
        self.vqa, self.transform = vqa, transform
        if captions:
            self.items = [({"images": [i]}, CAPTION_QUESTION, r["caption"]) for i, r in enumerate(vqa.images.rows)]
        else:
            self.items = [(q, q["question"], q["answer"]) for q in vqa.questions]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        q, question, answer = self.items[i]
        return _image_tensor(self.vqa, q, self.transform), question, answer


def vlm_vocabulary(root=None, seed: int = 0) -> list[str]:
    """The words of every question, answer and caption over all splits (a word list, no image–answer pairing;
    test answers unseen in training are in it but never trained), plus the stage-1 instruction."""
    from ...data.vqa import QUESTION_KINDS, VQADataset, vqa_vocabulary

    qs, caps = [], [CAPTION_QUESTION]
    for split in SPLITS_ALL:
        ds = VQADataset(split, QUESTION_KINDS, root=root, seed=seed)
        qs += ds.questions
        caps += ds.images.captions
    return vqa_vocabulary(qs, extra=caps)


def _vqa(cfg, split: str | None = None):
    from ...data.vqa import POPE_SPLITS, VQADataset

    base = cfg.task.base
    kinds = tuple(base.get("kinds", ("what", "category", "pope", "needle")))
    return VQADataset(split or cfg.data.split, kinds, root=cfg.data.path, seed=cfg.run.seed,
                      needle_count=int(base.get("needle_count", 400)),
                      pope_splits=tuple(base.get("pope_splits", POPE_SPLITS)))


class VLMTask(Task):
    """LLaVA stage 1 (``task.train: projector``) or stage 2 (``task.train: all``); module docstring."""

    name = "vlm"

    def build_model(self) -> nn.Module:
        from ...models import create_model, from_pretrained

        base, t = self.cfg.task.base, self.cfg.task
        unknown = sorted(set(base) - {"clip", "init", *DATA_KEYS})
        if unknown:
            raise ValueError(f"unknown config key task.base.{unknown[0]} for task vlm; valid: clip, init, "
                             f"{', '.join(DATA_KEYS)}")
        if base.get("init"):
            model = from_pretrained(base["init"])
        else:
            overrides = dict(self.cfg.model.overrides)
            overrides.setdefault("vocab", vlm_vocabulary(self.cfg.data.path))
            model = create_model(self.cfg.model.name, **overrides)
            if base.get("clip"):
                model.load_vision_tower(base["clip"])
        model.set_stage(1 if t.train == "projector" else 2)
        return model

    def dataset(self) -> Dataset:
        from ...models import create_model
        from ...models.clip import image_transform

        if self.cfg.task.base.get("init"):
            img_size = _saved_img_size(self.cfg)
        else:
            with torch.device("meta"):  # the tower's input size from the model config (no weights)
                img_size = create_model(self.cfg.model.name, **{**self.cfg.model.overrides, "vocab": None}).img_size
        return QuestionImages(_vqa(self.cfg), image_transform(img_size), captions=self.cfg.task.train == "projector")

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        core = getattr(model, "module", model)
        text = {k: v.to(images.device) for k, v in core.collate(list(questions), list(answers)).items()}
        return model(images, **text)["loss"]


def _saved_img_size(cfg) -> int:
    with open(Path(cfg.task.base["init"]) / "config.json") as f:
        return int(json.load(f)["vision"].get("img_size", 224))


def _llava_batches(model, data, steps: int, batch_size: int, g: torch.Generator):
    """``steps`` batches (images (B, 3, H, W), the collated text) of ``batch_size`` items drawn with ``g``."""
    for _ in range(steps):
        idx = torch.randint(len(data), (batch_size,), generator=g).tolist()
        items = [data[i] for i in idx]
        yield torch.stack([it[0] for it in items]), model.collate([it[1] for it in items], [it[2] for it in items])


def _llava_loss(model, batch) -> torch.Tensor:
    images, text = batch
    return model(images, **text)["loss"]


def train_llava(model, train_set, *, stage1_steps: int, stage2_steps: int, batch_size: int = 32,
                stage1_lr: float = 1e-3, stage2_lr: float = 3e-4, warmup: int = 10, seed: int = 0,
                captions=None, log=None) -> list[float]:
    """LLaVA's two stages in one call (Liu et al. 2023, §4.2): ``stage1_steps`` AdamW steps on the projector with
    ``captions`` (a :class:`QuestionImages` with ``captions=True``; default: ``train_set``), then ``stage2_steps``
    on projector + LM with ``train_set``; warm-up then cosine lr per stage, batches drawn with ``seed``. Returns the
    loss of every step. The model is left in eval mode."""
    from ..loop import fit
    from ..optim import warmup_cosine

    losses: list[float] = []
    g = torch.Generator().manual_seed(seed)
    for stage, steps, lr, data in ((1, stage1_steps, stage1_lr, captions or train_set),
                                   (2, stage2_steps, stage2_lr, train_set)):
        if steps <= 0:
            continue
        model.set_stage(stage)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s, n=steps: warmup_cosine(s, n, warmup, 0.1))
        losses += fit(model, opt, sched, _llava_batches(model, data, steps, batch_size, g), _llava_loss,
                      params=params, log=log, desc=f"stage {stage} step", total=steps)
    model.eval()
    return losses


# --------------------------------------------------------------------------------------------- PaliGemma

#: the tokens of the word tokenizer before the words (PaliGemma's own tokenizer has them too)
PALIGEMMA_SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>", "\n")


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
    prompts alone (``answers=None``) are for generation, which :func:`answer_paligemma` groups by length."""
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


def build_paligemma(base: dict, vocab_size: int | None = None) -> nn.Module:
    """``{type: paligemma, path: DIR}``: the pretrained model a user has; ``{type: paligemma, config: {...}}``: a
    ``PaliGemmaConfig`` (``vision_config`` / ``text_config`` dicts) built with seed 0 (the stand-in for pretrained
    weights is the same in every run); ``vocab_size`` sets the text vocabulary of a config-built model."""
    import transformers as T

    if base.get("type") != "paligemma":
        raise ValueError(f"task.base.type must be 'paligemma', got {base.get('type')!r}")
    unknown = sorted(set(base) - {"type", "config", "path", *DATA_KEYS})
    if unknown:
        raise ValueError(f"unknown config keys task.base.{unknown[0]}; valid: type, config, path, "
                         f"{', '.join(DATA_KEYS)}")
    if base.get("path"):
        if not Path(base["path"]).is_dir():
            raise ValueError(f"task.base.path {base['path']!r} is not a directory holding a PaliGemma checkpoint")
        return T.PaliGemmaForConditionalGeneration.from_pretrained(base["path"])
    cfg = dict(base.get("config") or {})
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
        cfg.setdefault("text_config", {})["vocab_size"] = vocab_size
        cfg["image_token_index"] = PALIGEMMA_SPECIAL.index("<image>")
        cfg["text_config"].update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return T.PaliGemmaForConditionalGeneration(T.PaliGemmaConfig(**cfg))


def _decoder_only(index: int, name: str) -> bool:
    return "language_model" in name


class PaliGemmaTask(Task):
    """Differential PaliGemma: retrofit the decoder, add LoRA, fine-tune on the questions (module docstring)."""

    name = "paligemma"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            base = self.cfg.task.base
            if base.get("path"):
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(base["path"])
            else:
                self._tokenizer = word_tokenizer(vlm_vocabulary(self.cfg.data.path))
        return self._tokenizer

    def build_model(self) -> nn.Module:
        """The base model, its decoder retrofitted (``method``), with LoRA on it; ``lora_r: 0`` trains every weight
        instead (full fine-tuning, as in PaliGemma's own pretraining and transfer stages) and adds no LoRA."""
        from ... import adapters as A

        t = self.cfg.task
        model = build_paligemma(t.base, None if t.base.get("path") else len(self.tokenizer))
        model.config.use_cache = False
        full = t.lora_r == 0
        if t.method != "none":
            A.retrofit(model, t.method, lambda_init=t.lambda_init, anneal_steps=t.anneal_steps,
                       layers=_decoder_only, train="all" if full else "adapters")
        elif not full:
            model.requires_grad_(False)
        if full:
            return model
        from peft import LoraConfig, get_peft_model

        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        targets = "|".join(t.lora_targets)
        lora = LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, lora_dropout=0.0,
                          target_modules=rf".*language_model.*\.({targets})")
        peft_model = get_peft_model(model, lora)
        for n, p in peft_model.base_model.model.named_parameters():  # peft froze the adapters: unfreeze them
            if n in trainable:
                p.requires_grad_(True)
        return peft_model

    def _image_size(self) -> int:
        base = self.cfg.task.base
        if base.get("path"):
            with open(Path(base["path"]) / "config.json") as f:
                return int(json.load(f)["vision_config"].get("image_size", 224))
        return int(base.get("config", {}).get("vision_config", {}).get("image_size", 224))

    def dataset(self) -> Dataset:
        return QuestionImages(_vqa(self.cfg), paligemma_transform(self._image_size()))

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, questions, answers = batch
        cfg = _pg_config(model)
        text = paligemma_batch(self.tokenizer, cfg.image_token_index, _num_image_tokens(cfg), list(questions),
                               list(answers))
        return model(pixel_values=images, **{k: v.to(images.device) for k, v in text.items()}).loss

    def after_step(self, model: nn.Module) -> None:
        from ... import adapters as A

        if self.cfg.task.method != "none":
            A.step(model)

    def final_saved(self, directory: Path) -> bool:
        return (Path(directory) / ("model" if self.cfg.task.lora_r == 0 else "lora")).is_dir()

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """``adapter/`` (diffattn adapters, λ and their step; absent for ``method: none``), ``lora/`` (peft) and
        ``tokenizer/`` (the word tokenizer of a config-built model). With ``lora_r: 0`` the whole model goes to
        ``model/`` (``save_pretrained``, a retrofit recorded in its config) with the tokenizer beside it, so that
        ``task.base: {type: paligemma, path: <run>/model}`` starts a next stage from it."""
        from ... import adapters as A

        directory = Path(directory)
        with atomic_write_dir(directory / "tokenizer") as tmp:
            self.tokenizer.save_pretrained(tmp)
        if self.cfg.task.lora_r == 0:
            with atomic_write_dir(directory / "model") as tmp:
                model.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
            return directory / "model"
        base = model.base_model.model
        if self.cfg.task.method != "none":
            lora = [p for n, p in base.named_parameters() if "lora_" in n and p.requires_grad]
            for p in lora:
                p.requires_grad_(False)
            try:
                with atomic_write_dir(directory / "adapter") as tmp:
                    A.save_adapter(base, tmp)
            finally:
                for p in lora:
                    p.requires_grad_(True)
        with atomic_write_dir(directory / "lora") as tmp:
            model.save_pretrained(tmp)
        return directory / "lora"


def _check_images(images, questions: Sequence[str]) -> None:
    if not (isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[0] == len(questions)):
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a (B, 3, H, W) tensor with one image per question (B = {len(questions)}), "
                         f"got {got}")


def _pg_core(model):
    """The PaliGemma inside a peft model, or the model itself."""
    from peft import PeftModel

    return model.base_model.model if isinstance(model, PeftModel) else model


def _pg_config(model):
    return _pg_core(model).config


def _num_image_tokens(cfg) -> int:
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


def load_paligemma(run_dir: str | Path, base: dict | None = None) -> tuple[nn.Module, object]:
    """(model, tokenizer) of a trained ``paligemma`` run, in eval mode: the base model of its ``config.yaml`` (or
    ``base``), retrofitted from ``adapter/`` and with ``lora/`` loaded; a full fine-tuning run (``lora_r: 0``)
    loads ``model/`` (:func:`diffattn.from_pretrained_retrofit` when it was retrofitted)."""
    import yaml
    from peft import PeftModel
    from transformers import AutoTokenizer

    from ... import adapters as A

    run_dir = Path(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    if not (run_dir / "lora").is_dir() and (run_dir / "model" / "config.json").is_file():
        import transformers as T

        from ...adapters.core import HF_CONFIG_KEY
        from ...adapters.hf import from_pretrained_retrofit

        path = run_dir / "model"
        retrofitted = getattr(T.AutoConfig.from_pretrained(path), HF_CONFIG_KEY, None) is not None
        model = from_pretrained_retrofit(path) if retrofitted else \
            T.PaliGemmaForConditionalGeneration.from_pretrained(path)
        return model.eval(), tokenizer
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    base = base or cfg["task"]["base"]
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
    cfg = _pg_config(model)
    batch = paligemma_batch(tokenizer, cfg.image_token_index, _num_image_tokens(cfg), list(questions))
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
    from ...eval.vlm_bench import image_token_share

    _check_images(images, questions)
    core = _pg_core(model)
    cfg = core.config
    P = _num_image_tokens(cfg)
    batch = paligemma_batch(tokenizer, cfg.image_token_index, P, list(questions))
    before = cfg.text_config._attn_implementation
    core.set_attn_implementation("eager")
    try:
        out = model(pixel_values=images, **batch, output_attentions=True)
    finally:
        core.set_attn_implementation(before)
    last = batch["attention_mask"].sum(-1) - 1  # (B,) the last prompt position
    return [image_token_share(a, last, P) for a in out.attentions]  # each a (B, heads, N, N)


# ------------------------------------------------------------------------------ CLIP vs DiffCLIP tower study

def llava_compare(towers: dict[str, str | None], seeds: Sequence[int] = (0, 1, 2), *, stage1_steps: int = 100,
                  stage2_steps: int = 250, batch_size: int = 32, stage1_lr: float = 1e-3, stage2_lr: float = 1e-3,
                  root=None, needle_count: int = 100, train_pope_splits: Sequence[str] = ("random",),
                  out: str | Path | None = None, log=print) -> list[dict]:
    """The same LLaVA recipe (:func:`train_llava`) on each image tower of ``towers`` (name → a diffattn CLIP
    ``model/`` folder, or None for a tower left at random init; ``{seed}`` in the folder is replaced by the seed, so
    that VLM seed k takes the tower trained with seed k) and each seed; every run is evaluated on the test
    questions (:func:`diffattn.eval.vlm_bench.evaluate_vlm`: VQA score, POPE per split, MMNeedle) and its decoder
    attention on the image. Training asks POPE questions of ``train_pope_splits`` only (one yes and one no per
    image and split; all three would make yes/no 70 % of the data). Returns one row per (tower, seed); with
    ``out`` also writes ``results.json`` there (atomically)."""
    import time

    from ...data.vqa import QUESTION_KINDS, VQADataset
    from ...eval.vlm_bench import evaluate_vlm, image_attention, llava_answerer
    from ...models import create_model
    from ...models.clip import image_transform

    vocab = vlm_vocabulary(root)
    rows = []
    for name, clip in towers.items():
        for seed in seeds:
            t0 = time.perf_counter()
            torch.manual_seed(seed)
            model_name = "llava_diffclip_tiny" if "diff" in name else "llava_clip_tiny"
            model = create_model(model_name, vocab=vocab)
            tower = clip and clip.replace("{seed}", str(seed))  # this seed's tower
            if tower:
                model.load_vision_tower(tower)
            tf = image_transform(model.img_size)
            train = VQADataset("train", ("what", "category", "pope", "needle"), root=root, seed=seed,
                               needle_count=4 * needle_count, pope_splits=train_pope_splits)
            losses = train_llava(model, QuestionImages(train, tf), stage1_steps=stage1_steps,
                                 stage2_steps=stage2_steps, batch_size=batch_size, seed=seed,
                                 stage1_lr=stage1_lr, stage2_lr=stage2_lr,
                                 captions=QuestionImages(train, tf, captions=True), log=log)
            t_train = time.perf_counter() - t0
            test = VQADataset("test", QUESTION_KINDS, root=root, seed=0, needle_count=needle_count)
            res = evaluate_vlm(llava_answerer(model, 6), test, tf)
            pope_qs = [q for q in test.questions if q["kind"] == "pope"][:64]
            imgs = torch.stack([tf(test.image(q)) for q in pope_qs])
            res["image_attention"] = image_attention(model, imgs, [q["question"] for q in pope_qs])
            res.pop("answers")
            row = {"tower": name, "clip": tower, "seed": seed,
                   "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "batch_size": batch_size,
                   "lr": [stage1_lr, stage2_lr], "final_loss": losses[-1],
                   "train_s": round(t_train, 1), "total_s": round(time.perf_counter() - t0, 1), **res}
            rows.append(row)
            log(json.dumps({k: row[k] for k in ("tower", "seed", "final_loss", "vqa", "total_s")}))
            if out is not None:
                from ...io import atomic_write_file

                Path(out).mkdir(parents=True, exist_ok=True)
                with atomic_write_file(Path(out) / "results.json", "w") as f:
                    json.dump(rows, f, indent=1)
                with atomic_write_file(Path(out) / "results.md", "w") as f:
                    f.write(llava_table(rows))
    return rows


def _row_value(row: dict, key: str):
    value = row
    for part in key.split("."):
        if isinstance(value, list):
            value = value[int(part)] if int(part) < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        if value is None:
            return None
    return value


def llava_table(rows: Sequence[dict]) -> str:
    """The Markdown table of :func:`llava_compare`'s rows: per metric (test split, %) and tower, mean ± sample std
    over the seeds; the wall time per run in seconds."""
    import statistics

    from ...data.vqa import POPE_SPLITS

    towers = list(dict.fromkeys(r["tower"] for r in rows))
    by_tower = {t: [r for r in rows if r["tower"] == t] for t in towers}
    seeds = sorted({r["seed"] for r in rows})
    metrics = [("VQA score, what is this?", "vqa.what", 100), ("VQA score, category", "vqa.category", 100)]
    for split in [s for s in POPE_SPLITS if any(s in r.get("pope", {}) for r in rows)]:
        metrics += [(f"POPE {split}: {name}", f"pope.{split}.{key}", 100)
                    for name, key in (("accuracy", "accuracy"), ("F1", "f1"), ("yes-ratio", "yes_ratio"))]
    metrics += [(f"MMNeedle {name}", f"mmneedle.{name}", 100) for name in ("existence", "index", "exact")]
    metrics += [("MMNeedle two-step location", "mmneedle.location", 100)]
    cells = sorted({c for r in rows for c in r.get("mmneedle", {}).get("cells", {})})
    metrics += [(f"MMNeedle location, cell ({c})", f"mmneedle.cells.{c}", 100) for c in cells]
    layers = max((len(r.get("image_attention", [])) for r in rows), default=0)
    metrics += [(f"decoder attention on image tokens, layer {i}", f"image_attention.{i}", 100) for i in range(layers)]
    metrics += [("final training loss", "final_loss", 1), ("wall time per run (s, train + eval)", "total_s", 1)]
    lines = [f"| metric (test split, %, mean ± std over seeds {', '.join(map(str, seeds))}) | " + " | ".join(towers)
             + " |", "|---|" + "---|" * len(towers)]
    for name, key, scale in metrics:
        cells_out = []
        for t in towers:
            vals = [_row_value(r, key) for r in by_tower[t]]
            if any(v is None for v in vals):
                cells_out.append("–")
                continue
            vals = [scale * float(v) for v in vals]
            digits = 3 if key == "final_loss" else (0 if key == "total_s" else 1)
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells_out.append(f"{statistics.fmean(vals):.{digits}f} ± {sd:.{digits}f}")
        lines.append(f"| {name} | " + " | ".join(cells_out) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m diffattn.train.tasks.vlm --tower clip=DIR --tower diffclip=DIR
    import argparse

    p = argparse.ArgumentParser(description="LLaVA-style VLM: CLIP vs DiffCLIP image tower, same budget")
    p.add_argument("--tower", action="append", required=True, help="NAME=DIR (a diffattn CLIP model/ folder; "
                   "{seed} in it is the VLM's seed) or NAME=random; a NAME containing 'diff' gets the differential "
                   "tower")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--stage1-steps", type=int, default=100)
    p.add_argument("--stage2-steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--stage1-lr", type=float, default=1e-3)
    p.add_argument("--stage2-lr", type=float, default=1e-3)
    p.add_argument("--needle-count", type=int, default=100)
    p.add_argument("--root", default=None, help="data folder (default $DIFFATTN_DATA or ./data)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    towers = {}
    for item in a.tower:
        name, _, path = item.partition("=")
        towers[name] = None if path in ("", "random") else path
    llava_compare(towers, a.seeds, stage1_steps=a.stage1_steps, stage2_steps=a.stage2_steps,
                  batch_size=a.batch_size, stage1_lr=a.stage1_lr, stage2_lr=a.stage2_lr,
                  root=a.root, needle_count=a.needle_count, out=a.out)
