"""``diffattn eval``: evaluate a saved model or a training run, write ``results.json`` and ``report.md`` with plots;
``diffattn compare``: runs side by side, mean ± std over seeds.

What runs depends on the model:

- vision transformer (logits): top-1 / top-5 / mean per-class recall on the test split; Gaussian input-noise levels
  (M-DGSA (2025) §5.1); a corruption × severity table and mCE (Hendrycks & Dietterich 2019); attention diagnostics.
- CLIP / DiffCLIP (``encode_image`` / ``encode_text``): zero-shot with a prompt ensemble, image–text retrieval,
  linear probe, few-shot (Hammoud & Ghanem 2025 §4); MMVP-VLM when a folder is given; CLS attention inside vs
  outside the foreground masks (Tux Paint stamps' alpha channel); attention diagnostics.
- causal LM: sliding-window perplexity and last-word accuracy on held-out text (DAA (2025) §5), multi-needle
  retrieval over depth × length and the attention mass on the needle vs the context (Ye et al. 2024 §3.3, §3.4).

Attention diagnostics: per-layer mean λ (or gate), per-branch entropy, heat maps of A1, A2 and the combined map,
rollout (signed; :func:`diffattn.diagnostics.rollout`). A suite whose data is missing is skipped and the reason is
written into ``results.json`` (``"skipped"``) and the report; nothing is silently left out.

The output folder is written as a whole, atomically (:func:`diffattn.io.atomic_write_dir`): a killed evaluation
leaves the previous results, and an evaluation that skips its suite never replaces finished results (it raises a
:class:`~diffattn.errors.UsageError` and keeps them). Everything the user gave (the target, a YAML file, the
dataset name, the output folder) is checked before anything is computed or written.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data import DATASETS, get_dataset
from ..data.transforms import pixel_stats
from ..diagnostics import answer_attention, branch_entropy, capture_attention, foreground_attention, patch_mask, rollout
from ..diagnostics.plots import plot_cls_maps, plot_corruption_curves, plot_lambdas, plot_maps, plot_needle_grid
from ..directions import better
from ..errors import UsageError, did_you_mean, user_input, yaml_error
from ..factory import load_run, run_source
from ..io import atomic_write_dir, atomic_write_file
from ..progress import progress as progress_bar
from ..utils import resolve_device
from .classification import classification_metrics, zero_shot_classifier, zero_shot_logits
from .language import lambada_accuracy, needle_grid, needle_prompt, perplexity
from .mmvp import mmvp_eval
from .probe import few_shot, linear_probe
from .retrieval import recall_at_k
from .robustness import COMMON_CORRUPTIONS, corruption_table, noise_robustness
from .text_models import get_text_tokenizer

__all__ = ["evaluate", "write_report", "summary_table", "recorded_chance", "compare", "load_results", "flatten",
           "headline_metrics", "metric_label", "stratified_subset", "EVAL_DATASETS", "KIND_NAMES", "PROTOCOLS",
           "check_eval_dataset"]

#: the built-in datasets each kind of model is evaluated on (``--dataset``): classification sets for vision
#: transformers; caption sets (zero-shot, retrieval, foreground attention) and classification sets (zero-shot,
#: linear probe, few-shot) for CLIP models; text sets for causal LMs
EVAL_DATASETS: dict[str, tuple[str, ...]] = {
    "vit": ("digits", "fashion_mnist"),
    "clip": ("tuxpaint_captions", "emoji", "fashion_mnist", "digits"),
    "lm": ("moby_dick", "state_of_the_union", "spamassassin"),
}
#: how messages name each kind of model
KIND_NAMES = {"vit": "vision transformer", "clip": "CLIP model", "lm": "causal language model"}


def offered_datasets() -> str:
    """The ``--dataset`` values, per kind of model: ``"vision transformer: digits, fashion_mnist; …"``."""
    return "; ".join(f"{KIND_NAMES[k]}: {', '.join(v)}" for k, v in EVAL_DATASETS.items())


def check_eval_dataset(dataset: str | None, kind: str | None = None, what: str = "--dataset") -> None:
    """``dataset`` (None: the default) is one ``diffattn eval`` evaluates a ``kind`` model on (any kind: one it
    evaluates some model on); otherwise a :class:`~diffattn.errors.UsageError` naming ``what`` and the sets that fit."""
    if dataset is None:
        return
    names = list(dict.fromkeys(d for v in EVAL_DATASETS.values() for d in v))
    if dataset not in names:
        raise UsageError(f"{what} {dataset!r} is not a dataset diffattn eval evaluates on"
                         f"{did_you_mean(dataset, names)}; per kind of model: {offered_datasets()}")
    if kind is not None and dataset not in EVAL_DATASETS[kind]:
        fits = [KIND_NAMES[k] for k, v in EVAL_DATASETS.items() if dataset in v]
        raise UsageError(f"{what} {dataset!r} is for a {' or '.join(fits)}, but this run is a {KIND_NAMES[kind]}; "
                         f"a {KIND_NAMES[kind]} is evaluated on {', '.join(EVAL_DATASETS[kind])}")

#: the protocols: ``--quick`` (a smoke test), the default, ``--full`` (every test and train image). ``max_images``
#: caps the test images and ``max_train_images`` the training images a CLIP model's linear probe is fitted on, each
#: a seeded stratified sample (:func:`stratified_subset`; None: all)
QUICK = {"noise_levels": (0.0, 0.25, 0.5, 1.0), "corruptions": ("gaussian_noise", "motion_blur", "contrast"),
         "severities": (1, 3, 5), "episodes": 200, "max_images": 256, "max_train_images": 1024, "ppl_tokens": 2048,
         "lambada": 20, "needle_lengths": (128, 256), "needle_depths": (0.0, 0.5, 1.0), "needle_trials": 2,
         "probe_max_iter": 200, "probe_fine_steps": 5}
FULL = {"noise_levels": (0.0, 0.1, 0.25, 0.5, 1.0), "corruptions": None, "severities": (1, 2, 3, 4, 5),
        "episodes": 5000, "max_images": None, "max_train_images": None, "ppl_tokens": 65536, "lambada": 500,
        "needle_lengths": (256, 512, 1024, 2048), "needle_depths": (0.0, 0.25, 0.5, 0.75, 1.0), "needle_trials": 10,
        "probe_max_iter": 1000, "probe_fine_steps": 17}
DEFAULT = dict(FULL, max_images=2000, max_train_images=5000)
PROTOCOLS = {"quick": QUICK, "default": DEFAULT, "full": FULL}


# ------------------------------------------------------------------------------------------------ loading


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a YAML mapping, got {type(data).__name__}")
    return data


def _run_config(model_dir: Path) -> dict:
    for d in (model_dir, *list(model_dir.parents)[:2]):
        if (d / "config.yaml").is_file():
            return _read_yaml(d / "config.yaml")
    return {}


def _dataset_name(cfg: dict) -> str | None:
    """The built-in dataset a run trained on (None for data of its own: token files, CSV, shards, …)."""

    for key in ("dataset", "data"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("name") or v.get("dataset")
        if isinstance(v, str):
            return v if v in DATASETS else None
    return None


def _run_seed(cfg: dict):
    """The training seed a run's config.yaml records (``run.seed`` or ``seed``), for ``diffattn compare``."""
    run = cfg.get("run")
    return run.get("seed") if isinstance(run, dict) and "seed" in run else cfg.get("seed")


