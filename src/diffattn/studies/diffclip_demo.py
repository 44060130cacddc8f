"""The DiffCLIP demo (Hammoud & Ghanem 2025, §4) at a CPU size: ``diffattn demo``, one seed of the study
:mod:`.diffclip`.

``demo`` goes through the code path a user runs on CC3M: it lists the offline image–caption pairs (Tux Paint stamps
+ Noto emoji, ``diffattn data prepare``) in an open_clip-style TSV, trains every variant with
``diffattn train demo/<variant>`` (same data, seed and budget; only the attention differs), evaluates
each with ``diffattn eval`` (zero-shot on the 16 Tux Paint categories, image↔text retrieval on held-out pairs,
linear probe, CLS attention inside vs outside the foreground masks), adds zero-shot Fashion-MNIST, retrieval on
held-out emoji and zero-shot accuracy under common corruptions, answers the pre-registered question
(:mod:`.diffclip_question`) at its seed, then prints a side-by-side table and writes
``<out>/report.md`` with plots (:mod:`.diffclip_plots`: attention maps of every model on the same images, λ per
layer, learning curves). With ``curve_points`` the zero-shot accuracy and image↔text recall@1 on the Tux Paint test
split are also measured along training (:func:`learning_curve`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..configs import CONFIG_DIR
from ..data import get_dataset
from ..eval import classification_metrics, corruption_table, evaluate, recall_at_k, zero_shot_classifier
from ..eval.classification import classification_chance, zero_shot_logits
from ..eval.report import nested_get
from ..eval.sampling import stratified_subset
from ..factory import from_pretrained
from ..io import atomic_write_file
from ..models.clip import IMAGENET_MEAN, IMAGENET_STD
from ..train.checkpoint import load_checkpoint
from ..train.config import load_config
from ..train.loop import train
from ..train.tasks import mean_lambdas
from ..utils import check_device
from .common import require_datasets
from .diffclip_plots import attention_maps, plot_attention, plot_lambdas, plot_learning_curves
from .diffclip_question import DEMO_PAIR_SETS, QUESTION, VERDICTS, compare_to_baseline, heldout_retrieval

__all__ = ["DEMO_VARIANTS", "DEMO_DEFAULT_VARIANTS", "DEMO_DATASETS", "DEMO_ROWS", "demo", "demo_pairs",
           "demo_extra_suites", "curve_point", "learning_curve", "attention_figure", "demo_table"]

#: variant → (registered tiny model, label in the tables); diffattn/configs/demo/<variant>.yaml trains it
DEMO_VARIANTS: dict[str, tuple[str, str]] = {
    "clip": ("clip_tiny", "CLIP"),
    "diffclip": ("diffclip_tiny", "DiffCLIP"),
    "diffclip_star": ("diffclip_star_tiny", "DiffCLIP*"),
    "diffclip_dagger": ("diffclip_dagger_tiny", "DiffCLIP†"),
}
#: what ``diffattn demo`` trains without ``--variants``: the question's two models (the two others take 4 more
#: minutes and are not part of the question; ``--variants clip diffclip diffclip_star diffclip_dagger`` adds them)
DEMO_DEFAULT_VARIANTS: tuple[str, ...] = ("clip", "diffclip")
#: the image–caption sets the demo trains on (:data:`~.diffclip_question.DEMO_PAIR_SETS`), and the classification set
#: it adds for zero-shot
DEMO_DATASETS = (*DEMO_PAIR_SETS, "fashion_mnist")
#: Fashion-MNIST class names as prompts (the dataset's names, "T-shirt/top" read as "t-shirt")
FASHION_PROMPT_NAMES = ("t-shirt", "trousers", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                        "ankle boot")
#: the demo's evaluation sizes; ``diffattn demo --quick`` and the tests shrink them
DEMO_PROTOCOL: dict[str, Any] = {
    "fashion_images": 2000, "corruptions": ("gaussian_noise", "defocus_blur", "motion_blur", "contrast",
                                            "pixelate", "jpeg_compression"),
    "severities": (1, 3, 5), "eval": {"episodes": 600}}
QUICK_PROTOCOL: dict[str, Any] = {
    "fashion_images": 64, "corruptions": ("gaussian_noise",), "severities": (3,),
    "eval": {"episodes": 20, "probe_max_iter": 20, "probe_fine_steps": 2, "max_images": 48, "max_train_images": 192}}


# --------------------------------------------------------------------------------------------------- data


def _check_demo_data() -> None:
    require_datasets(DEMO_DATASETS, "diffattn demo")


def demo_pairs(out: str | os.PathLike, img_size: int = 32, max_pairs: int | None = None) -> Path:
    """Write the demo's training pairs: the train splits of the Tux Paint stamps and the emoji, each image resized
    once (bicubic, as the models' eval transform) to ``img_size`` under ``<out>/images/``, listed with its caption in
    ``<out>/train.tsv`` (open_clip's CSV convention: ``filepath`` and ``title`` columns, tab-separated) — the file
    ``data.name: csv`` reads. Reuses the files when ``<out>/train.json`` records the same request."""
    from PIL import Image

    out = Path(out)
    tsv, stamp = out / "train.tsv", out / "train.json"
    request = {"sets": list(DEMO_PAIR_SETS), "split": "train", "img_size": img_size, "max_pairs": max_pairs}
    if tsv.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("request") == request:
        return tsv
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for name in DEMO_PAIR_SETS:
        ds = get_dataset(name, split="train")
        n = len(ds) if max_pairs is None else min(len(ds), max_pairs)
        for i in range(n):
            rel = f"images/{name}-{i:05d}.png"
            with atomic_write_file(out / rel, "wb") as f:
                ds.load_image(i).resize((img_size, img_size), Image.BICUBIC).save(f, format="PNG")
            rows.append((rel, ds.captions[i].replace("\t", " ").replace("\n", " ")))
    with atomic_write_file(tsv, "w") as f:
        f.write("filepath\ttitle\n" + "".join(f"{p}\t{c}\n" for p, c in rows))
    with atomic_write_file(stamp, "w") as f:
        json.dump({"request": request, "pairs": len(rows)}, f)
    return tsv


def _config_dir(config_dir: str | os.PathLike | None) -> Path:
    """``config_dir`` if given, else the demo recipes shipped with the package (``<package>/configs/demo``)."""
    d = Path(config_dir) if config_dir else CONFIG_DIR / "demo"
    if (d / "clip.yaml").is_file():
        return d
    raise FileNotFoundError(f"config_dir must hold the demo's YAML recipes (clip.yaml, diffclip.yaml, …), none found "
                            f"in {str(d)!r}")


# ------------------------------------------------------------------------------------------- extra suites


def _to_input(images: np.ndarray, size: int) -> torch.Tensor:
    """uint8 (N, H, W[, 3]) → (N, 3, size, size) normalised like the CLIP eval transform (ImageNet mean/std)."""
    x = torch.as_tensor(np.asarray(images), dtype=torch.float32) / 255.0
    x = x[:, None].expand(-1, 3, -1, -1) if x.dim() == 3 else x.permute(0, 3, 1, 2)  # (N, 3, H, W)
    if x.shape[-1] != size:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    return (x - mean) / std


def _uint8_images(ds, n: int, size: int) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(ds.load_image(i).resize((size, size), Image.BICUBIC)) for i in range(n)])


@torch.no_grad()
def demo_extra_suites(model, protocol: dict, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """What the demo adds to ``diffattn eval``'s CLIP suite, with the eval library's own functions:

    - zero-shot on Fashion-MNIST's test images (Radford et al. 2021 §3.1.4 prompt ensemble; the grey 28×28
      products inverted to dark on white like the training images, upsampled to the model's size);
    - image↔text recall@k on the held-out (test) emoji pairs;
    - zero-shot accuracy on the Tux Paint test images under common corruptions × severities and mCE
      (Hendrycks & Dietterich 2019), corrupted at the model's input size as in CIFAR-10-C.
    """
    model.eval()
    size = model.img_size

    def encode(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([model.encode_image(x[i:i + 256]).float() for i in range(0, len(x), 256)])

    out: dict[str, Any] = {}
    fm = get_dataset("fashion_mnist", split="test")
    idx = stratified_subset(fm.labels, protocol["fashion_images"], seed)  # every class, its share
    x = _to_input(255 - np.asarray(fm.images)[idx], size)  # (n, 3, S, S): dark products on white
    w = zero_shot_classifier(model, FASHION_PROMPT_NAMES)
    out["zero_shot_fashion_mnist"] = classification_metrics(zero_shot_logits(encode(x), w),
                                                            torch.as_tensor(np.asarray(fm.labels)[idx]),
                                                            num_classes=10)
    em = get_dataset("emoji", split="test")
    imgs = torch.stack([model.eval_transform(em.load_image(i)) for i in range(len(em))])
    txt = torch.cat([model.encode_text(model.tokenizer(em.captions[i:i + 256])).float()
                     for i in range(0, len(em), 256)])
    out["retrieval_emoji"] = recall_at_k(encode(imgs), txt, torch.arange(len(em)))

    out["chance"] = {**classification_chance("zero_shot_fashion_mnist", out["zero_shot_fashion_mnist"], 10),
                     **{f"retrieval_emoji.{k}": min(int(k.rsplit("@", 1)[1]), len(em)) / len(em)
                        for k in out["retrieval_emoji"]}}
    tux = get_dataset("tuxpaint_captions", split="test")
    w = zero_shot_classifier(model, [c.replace("_", " ") for c in tux.categories])
    table = corruption_table(lambda b: zero_shot_logits(model.encode_image(b).float(), w),
                             _uint8_images(tux, len(tux), size), torch.as_tensor(tux.labels),
                             lambda u: _to_input(u, size), corruptions=protocol["corruptions"],
                             severities=protocol["severities"], seed=seed, progress=progress)
    out["corruptions"] = {"clean": table["clean"], "mean_accuracy": table["mean_accuracy"], "mce": table["mce"],
                          "table": {c: {str(s): a for s, a in row.items()} for c, row in table["table"].items()}}
    return out


@torch.no_grad()
def curve_point(model, max_images: int | None = None, seed: int = 0) -> dict[str, float]:
    """``{"zero_shot_top1", "image_to_text@1", "text_to_image@1"}`` (fractions) of ``model`` on the Tux Paint test
    split (a stratified sample of ``max_images`` images, seeded, as ``diffattn eval`` takes; all when None), measured
    as ``diffattn eval``'s CLIP suite does: zero-shot with the prompt ensemble over the 16 categories, recall@1
    between each image and its caption."""
    model.eval()
    te = get_dataset("tuxpaint_captions", split="test")
    idx = stratified_subset(te.labels, max_images or None, seed)
    n = len(idx)
    imgs = torch.stack([model.eval_transform(te.load_image(int(i))) for i in idx])  # (n, 3, S, S)
    f = torch.cat([model.encode_image(imgs[i:i + 128]).float() for i in range(0, n, 128)])  # (n, E)
    w = zero_shot_classifier(model, [c.replace("_", " ") for c in te.categories])
    top1 = (zero_shot_logits(f, w).argmax(-1) == torch.as_tensor(np.asarray(te.labels)[idx])).double().mean().item()
    captions = [te.captions[int(i)] for i in idx]
    t = torch.cat([model.encode_text(model.tokenizer(captions[i:i + 256])).float() for i in range(0, n, 256)])
    r = recall_at_k(f, t, torch.arange(n), ks=(1,))
    return {"zero_shot_top1": top1, "image_to_text@1": r["image_to_text@1"], "text_to_image@1": r["text_to_image@1"]}


def learning_curve(run_dir: str | os.PathLike, model, max_images: int | None = None,
                   seed: int = 0) -> dict[str, list]:
    """:func:`curve_point` of every checkpoint in ``<run_dir>/checkpoints`` (``model``: the run's architecture,
    whose weights are replaced by each checkpoint's), ``{"steps": [...], metric: [...]}`` in step order; the
    checkpoints but the last are deleted once measured."""
    import shutil

    dirs = sorted((Path(run_dir) / "checkpoints").glob("step_*"))
    curve: dict[str, list] = {"steps": []}
    for i, d in enumerate(dirs):
        state = load_checkpoint(d)
        model.load_state_dict(state["model"])
        curve["steps"].append(int(state["step"]))
        for k, v in curve_point(model, max_images, seed).items():
            curve.setdefault(k, []).append(v)
        if i < len(dirs) - 1:
            shutil.rmtree(d)
    return curve


def attention_figure(run_dir: str | os.PathLike, path: str | os.PathLike, *, dataset: str = "emoji",
                     n: int = 6) -> Path:
    """Redraw the demo's attention figure from a finished demo or study seed folder (``runs/demo``,
    ``runs/studies/diffclip/seed0``): every variant's saved model (``<run_dir>/<variant>/model``) on the same ``n``
    test images of ``dataset``, last vision layer's CLS attention, foreground outlined. Returns the PNG's path."""
    run_dir = Path(run_dir)
    models = {}
    for variant, (_, label) in DEMO_VARIANTS.items():
        if (run_dir / variant / "model").is_dir():
            models[label] = from_pretrained(run_dir / variant / "model").eval()
    if not models:
        raise FileNotFoundError(f"run_dir {str(run_dir)!r} holds no <variant>/model folder of "
                                f"{', '.join(DEMO_VARIANTS)}; run `diffattn demo --out {run_dir}` first")
    images, masks, cls_maps, grid, rgb, kinds = attention_maps(models, n=n, dataset=dataset)
    return plot_attention(images, masks, cls_maps, grid, Path(path), rgb, kinds)


# ------------------------------------------------------------------------------------------------- table


#: (row label, key in a variant's summary, format)
DEMO_ROWS: tuple[tuple[str, str, str], ...] = (
    ("parameters", "params", "int"),
    ("train time (s)", "train_seconds", ".0f"),
    ("final train loss", "final_loss", ".3f"),
    ("held-out retrieval mean recall (the question)", "primary.mean_recall", "pct"),
    ("zero-shot Tux Paint top-1 (16 classes)", "clip.zero_shot.top1", "pct"),
    ("zero-shot Tux Paint top-5", "clip.zero_shot.top5", "pct"),
    ("zero-shot Fashion-MNIST top-1 (10 classes)", "extra.zero_shot_fashion_mnist.top1", "pct"),
    ("Tux Paint image→text R@1", "clip.retrieval.image_to_text@1", "pct"),
    ("Tux Paint text→image R@1", "clip.retrieval.text_to_image@1", "pct"),
    ("Tux Paint image→text R@5", "clip.retrieval.image_to_text@5", "pct"),
    ("emoji image→text R@1", "extra.retrieval_emoji.image_to_text@1", "pct"),
    ("emoji text→image R@1", "extra.retrieval_emoji.text_to_image@1", "pct"),
    ("emoji image→text R@5", "extra.retrieval_emoji.image_to_text@5", "pct"),
    ("linear probe Tux Paint top-1", "clip.linear_probe.accuracy", "pct"),
    ("corruptions: mean zero-shot acc", "extra.corruptions.mean_accuracy", "pct"),
    ("corruptions: mCE (lower is better)", "extra.corruptions.mce", ".1f"),
    ("CLS density in/out of mask (signed)", "clip.foreground_attention.signed.density_ratio", ".2f"),
    ("CLS density in/out of mask (ReLU)", "clip.foreground_attention.relu.density_ratio", ".2f"),
    ("λ vision layers", "lambda.vision", "list"),
    ("λ text layers", "lambda.text", "list"),
)


def _fmt(v, kind: str) -> str:
    if v is None or (isinstance(v, list) and not v):
        return "—"
    if kind == "int":
        return f"{int(v):,}"
    if kind == "pct":
        return f"{100 * float(v):.1f}"
    if kind == "list":
        return ", ".join(f"{x:.2f}" for x in v)
    return format(float(v), kind)


def _chance(variant: dict, key: str) -> float | None:
    """The chance level of ``key`` (``suite.group.metric``) that the suite recorded under ``suite.chance``."""
    suite, _, rest = key.partition(".")
    level = nested_get(variant, suite)
    level = level.get("chance", {}).get(rest) if isinstance(level, dict) else None
    return float(level) if isinstance(level, (int, float)) else None


def demo_table(summary: dict[str, dict]) -> str:
    """The side-by-side markdown table: one column per variant (accuracies and recalls in %); where the suites
    recorded chance levels, a chance column, and results at or below chance marked ``*``."""
    labels = list(summary)
    chances = {key: next((c for lab in labels if (c := _chance(summary[lab], key)) is not None), None)
               for _, key, _ in DEMO_ROWS}
    with_chance = any(c is not None for c in chances.values())
    lines = ["| metric | " + " | ".join(labels) + (" | chance |" if with_chance else " |"),
             "|---|" + "---:|" * (len(labels) + with_chance)]
    flagged = False
    for name, key, kind in DEMO_ROWS:
        cells = []
        for lab in labels:
            v, c = nested_get(summary[lab], key), chances[key]
            low = c is not None and isinstance(v, (int, float)) and v <= c
            flagged |= low
            cells.append(_fmt(v, kind) + (" *" if low else ""))
        if with_chance:
            cells.append(_fmt(chances[key], kind) if chances[key] is not None else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if flagged:
        lines += ["", "\\* at or below chance (what guessing uniformly scores)."]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- demo


def demo(out_dir: str | os.PathLike = "runs/demo", variants: tuple[str, ...] = DEMO_DEFAULT_VARIANTS, *,
         steps: int | None = None, batch_size: int | None = None, seed: int = 0, quick: bool = False,
         config_dir: str | os.PathLike | None = None, progress: bool = True,
         max_pairs: int | None = None, curve_points: int | None = None,
         device: str | None = None) -> dict[str, Any]:
    """The DiffCLIP-vs-CLIP study end to end (module docstring): train every variant in ``variants`` with
    the packaged recipe ``demo/<variant>`` (``steps`` / ``batch_size`` / ``seed`` override it), evaluate it, answer
    :data:`QUESTION` (:func:`compare_to_baseline`: the control on the first variant, a verdict for each other), write
    ``<out_dir>/report.md``, ``results.json`` and the plots, and return ``{"summary", "answer", "table", "seconds",
    …}``.
    ``quick`` shrinks the evaluation (:data:`QUICK_PROTOCOL`); ``max_pairs`` caps the pairs taken from each set;
    ``curve_points`` adds each variant's :func:`learning_curve` at that many evenly spaced steps (``"curve"``).
    ``device`` (``cpu``, ``cuda`` or ``cuda:N``; None: ``cuda`` when torch sees a GPU, else ``cpu``) is where every
    variant trains (its ``run.device``) and ``diffattn eval`` runs; the demo's own measurements (held-out
    retrieval, the extra suites, the maps) run on the CPU, a few seconds for these tiny models.

    Raises:
        DatasetNotInstalledError: Tux Paint, emoji or Fashion-MNIST is not prepared (the message names
            ``diffattn data prepare``).
        ValueError: an unknown variant.
    """
    bad = [v for v in variants if v not in DEMO_VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants must be a non-empty subset of {list(DEMO_VARIANTS)}, got {list(variants)}")
    check_device(device, "device")
    _check_demo_data()
    t_start = time.perf_counter()
    out = Path(out_dir)
    configs = _config_dir(config_dir)
    protocol = QUICK_PROTOCOL if quick else DEMO_PROTOCOL
    print(f"[demo] writing the training pairs (Tux Paint + emoji train splits) to {out / 'data'}", flush=True)
    tsv = demo_pairs(out / "data", max_pairs=max_pairs)
    summary: dict[str, dict] = {}
    curves: dict[str, list] = {}
    models: dict[str, Any] = {}
    lams: dict[str, dict] = {}
    for v in variants:
        name, label = DEMO_VARIANTS[v]
        sets = [f"data.path={tsv}", f"run.seed={seed}", f"run.progress={str(progress).lower()}"]
        sets += [f"run.steps={steps}", f"run.ckpt_every={steps}", "optim.warmup_steps=" + str(max(1, steps // 10))] \
            if steps else []
        sets += [f"run.batch_size={batch_size}"] if batch_size else []
        sets += [f"run.device={device}"] if device is not None else []
        cfg = load_config(configs / f"{v}.yaml", sets)
        if curve_points:  # a checkpoint every steps / curve_points steps, all kept until measured
            every = max(1, cfg.run.steps // curve_points)
            cfg = load_config(configs / f"{v}.yaml", sets + [f"run.ckpt_every={every}",
                                                              f"run.keep_last={cfg.run.steps // every + 1}"])
        run_dir = out / v
        print(f"[demo] {label}: diffattn train {configs / f'{v}.yaml'} ({cfg.model.name}, {cfg.run.steps} steps of "
              f"{cfg.run.batch_size} pairs) -> {run_dir}", flush=True)
        t0 = time.perf_counter()
        result = train(cfg, out=run_dir, overwrite=True)  # the demo retrains its runs
        train_s = time.perf_counter() - t0
        print(f"[demo] {label}: trained in {train_s:.0f} s, final loss {result['final_loss']:.3f}; diffattn eval",
              flush=True)
        res = evaluate(run_dir, run_dir / "eval", dataset="tuxpaint_captions", quick=True, seed=seed,
                       progress=progress, protocol=protocol["eval"], device=device)
        if res.get("skipped"):
            raise RuntimeError(f"diffattn eval skipped suites of {run_dir}: {res['skipped']}")
        model = from_pretrained(run_dir / "model").eval()
        extra = demo_extra_suites(model, protocol, seed=seed, progress=progress)
        primary = heldout_retrieval(model)
        with atomic_write_file(run_dir / "eval" / "demo_extra.json", "w") as f:
            json.dump(extra, f, indent=1)
        lams[label] = {"vision": mean_lambdas(model.visual), "text": mean_lambdas(model.text)}
        summary[label] = {"variant": v, "model": name, "params": res["model"]["params"],
                          "train_seconds": round(train_s, 1), "final_loss": result["final_loss"],
                          "primary": primary, "clip": res["clip"], "extra": extra, "lambda": lams[label],
                          "eval_report": str(Path(v) / "eval" / "report.md")}
        if curve_points:
            summary[label]["curve"] = learning_curve(run_dir, from_pretrained(run_dir / "model"),
                                                     protocol["eval"].get("max_images"), seed)
        curves[label] = [(r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text()
                                                              .splitlines()) if "loss" in r]  # not eval rows
        models[label] = model
    plots = [plot_learning_curves(curves, out / "learning_curves.png").name]
    if any(v for t in lams.values() for v in t.values()):
        plots.append(plot_lambdas(lams, out / "lambda_per_layer.png").name)
    images, masks, cls_maps, grid, rgb, kinds = attention_maps(models)
    plots.insert(0, plot_attention(images, masks, cls_maps, grid, out / "attention_maps.png", rgb, kinds).name)
    emoji = attention_maps(models, dataset="emoji")  # Noto emoji: free to publish, unlike the GPL-2 stamps
    plots.insert(1, plot_attention(*emoji[:4], out / "attention_maps_emoji.png", emoji[4], emoji[5]).name)
    seconds = time.perf_counter() - t_start
    table = demo_table(summary)
    answer = compare_to_baseline(summary, seed)
    report = _demo_report(summary, table, plots, seconds, cfg, quick, answer)
    with atomic_write_file(out / "report.md", "w") as f:
        f.write(report)
    with atomic_write_file(out / "results.json", "w") as f:
        json.dump({"summary": summary, "question": QUESTION, "answer": {k: answer[k] for k in ("control", "tests")},
                   "seconds": round(seconds, 1), "plots": plots}, f, indent=1, default=float)
    return {"summary": summary, "answer": answer, "table": table, "seconds": seconds, "plots": plots,
            "report": str(out / "report.md")}


def _demo_report(summary: dict, table: str, plots: list[str], seconds: float, cfg, quick: bool,
                 answer: dict) -> str:
    first = next(iter(summary.values()))
    n_test = {"tux": first["clip"]["images"]}
    n_pairs = len(first["primary"]["per_pair"])
    lines = [
        "# DiffCLIP vs CLIP, trained from scratch on the offline image–caption pairs", "",
        f"Every model: the same tiny towers (32×32 images, patch 4, width 64, 2 blocks; text width 64, 2 blocks) "
        f"trained from scratch for {cfg.run.steps} steps of {cfg.run.batch_size} pairs (seed {cfg.run.seed}, "
        f"AdamW lr {cfg.optim.lr:g}) on the train splits of the Tux Paint stamps and the Noto emoji; only the "
        f"attention differs (Hammoud & Ghanem 2025, §4). Total wall time {seconds / 60:.1f} min"
        + (" (quick protocol)." if quick else "."), "",
        f"## The question (pre-registered {QUESTION['registered']})", "",
        f"{QUESTION['text']} Metric: {QUESTION['metric']}. Test: {QUESTION['test']}. Verdicts: "
        + " / ".join(f'"{v}"' for v in VERDICTS) + " (inconclusive whenever the control fails).", "",
        *answer["lines"], "",
        f"The verdict is for these models at seed {cfg.run.seed}: the paired test counts the {n_pairs} held-out "
        f"pairs as the sample, not the training run, and a single-seed result also changes with the machine's "
        f"floating-point path (thread count, CPU instruction set, library build). The same question over seeds "
        f"0–4, paired over seeds: `diffattn study diffclip`.", "",
        "## Secondary results", "",
        table, "",
        f"Held-out retrieval mean recall: the question's metric above ({n_pairs} held-out pairs). "
        f"Zero-shot, retrieval and linear probe on the held-out Tux Paint test split ({n_test['tux']} "
        f"images, 16 categories; `diffattn eval`); Fashion-MNIST zero-shot on its test images, inverted to dark on "
        f"white; emoji retrieval on the emoji test split; corruptions: zero-shot Tux Paint accuracy under "
        f"{', '.join(first['extra']['corruptions']['table'])} at severities "
        f"{', '.join(next(iter(first['extra']['corruptions']['table'].values())))}, mCE = 100 − 100 · mean accuracy "
        f"(Hendrycks & Dietterich 2019). CLS density ratio: CLS attention per foreground patch over per "
        f"background patch (alpha-channel masks; mean over layers, heads and 16 test images); > 1 means the "
        f"model looks at the object. Accuracies and recalls in %.", "",
        "## Attention maps", "", f"![attention maps]({plots[0]})", "",
        "The same maps on held-out Noto emoji (which, unlike the GPL-2 stamps, may be published with the results):",
        "", f"![attention maps, emoji]({plots[1]})", "",
        "## Learning curves and λ", ""] + [f"![{p}]({p})" for p in plots[2:]] + ["",
        "## Per-model evaluation reports", ""] + [
        f"- {label}: [{s['eval_report']}]({s['eval_report']}) (model saved in `{s['variant']}/model`, load with "
        f"`diffattn.from_pretrained`)" for label, s in summary.items()] + ["",
        "Reproduce: `make demo` (or `diffattn demo`); one run: `diffattn train demo/diffclip` then "
        "`diffattn eval runs/demo/diffclip --dataset tuxpaint_captions --quick`.", ""]
    return "\n".join(lines)