def _bare_model(model):
    """The model inside a peft wrapper, or ``model``."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _retrofit_name(run_cfg: dict) -> str:
    task = run_cfg.get("task") if isinstance(run_cfg.get("task"), dict) else {}
    base = task.get("base") if isinstance(task.get("base"), dict) else {}
    lora = " + LoRA" if task.get("lora") else ""
    return f"{base.get('type', '?')} retrofitted with {task.get('method', '?')}{lora}"


def _lm_sizes(model) -> tuple[int, int]:
    """(vocabulary, context length) of a diffattn causal LM or a transformers one (peft-wrapped or not)."""
    vocab, ctx = getattr(model, "vocab_size", None), getattr(model, "max_seq_len", None)
    config = getattr(_bare_model(model), "config", None)
    if not isinstance(vocab, int):
        vocab = getattr(config, "vocab_size", None)
    if not isinstance(ctx, int):
        ctx = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None) or 2048
    return int(vocab), int(ctx)


def _kind(model) -> str:
    if hasattr(model, "encode_image") and hasattr(model, "encode_text"):
        return "clip"
    if hasattr(model, "new_kv_caches"):
        return "lm"
    if hasattr(model, "patch_embed") and hasattr(model, "forward_features"):
        return "vit"
    raise ValueError(f"diffattn eval supports CLIP models, vision transformers and causal LMs, got "
                     f"{type(model).__name__}")


# ---------------------------------------------------------------------------------------------- helpers


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _diagnostics(model, run, inputs, out: Path, tag: str, *, grid=None, tokens=None,
                 device: torch.device | None = None, who: str = "") -> tuple[dict, list]:
    """Capture maps for one batch (run on ``device``, the maps kept on the CPU); λ / gate per layer, entropy per
    branch, plots, CLS rollout (images). ``who`` (the model, run and dataset) ends every figure's title."""
    sub = f"\n{who}" if who else ""

    with torch.no_grad(), capture_attention(model) as cap:
        run(inputs.to(device) if device is not None else inputs)
    layers = cap.layers
    res: dict[str, Any] = {"layers": len(layers), "kind": layers[0].kind if layers else None}
    lam = [m.gate.mean().item() if m.gate is not None else (m.lambda_.mean().item() if m.lambda_ is not None
                                                             else None) for m in layers]
    res["lambda_per_layer" if layers and layers[0].gate is None else "gate_per_layer"] = lam
    res["entropy_first"] = [float(branch_entropy(m.first).mean()) for m in layers if m.first is not None]
    res["entropy_second"] = [float(branch_entropy(m.second).mean()) for m in layers if m.second is not None]
    plots = []
    for i in sorted({0, len(layers) - 1}):
        m = layers[i]
        plots.append(plot_maps(m.first, m.second, m.combined, out / f"{tag}_maps_layer{i}.png",
                               title=f"{tag}: layer {i} ({m.kind}){sub}", tokens=tokens, cls=grid is not None).name)
    if any(v is not None for v in lam):
        vals = [(m.gate if m.gate is not None else m.lambda_) for m in layers if
                (m.gate is not None or m.lambda_ is not None)]
        plots.append(plot_lambdas(vals, out / f"{tag}_lambda.png", label="gate g" if layers[0].gate is not None
                                  else "λ", title=f"{tag}: per layer{sub}").name)
    if grid is not None:
        maps = [m.combined for m in layers]
        r = rollout(maps)  # (B, N, N)
        plots.append(plot_cls_maps({"A1 (last layer)": layers[-1].first, "combined (last layer)": maps[-1][:1],
                                    "rollout": r[:1, None]}, grid, out / f"{tag}_cls.png",
                                   image=inputs[0], title=f"{tag}: CLS attention{sub}").name)
    res["plots"] = plots
    return res, layers


def classification_chance(group: str, metrics: dict, classes: int) -> dict[str, float]:
    """What guessing uniformly among ``classes`` classes scores on each metric of ``group``: top-k → min(k, C)/C,
    mean per-class recall → 1/C."""
    out = {}
    for key in metrics:
        if key.startswith("top") and key[3:].isdigit():
            out[f"{group}.{key}"] = min(int(key[3:]), classes) / classes
        elif key == "mean_per_class_recall":
            out[f"{group}.{key}"] = 1 / classes
    return out


def stratified_subset(labels, n: int | None, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded stratified sample of ``n`` rows (all rows when ``n`` is None or covers them): each
    class keeps its share of the rows (largest remainders get the rows rounding leaves), its rows drawn at random,
    so a subset of a test split sorted by class still holds every class."""
    y = np.asarray(labels)
    if n is None or n >= len(y):
        return np.arange(len(y))
    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    share = n * counts / len(y)
    quota = np.floor(share).astype(int)
    left = n - int(quota.sum())
    quota[np.argsort(-(share - quota), kind="stable")[:left]] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(inverse == c))[:q] for c, q in enumerate(quota)]
    return np.sort(np.concatenate(picked))


def _standardise(x_tr: np.ndarray, x: np.ndarray, size: int, chans: int) -> torch.Tensor:
    """uint8 (N, H, W[, C]) → float (N, C, size, size): /255, standardised with the train split's mean and std."""

    mean, std = pixel_stats(x_tr)
    t = torch.tensor(x, dtype=torch.float32) / 255.0
    t = t[:, None] if t.dim() == 3 else t.permute(0, 3, 1, 2)
    if t.shape[1] == 1 and chans == 3:
        t = t.expand(-1, 3, -1, -1)
    elif t.shape[1] == 3 and chans == 1:
        t = t.mean(1, keepdim=True)
    if t.shape[-1] != size:
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return (t - mean) / std


# ------------------------------------------------------------------------------------------------- suites


def _vit_suite(model, dataset: str | None, p: dict, out: Path, seed: int, progress: bool,
               device: torch.device, name: str = "") -> dict:
    size, chans = model.patch_embed.img_size, model.patch_embed.proj.in_channels
    if dataset is None:
        dataset = {(1, 8): "digits", (1, 28): "fashion_mnist"}.get((chans, size))
        if dataset is None:
            raise UsageError(f"no default dataset for {chans}-channel {size}×{size} images: pass --dataset")
    tr, te = get_dataset(dataset, split="train"), get_dataset(dataset, split="test")
    idx = stratified_subset(te.labels, p["max_images"], seed)
    x_tr, x_te = np.asarray(tr.images), np.asarray(te.images)[idx]
    y_te = torch.as_tensor(np.asarray(te.labels)[idx])

    def transform(imgs):
        return _standardise(x_tr, imgs, size, chans)

    def predict(x):
        return model(x.to(device)).float().cpu()

    x = transform(x_te)
    with torch.no_grad():
        logits = torch.cat([predict(x[i:i + 256]) for i in range(0, len(x), 256)])
    who = f"{name} on {dataset}"
    res: dict[str, Any] = {"dataset": dataset, "split": "test", "images": len(y_te),
                           "preprocessing": "pixels/255, standardised with the train split's mean and std"}
    res["classification"] = classification_metrics(logits, y_te)
    res["num_classes"] = int(logits.shape[1])  # the classes the model chooses among, whichever the subset holds
    res["chance"] = classification_chance("classification", res["classification"], res["num_classes"])
    res["noise"] = {str(k): v for k, v in noise_robustness(predict, x, y_te, p["noise_levels"], seed=seed).items()}
    table = corruption_table(predict, x_te, y_te, transform, corruptions=p["corruptions"] or COMMON_CORRUPTIONS,
                             severities=p["severities"], seed=seed, progress=progress)
    res["corruptions"] = {"clean": table["clean"], "mce": table["mce"], "mean_accuracy": table["mean_accuracy"],
                          "table": {c: {str(s): a for s, a in row.items()} for c, row in table["table"].items()}}
    plots = [plot_corruption_curves(table["table"], out / "corruptions.png", clean=table["clean"],
                                    title=f"accuracy under corruption\n{who}").name]
    grid = (size // model.patch_embed.patch_size,) * 2
    diag, _ = _diagnostics(model, model, x[:8], out, "vision", grid=grid, device=device, who=who)
    res["diagnostics"] = diag
    res["plots"] = plots + diag.pop("plots")
    return res


def _clip_features(model, images: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """(N, E) float32 image embeddings on the CPU, computed in batches of 128 on ``device``."""
    device = device if device is not None else images.device
    with torch.no_grad():
        return torch.cat([model.encode_image(images[i:i + 128].to(device)).float().cpu()
                          for i in range(0, len(images), 128)])


def _clip_images(ds, idx: Sequence[int], transform, chans: int = 3) -> torch.Tensor:
    """Images ``idx`` of ``ds`` (a caption set's RGB images, or a classification set's grey ones) through the
    model's eval transform (which gives RGB); for a ``chans == 1`` image tower, the mean of the three channels."""
    load = ds.load_image if hasattr(ds, "load_image") else (lambda i: ds[i][0])
    x = torch.stack([transform(load(int(i))) for i in idx])
    return x.mean(1, keepdim=True) if chans == 1 else x


def _encode_split(model, ds, idx: np.ndarray, chans: int, device: torch.device, bar) -> torch.Tensor:
    """(N, E) embeddings of images ``idx`` of ``ds``, loaded and encoded 128 at a time (the bar counts images)."""
    out = []
    for i in range(0, len(idx), 128):
        out.append(_clip_features(model, _clip_images(ds, idx[i:i + 128], model.eval_transform, chans), device))
        bar.update(len(idx[i:i + 128]))
    return torch.cat(out)


def _clip_suite(model, dataset: str | None, p: dict, out: Path, seed: int, mmvp: str | None,
                progress: bool, device: torch.device, name: str = "") -> dict:
    dataset = dataset or "tuxpaint_captions"
    tr, te = get_dataset(dataset, split="train"), get_dataset(dataset, split="test")
    idx_te = stratified_subset(te.labels, p["max_images"], seed)
    idx_tr = stratified_subset(tr.labels, p["max_train_images"], seed)
    n_te = len(idx_te)
    captioned = hasattr(te, "captions")  # a caption set; else a classification set (no retrieval, no masks)
    chans = model.visual.patch_embed.proj.in_channels
    y_te, y_tr = torch.as_tensor(np.asarray(te.labels)[idx_te]), torch.as_tensor(np.asarray(tr.labels)[idx_tr])
    with progress_bar(total=n_te + len(idx_tr), desc="features", unit="image", disable=not progress,
                      leave=False) as bar:
        f_te = _encode_split(model, te, idx_te, chans, device, bar)
        f_tr = _encode_split(model, tr, idx_tr, chans, device, bar)
    imgs_te = _clip_images(te, idx_te[:8], model.eval_transform, chans)  # the diagnostics' batch
    classes = [c.replace("_", " ") for c in te.categories] if captioned else list(te.prompt_names)
    # one class count for every row: the classes of the test set's label space, whichever a subset holds
    res: dict[str, Any] = {"dataset": dataset, "images": n_te, "train_images": len(idx_tr),
                           "num_classes": len(classes), "skipped": {}}
    if not captioned:
        res["preprocessing"] = "grey images through the model's eval transform (not inverted)"
    with progress_bar(classes, desc="zero-shot", unit="class name", disable=not progress, leave=False) as bar:
        w = torch.cat([zero_shot_classifier(model, [c]).float().cpu() for c in bar])
    res["zero_shot"] = classification_metrics(zero_shot_logits(f_te, w), y_te, num_classes=len(classes))
    res["chance"] = classification_chance("zero_shot", res["zero_shot"], len(classes))
    if captioned:
        captions = [te.captions[int(i)] for i in idx_te]
        with torch.no_grad():
            t_emb = torch.cat([model.encode_text(model.tokenizer(captions[i:i + 256]).to(device)).float().cpu()
                               for i in range(0, n_te, 256)])
        res["retrieval"] = recall_at_k(f_te, t_emb, torch.arange(n_te))
        for key in res["retrieval"]:  # one correct item among n_te: a random ranking puts it in the top k with k/n
            res["chance"][f"retrieval.{key}"] = min(int(key.rsplit("@", 1)[1]), n_te) / n_te
    else:
        res["skipped"]["retrieval"] = f"{dataset} has no captions"
    try:
        res["linear_probe"] = {k: v for k, v in linear_probe(f_tr, y_tr, f_te, y_te, seed=seed,
                                                                max_iter=p["probe_max_iter"],
                                                                fine_steps=p["probe_fine_steps"],
                                                                progress=progress).items()
                               if k != "sweep"}
    except ValueError as e:
        res["skipped"]["linear_probe"] = str(e)
    if "linear_probe" in res:
        res["chance"].update({f"linear_probe.{k}": 1 / len(classes) for k in ("accuracy", "mean_per_class_recall")})
    try:
        res["few_shot"] = few_shot(F.normalize(f_te, dim=-1), y_te, episodes=p["episodes"], seed=seed,
                                   progress=progress)
        res["chance"]["few_shot.mean"] = 1 / res["few_shot"]["way"]  # an episode's N classes
    except ValueError as e:
        res["skipped"]["few_shot"] = str(e)
    if mmvp:
        res["mmvp"] = mmvp_eval(model, mmvp, progress=progress)
    grid = (model.img_size // model.visual.patch_embed.patch_size,) * 2
    if hasattr(te, "load_mask"):  # CLS attention inside vs outside the foreground masks, last layer and all layers
        # the first 16 images of the sample whose mask leaves a foreground and a background patch on the grid
        keep = [int(i) for i in idx_te
                if 0 < int(patch_mask(te.load_mask(int(i))[None], grid).sum()) < grid[0] * grid[1]]
        keep = keep[:16] or [int(i) for i in idx_te[:16]]
        masks = torch.stack([te.load_mask(i) for i in keep])
        with torch.no_grad(), capture_attention(model.visual) as cap:
            model.encode_image(_clip_images(te, keep, model.eval_transform, chans).to(device))
        maps = [m.combined for m in cap.layers]
        try:  # a coarse patch grid can leave an image without a background (or foreground) patch
            res["foreground_attention"] = {mode: foreground_attention(maps, masks, grid, mode=mode)
                                           for mode in ("signed", "relu")}
        except ValueError as e:
            res["skipped"]["foreground_attention"] = f"{e} (patch grid {grid[0]}×{grid[1]})"
    else:
        res["skipped"]["foreground_attention"] = f"{dataset} has no foreground masks"
    diag, _ = _diagnostics(model.visual, model.encode_image, imgs_te[:8], out, "vision", grid=grid, device=device,
                           who=f"{name} on {dataset}")
    res["diagnostics"] = diag
    res["plots"] = diag.pop("plots")
    return res


def _lm_text(text: str | None, dataset: str | None) -> tuple[str, str]:
    if text:
        return Path(text).read_text(encoding="utf-8"), str(text)

    name = dataset or "moby_dick"
    ds = get_dataset(name, split="test")
    return "\n\n".join(ds[i]["text"] for i in range(len(ds))), f"{name} (test split)"


def _lm_suite(model, model_dir: Path, dataset: str | None, text: str | None, p: dict, out: Path, seed: int,
              progress: bool, device: torch.device, name: str = "") -> dict:
    vocab, max_len = _lm_sizes(model)
    tok = get_text_tokenizer(None, model_dir=model_dir, vocab_size=vocab)
    corpus, source = _lm_text(text, dataset)
    ids = torch.tensor(tok.encode(corpus)[:p["ppl_tokens"]])
    ctx = min(max_len, 1024)
    res: dict[str, Any] = {"text": source, "tokenizer": tok.name}
    res["perplexity"] = perplexity(model, ids, context_length=ctx)
    passages = [s.strip() for s in corpus.replace("\n", " ").split(". ") if len(s.split()) >= 12]
    rng = random.Random(seed)
    passages = rng.sample(passages, min(p["lambada"], len(passages)))
    res["last_word"] = lambada_accuracy(model, tok, passages, max_context=ctx, progress=progress)
    # a model with learned absolute positions (GPT-2's wpe) cannot read past its context: the prompt leaves room
    # for the answer it generates
    margin = 8 if getattr(getattr(_bare_model(model), "config", None), "n_positions", None) else 0
    lengths = [n for n in p["needle_lengths"] if n <= max_len - margin] or [max_len - margin]
    grid = needle_grid(model, tok, corpus[:20000], lengths=lengths, depths=p["needle_depths"],
                       trials=p["needle_trials"], seed=seed, progress=progress)
    res["needle"] = {str(n): {str(d): a for d, a in row.items()} for n, row in grid.items()}
    who = f"{name} on {source}"
    plots = [plot_needle_grid(grid, out / "needle_grid.png", title=f"needle retrieval\n{who}").name]
    # attention on the needle's number vs the rest of the context (Ye et al. 2024 Table 3), signed and ReLU
    filler = tok.encode(corpus[:20000])
    noise = {"signed": [], "relu": []}
    for _ in range(4):
        prompt, answer = needle_prompt(tok, filler, length=min(lengths), depth=rng.random(), rng=rng)
        pos = _find(prompt, answer)  # the needle's number inside the prompt
        a_mask = torch.zeros(len(prompt), dtype=torch.bool)
        a_mask[pos:pos + len(answer)] = True
        c_mask = torch.ones(len(prompt), dtype=torch.bool)
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.tensor([prompt], device=device))
        maps = [m.combined for m in cap.layers]
        for mode in noise:
            noise[mode].append(answer_attention(maps, a_mask, c_mask, mode=mode))
    res["attention_noise"] = {mode: {k: float(np.mean([r[k] for r in v])) for k in ("answer", "noise")}
                              for mode, v in noise.items()}
    for v in res["attention_noise"].values():
        v["ratio"] = v["answer"] / v["noise"] if v["noise"] else math.inf
    sample = torch.tensor([tok.encode(corpus[:200])[:32]])
    diag, _ = _diagnostics(model, model, sample, out, "lm", tokens=None, device=device, who=who)
    res["diagnostics"] = diag
    res["plots"] = plots + diag.pop("plots")
    return res


def _find(seq: list[int], sub: list[int]) -> int:
    """Start of the last occurrence of ``sub`` in ``seq``."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    raise ValueError("the needle's number was not found in the prompt")


# ------------------------------------------------------------------------------------------------- driver


def evaluate(target: str | Path, out_dir: str | Path | None = None, *, dataset: str | None = None,
             text: str | None = None, mmvp: str | None = None, quick: bool = False, seed: int = 0,
             progress: bool = True, protocol: dict | None = None, device: str | None = None,
             full: bool = False) -> dict:
    """Evaluate the model in ``target``: a saved model, a run directory, or a YAML file with ``model:`` and any
    of ``dataset``, ``text``, ``mmvp``, ``quick``, ``full``, ``seed``, ``out``, ``device`` (paths relative to the
    YAML file).

    The protocol (:data:`PROTOCOLS`): ``quick`` a smoke test; by default a seeded stratified sample of the test
    images (2,000) and, for a CLIP model's linear probe, of the training images (5,000), with the papers' episode
    and corruption counts; ``full`` every image.

    ``dataset`` must fit the kind of model (:data:`EVAL_DATASETS`); ``device`` is ``cpu``, ``cuda`` or ``cuda:N``
    (None: ``cuda`` when torch sees a GPU, else ``cpu``; :func:`diffattn.utils.resolve_device`).

    Writes ``results.json`` and ``report.md`` with the plots into ``out_dir`` (default ``<run>/eval``) and returns
    the results. ``protocol`` overrides entries of the protocol (sizes, corruption list, episodes, needle grid)."""

    target = Path(target)
    with user_input():  # what the user gave: the target, a YAML file, the protocol, the dataset, the folder
        if target.is_file() and target.suffix in (".yaml", ".yml"):
            cfg = _read_yaml(target)
            if "model" not in cfg:
                raise UsageError(f"{target} must name the model to evaluate under 'model:'")
            model_path = (target.parent / cfg["model"]).resolve()

            def rel(key):  # paths in the YAML are relative to the YAML file
                return str((target.parent / cfg[key]).resolve()) if cfg.get(key) else None

            dataset, text, mmvp = dataset or cfg.get("dataset"), text or rel("text"), mmvp or rel("mmvp")
            device = device or cfg.get("device")
            quick, seed = quick or bool(cfg.get("quick", False)), int(cfg.get("seed", seed))
            full = full or bool(cfg.get("full", False))
            out_dir = out_dir or rel("out")
        else:
            model_path = target
        if quick and full:
            raise UsageError("--quick and --full pick opposite protocols: give one of them")
        protocol_name = "quick" if quick else ("full" if full else "default")
        p = dict(PROTOCOLS[protocol_name])
        unknown = set(protocol or {}) - set(p)
        if unknown:
            raise ValueError(f"protocol keys must be among {sorted(p)}, got {sorted(unknown)}")
        p.update(protocol or {})
        dev = resolve_device(device, "device")
        if text is not None and not Path(text).is_file():
            raise UsageError(f"--text {str(text)!r} is not a file")
        out = Path(out_dir) if out_dir else (Path(model_path) / "eval")
        previous = _check_output_dir(out)
        layout, model_dir = run_source(model_path, "target")  # any folder load_run takes, released ones included
        run_cfg = _run_config(model_dir)
        dataset = dataset or _dataset_name(run_cfg)
        torch.manual_seed(seed)
        model = load_run(model_dir)
        if layout.startswith("retrofit"):  # a transformers causal LM with the run's adapters (and LoRA)
            kind, name, arch = "lm", _retrofit_name(run_cfg), type(_bare_model(model)).__name__
        else:
            kind, name, arch = _kind(model), getattr(model, "model_name", None) or layout, type(model).__name__

        if dataset in DATASETS:  # a built-in set of another kind (a name it does not know: get_dataset's error)
            check_eval_dataset(dataset, kind, what="dataset")
        model = model.to(dev)
    if progress:  # what is about to run, and the other protocols, before the first bar
        sizes = (f"{p['ppl_tokens']:,} perplexity tokens" if kind == "lm" else "every image" if p["max_images"] is None
                 else f"at most {p['max_images']:,} test images")
        other = {"quick": "the default protocol without --quick, --full for every image",
                 "default": "--quick for a smoke test, --full for every image",
                 "full": "without --full a stratified sample"}[protocol_name]
        print(f"evaluating {name or arch} ({KIND_NAMES[kind]}): {protocol_name} protocol, {sizes} ({other})",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "model": {"path": str(model_dir), "name": name, "architecture": arch, "kind": kind,
                  "params": _params(model), "seed": _run_seed(run_cfg)},
        "protocol": protocol_name, "eval_seed": seed, "device": str(dev), "skipped": {}}
    try:
        with atomic_write_dir(out) as tmp:  # the whole folder at once: results, report and plots agree
            label = f"{name or arch}, run {_run_label(model_dir)}"  # every figure names model, run and dataset
            try:
                if kind == "vit":
                    results["vision"] = _vit_suite(model, dataset, p, tmp, seed, progress, dev, label)
                elif kind == "clip":
                    results["clip"] = _clip_suite(model, dataset, p, tmp, seed, mmvp, progress, dev, label)
                else:
                    results["language"] = _lm_suite(model, model_dir, dataset, text, p, tmp, seed, progress, dev,
                                                    label)
            except (FileNotFoundError, ImportError) as e:  # missing data (or extra): recorded, never silent
                results["skipped"][kind] = f"{type(e).__name__}: {e}"
                if previous is not None:
                    raise _KeepPrevious(results["skipped"][kind]) from None
            results["seconds"] = round(time.perf_counter() - t0, 1)
            results["output_dir"] = str(out)
            with open(tmp / "results.json", "w") as f:
                json.dump(results, f, indent=1, default=float)
            write_report(results, tmp / "report.md")
    except _KeepPrevious as e:
        raise UsageError(f"the {kind} suite of {model_dir} was skipped ({e}); the finished results in {out} are kept "
                         f"unchanged") from None
    return results


def _run_label(model_dir: Path) -> str:
    """The run a model belongs to, as figures name it: the run folder (``tiny_clip`` for ``runs/tiny_clip/model``:
    the folder holding ``config.yaml``, else the one holding a ``model``, ``final`` or ``best`` folder), else the
    model folder."""
    model_dir = Path(model_dir).resolve()
    for d in (model_dir, *list(model_dir.parents)[:2]):
        if (d / "config.yaml").is_file():
            return d.name
    return model_dir.parent.name if model_dir.name in ("model", "final", "best") else model_dir.name


class _KeepPrevious(Exception):
    """An evaluation skipped its suite where finished results exist: nothing is written."""


def _check_output_dir(out: Path) -> dict | None:
    """The output folder may be absent, empty or a previous evaluation's (it is replaced as a whole); returns the
    previous results when they are finished (no suite skipped), else None."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output folder {str(out)!r} is a file")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    path = out / "results.json"
    if not path.is_file():
        raise UsageError(f"output folder {str(out)!r} holds other files and no results.json; the evaluation replaces "
                         f"its output folder as a whole, so give --out an empty folder or a previous evaluation's")
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None  # a damaged result is replaced
    return previous if isinstance(previous, dict) and not previous.get("skipped") else None


# ------------------------------------------------------------------------------------------------- report


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def _table(rows: dict, head=("metric", "value"), chance: dict | None = None, prefix: str = "") -> list[str]:
    """A metric table; with ``chance`` (``{"group.metric": level}``) a chance column, and results at or below
    chance marked."""
    levels = {k: (chance or {}).get(f"{prefix}{k}") for k in rows}
    if not any(v is not None for v in levels.values()):
        lines = [f"| {head[0]} | {head[1]} |", "|---|---:|"]
        return lines + [f"| {k} | {_fmt(v)} |" for k, v in rows.items()] + [""]
    lines = [f"| {head[0]} | {head[1]} | chance |", "|---|---:|---:|"]
    for k, v in rows.items():
        level = levels[k]
        flag = " **(at or below chance)**" if level is not None and isinstance(v, (int, float)) and v <= level \
            else ""
        lines.append(f"| {k} | {_fmt(v)}{flag} | {'' if level is None else _fmt(level)} |")
    return lines + [""]


#: the suites of a results dict, in the order tables show them
SUITES = ("vision", "clip", "language")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def headline_metrics(suite: dict) -> dict[str, float]:
    """The headline metrics of one suite's results, ``{"group.metric": value}``: every group of plain numbers less
    the protocol's own numbers (:data:`BOOKKEEPING`), and the corruptions' clean / mean accuracy / mCE. The rows of
    ``diffattn eval``'s table, and the only rows ``diffattn compare`` shows."""
    rows = {f"{group}.{k}": v for group, val in suite.items() if isinstance(val, dict)
            and group not in ("diagnostics", "chance", "skipped", "plots") and val
            and all(_number(x) for x in val.values())
            for k, v in val.items() if k not in BOOKKEEPING}
    if isinstance(suite.get("corruptions"), dict):
        rows.update({f"corruptions.{k}": suite["corruptions"][k] for k in ("clean", "mean_accuracy", "mce")
                     if _number(suite["corruptions"].get(k))})
    return rows


def metric_label(suite: dict, key: str) -> str:
    """How tables name metric ``key`` (``group.metric``) of ``suite``: few-shot with its way and shot
    (``few_shot.mean (5-way 5-shot)``)."""
    group = suite.get(key.split(".", 1)[0])
    if key.startswith("few_shot.") and isinstance(group, dict) and "way" in group and "shot" in group:
        return f"{key} ({group['way']}-way {group['shot']}-shot)"
    return key


def summary_table(results: dict) -> str:
    """What ``diffattn eval`` prints: the model in one line, then per suite the report's table of its headline
    metrics (:func:`headline_metrics`), with the chance column and the results at or below chance marked where the
    suite records chance levels; ``report.md`` has every table and the plots."""
    m = results["model"]
    lines = [f"{m.get('name') or m['architecture']} ({m['architecture']}, {m['params']:,} parameters): "
             f"{results.get('protocol', '?')} protocol, {results.get('seconds', '?')} s", ""]
    for suite in SUITES:
        r = results.get(suite)
        if r is None:
            continue
        rows = headline_metrics(r)
        chance = {metric_label(r, k): v for k, v in (r.get("chance") or {}).items()}
        lines += [suite, ""] + _table({metric_label(r, k): v for k, v in rows.items()}, chance=chance)
    return "\n".join(lines).rstrip() + "\n"


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def write_report(results: dict, path: str | Path) -> Path:
    """``report.md``: the model, one table per metric group, the plots (relative links) and skipped suites."""
    m = results["model"]
    lines = [f"# Evaluation: {m.get('name') or m['architecture']}", "",
             f"`{m['path']}` · {m['architecture']} ({m['kind']}) · {m['params']:,} parameters · protocol "
             f"{results['protocol']} · {results.get('seconds', '?')} s", ""]
    for suite in ("vision", "clip", "language"):
        r = results.get(suite)
        if r is None:
            continue
        lines += [f"## {suite}", ""]
        chance = r.get("chance") or {}
        below = [k for k, level in chance.items() if isinstance(_get(r, k), (int, float)) and _get(r, k) <= level]
        if below:
            lines += [f"**At or below chance:** {', '.join(below)} (chance: what guessing uniformly scores).", ""]
        for key, val in r.items():
            if key in ("plots", "diagnostics", "skipped", "chance"):
                continue
            if key == "corruptions":
                sev = sorted({s for row in val["table"].values() for s in row})
                lines += ["", "### corruptions (accuracy)", "", "| corruption | " + " | ".join(f"s{s}" for s in sev)
                          + " |", "|---|" + "---:|" * len(sev)]
                lines += [f"| {c} | " + " | ".join(_fmt(row.get(s, "")) for s in sev) + " |"
                          for c, row in val["table"].items()]
                lines += ["", f"clean {_fmt(val['clean'])} · mean {_fmt(val['mean_accuracy'])} · mCE "
                          f"{val['mce']:.2f}", ""]
            elif key == "needle":
                lengths = list(val)
                depths = list(next(iter(val.values())))
                lines += ["", "### needle retrieval (rows: depth, columns: context length)", "",
                          "| depth | " + " | ".join(lengths) + " |", "|---|" + "---:|" * len(lengths)]
                lines += [f"| {d} | " + " | ".join(_fmt(val[n].get(d)) for n in lengths) + " |" for d in depths]
                lines += [""]
            elif key == "few_shot" and "way" in val:
                lines += ["", f"### few shot ({val['way']}-way {val['shot']}-shot, {val.get('queries', '?')} queries "
                          f"per class, {val.get('episodes', '?')} episodes; chance 1/{val['way']})", ""]
                lines += _table(val, chance=chance, prefix=f"{key}.")
            elif isinstance(val, dict) and all(not isinstance(v, dict) for v in val.values()):
                lines += ["", f"### {key.replace('_', ' ')}", ""] + _table(val, chance=chance, prefix=f"{key}.")
            elif isinstance(val, dict):
                lines += ["", f"### {key.replace('_', ' ')}", ""]
                for sub, sv in val.items():
                    lines += [f"{sub}:", ""] + (_table(sv) if isinstance(sv, dict) else [_fmt(sv), ""])
            else:
                lines += [f"- {key}: {_fmt(val)}"]
        lines += [""]
        d = r.get("diagnostics")
        if d:
            lines += ["### attention diagnostics", ""]
            lam_key = "gate_per_layer" if "gate_per_layer" in d else "lambda_per_layer"
            rows = {"layers": d["layers"], "layer kind": d["kind"]}
            rows[lam_key.replace("_", " ")] = ", ".join("—" if v is None else f"{v:.3f}" for v in d[lam_key])
            rows["entropy A1 per layer (nats)"] = ", ".join(f"{v:.3f}" for v in d["entropy_first"])
            if d["entropy_second"]:
                rows["entropy A2 per layer (nats)"] = ", ".join(f"{v:.3f}" for v in d["entropy_second"])
            lines += [f"- {k}: {v}" for k, v in rows.items()] + [""]
        for plot in r.get("plots", []):
            lines += [f"![{plot}]({plot})", ""]
        if r.get("skipped"):
            lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in r["skipped"].items()), ""]
    if results.get("skipped"):
        lines += ["## skipped", ""] + [f"- {k}: {v}" for k, v in results["skipped"].items()] + [""]
    path = Path(path)
    with atomic_write_file(path, "w") as f:
        f.write("\n".join(lines))
    return path


# ------------------------------------------------------------------------------------------------ compare


#: numbers in results that describe the protocol, not how good the model is (left out of ``compare``)
BOOKKEEPING = frozenset({"seconds", "eval_seed", "images", "episodes", "tokens", "examples", "C", "val_accuracy",
                         "layers", "params", "trials", "chance", "num_classes", "train_images", "way", "shot",
                         "queries"})
def flatten(d: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested results as ``{"suite.group.metric": value}`` in the order of the results (plots,
    paths, lists and the protocol's own numbers, :data:`BOOKKEEPING`, left out)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            if k in ("model", "skipped", "diagnostics", "sweep", "chance"):
                continue
            out.update(flatten(v, key))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and k not in BOOKKEEPING:
            out[key] = float(v)
    return out


def load_results(path: str | Path) -> list[dict]:
    """Every ``results.json`` for one run argument: the file itself, ``<dir>/results.json``,
    ``<dir>/eval/results.json``, else all of them below ``<dir>`` (one per seed)."""
    path = Path(path)
    if path.is_file():
        return [_read_results(path)]
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} does not exist (give results.json files or evaluated run folders)")
    for p in (path / "results.json", path / "eval" / "results.json"):
        if p.is_file():
            return [_read_results(p)]
    found = sorted(path.rglob("results.json"))
    if not found:
        raise UsageError(f"no results.json under {str(path)!r}: it has not been evaluated; run `diffattn eval {path}` "
                         f"first")
    return [_read_results(p) for p in found]


def _read_results(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object of results, got {type(data).__name__}")
    return data


def _compared(results: dict) -> dict[str, float]:
    """The metrics ``compare`` shows for one results dict: the eval table's rows (:func:`headline_metrics`) of every
    suite, ``suite.group.metric``."""
    return {f"{suite}.{k}": float(v) for suite in SUITES if isinstance(results.get(suite), dict)
            for k, v in headline_metrics(results[suite]).items()}


def recorded_chance(results: dict) -> dict[str, float]:
    """The chance levels a results dict records, keyed as :func:`flatten` keys its metrics (``suite.group.metric``)."""
    return {f"{suite}.{k}": float(v) for suite, r in results.items() if isinstance(r, dict)
            and isinstance(r.get("chance"), dict) for k, v in r["chance"].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def compare(runs: Sequence[str | Path], out: str | Path | None = None,
            labels: Sequence[str] | None = None) -> str:
    """A markdown table with one column per run argument: mean ± std (population, over the seeds found under it)
    of every metric the runs share, in the order of the first run's results, with the direction of better (↑/↓),
    the chance level where the results record one (:func:`recorded_chance`; "varies" where the runs' levels
    differ) and one Δ column per further run (its mean minus the first run's); a note below the table where a
    column holds one run (n = 1). The rows are those of ``diffattn eval``'s table (:func:`headline_metrics`),
    the directions those of :mod:`diffattn.directions`; written to ``out`` (and ``out`` with ``.json``) when
    given. Runs that share no metric are a :class:`~diffattn.errors.UsageError`."""
    if len(runs) < 1:
        raise UsageError("compare needs at least one run")
    labels = list(labels) if labels else [Path(r).name for r in runs]
    if len(labels) != len(runs):
        raise UsageError(f"--labels must give one name per run ({len(runs)}), got {len(labels)}")
    cols = []
    names: dict[str, str] = {}  # row labels: few-shot with its way and shot
    levels: dict[str, set[float]] = {}
    for r in runs:
        found = load_results(r)
        for res in found:
            names.update({f"{suite}.{k}": f"{suite}.{metric_label(res[suite], k)}" for suite in SUITES
                          if isinstance(res.get(suite), dict) for k in headline_metrics(res[suite])})
            for k, v in recorded_chance(res).items():
                levels.setdefault(k, set()).add(v)
        flat = [_compared(x) for x in found]
        shared = set.intersection(*(set(f) for f in flat))
        cols.append({k: (float(np.mean([f[k] for f in flat])), float(np.std([f[k] for f in flat])), len(flat))
                     for k in flat[0] if k in shared})
    keys = [k for k in cols[0] if all(k in c for c in cols[1:])]
    if not keys:
        what = " and ".join(f"{lab} ({', '.join(list(c)[:3]) or 'no metric'}…)" for lab, c in zip(labels, cols))
        raise UsageError(f"the runs share no metric to compare: {what}; evaluate them with the same suite "
                         f"(diffattn eval)")
    n = [next(iter(c.values()))[2] for c in cols]
    chance = {k: (next(iter(levels[k])) if len(levels[k]) == 1 else "varies") for k in keys if k in levels}
    head = ["metric", "better"] + (["chance"] if chance else []) + [f"{lab} (n={k})" for lab, k in zip(labels, n)] + \
        [f"Δ {lab}" for lab in labels[1:]]
    lines = ["| " + " | ".join(head) + " |",
             "|---|:-:|" + "---:|" * (len(cols) + len(cols) - 1 + bool(chance))]
    for k in keys:
        cells = [_fmt(chance.get(k, ""))] if chance else []
        for c in cols:
            mean, std, count = c[k]
            cells.append(f"{mean:.4f} ± {std:.4f}" if count > 1 else f"{mean:.4f}")
        deltas = [f"{c[k][0] - cols[0][k][0]:+.4f}" for c in cols[1:]]
        lines.append(f"| {names.get(k, k)} | {better(k)} | " + " | ".join(cells + deltas) + " |")
    single = [lab for lab, k in zip(labels, n) if k == 1]
    if single:
        lines += ["", f"n = 1 for {', '.join(single)}: one evaluated run (one seed) per column. At this size single "
                  f"seeds vary by several points, so read a Δ of a few points as noise; give a folder holding several "
                  f"seeds' runs for mean ± std."]
    if chance:
        lines += ["", "chance: what guessing uniformly scores (as recorded by diffattn eval)."]
    table = "\n".join(lines) + "\n"
    if out is not None:
        out = Path(out)
        with atomic_write_file(out, "w") as f:
            f.write(table)
        with atomic_write_file(out.with_suffix(".json"), "w") as f:
            json.dump({lab: {k: {"mean": v[0], "std": v[1], "n": v[2], **({"chance": chance[k]} if k in chance
                                                                          else {})}
                             for k, v in c.items() if k in keys}
                       for lab, c in zip(labels, cols)}, f, indent=1)
    return table
