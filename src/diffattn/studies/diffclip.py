"""The DiffCLIP study (Hammoud & Ghanem 2025, §4) at a CPU size: ``diffattn demo`` (one seed) and
``diffattn study diffclip`` (the demo at several seeds, aggregated).

``demo`` goes through the code path a user runs on CC3M: it lists the offline image–caption pairs (Tux Paint stamps
+ Noto emoji, ``diffattn data prepare``) in an open_clip-style TSV, trains every variant with
``diffattn train demo/<variant>`` (same data, seed and budget; only the attention differs), evaluates
each with ``diffattn eval`` (zero-shot on the 16 Tux Paint categories, image↔text retrieval on held-out pairs,
linear probe, CLS attention inside vs outside the foreground masks), adds zero-shot Fashion-MNIST, retrieval on
held-out emoji and zero-shot accuracy under common corruptions, then prints a side-by-side table and writes
``<out>/report.md`` with plots (attention maps of every model on the same images, λ per layer, learning curves).

The study runs the demo at every seed into ``<out>/seed<k>/`` (a seed whose ``results.json`` already holds every
variant is read back instead of retrained) and aggregates the table's metrics over seeds. With ``curve_points``
the zero-shot accuracy and image↔text recall@1 on the Tux Paint test split are also measured along training, at
``curve_points`` evenly spaced steps (:func:`learning_curve`), so that a difference in how fast the models learn
shows as well as where they end.

The question (:data:`QUESTION`, pre-registered 2026-11-27, before any run of it): does DiffCLIP retrieve held-out
pairs of its own training distribution better than CLIP trained on the same data, seed and budget? The metric is
the mean recall of :func:`heldout_retrieval` (R@1, R@5 and R@10, image→text and text→image, averaged per pair) on
the 222 held-out pairs of the two training sets (the test splits of the Tux Paint stamps and the emoji, never
trained on). Its control (:data:`CONTROL`): the baseline must reach twice chance (9.6 %; chance 4.8 %), at the
demo's seed and on the mean over the study's seeds; below it the verdict is "inconclusive". The verdict
(:func:`verdict`) is one of :data:`VERDICTS`: the demo (one seed) tests the difference paired over the 222 held-out
pairs, the study paired over seeds. Zero-shot Tux Paint, Fashion-MNIST, the linear probe, corruptions and the
attention maps stay as secondary results. The earlier control, zero-shot Tux Paint top-1 ≥ 12.5 %, failed (CLIP
8.8 % at seed 0, 12.1 % over five seeds; flat from step 300): the 16 category names ("animals") are folders the
captions ("A frog.") never name, so at this size it measured transfer, not whether CLIP learnt its training task.
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
from ..diagnostics import capture_attention
from ..diagnostics import plots as diag_plots
from ..eval import classification_metrics, corruption_table, evaluate, recall_at_k, zero_shot_classifier
from ..eval.classification import zero_shot_logits
from ..eval.retrieval import hits_at_k
from ..eval.runner import classification_chance, stratified_subset
from ..factory import from_pretrained
from ..io import atomic_write_file
from ..models.clip import IMAGENET_MEAN, IMAGENET_STD
from ..train.checkpoint import load_checkpoint
from ..train.config import load_config
from ..train.loop import train
from ..train.tasks import mean_lambdas
from ..utils import check_device, device_errors
from . import claims
from .base import Study, StudyConfig, higher_is_better, raised_errors, register_study, require_datasets
from .report import Control, Metric, check_control, write_study
from .stats import mean_std, paired_test
from .verdict import VERDICTS, Verdict, derive_verdict

__all__ = ["DiffCLIPStudy",
           "DEMO_VARIANTS", "DEMO_DEFAULT_VARIANTS", "DEMO_ROWS", "VARIANTS", "DEFAULTS", "QUESTION", "CONTROL",
           "VERDICTS", "PAPER_EFFECT", "heldout_retrieval", "verdict", "compare_to_baseline", "curve_point",
           "learning_curve", "curve_table", "demo", "demo_pairs", "demo_table", "run"]

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
#: the image–caption sets the demo trains on, and the classification set it adds for zero-shot
DEMO_PAIR_SETS = ("tuxpaint_captions", "emoji")
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


#: the recall depths averaged by :func:`heldout_retrieval`
HELDOUT_KS = (1, 5, 10)


@torch.no_grad()
def heldout_retrieval(model) -> dict[str, Any]:
    """The demo's question metric (:data:`QUESTION`): image↔text retrieval on the held-out pairs of the training
    distribution, the test splits of the Tux Paint stamps (91 pairs) and the emoji (131), each split its own
    gallery. Each pair scores the mean of its six hits (R@1, R@5, R@10; image→text and text→image; ties count
    against the query, :func:`~diffattn.eval.retrieval.hits_at_k`), so the mean over pairs is the mean recall
    (RSUM / 6). Returns ``{"mean_recall", "per_pair" (one score per pair, Tux Paint first), "sets": {name:
    {"pairs", "mean_recall", "chance"}}, "chance": {"mean_recall": …}}`` (fractions); chance is what a random
    ranking scores, k / n averaged over the ks and pairs."""
    model.eval()
    per_pair: list[float] = []
    sets: dict[str, dict] = {}
    chance_sum = 0.0
    for name in DEMO_PAIR_SETS:
        ds = get_dataset(name, split="test")
        n = len(ds)
        imgs = torch.stack([model.eval_transform(ds.load_image(i)) for i in range(n)])  # (n, 3, S, S)
        f = torch.cat([model.encode_image(imgs[i:i + 256]).float() for i in range(0, n, 256)])  # (n, E)
        t = torch.cat([model.encode_text(model.tokenizer(ds.captions[i:i + 256])).float()
                       for i in range(0, n, 256)])[:n]  # (n, E)
        sim = torch.nn.functional.normalize(f.double(), dim=-1) @ torch.nn.functional.normalize(t.double(), dim=-1).t()
        correct = torch.eye(n, dtype=torch.bool)  # pair i: image i and caption i
        hits = torch.stack([h for k in HELDOUT_KS for h in (hits_at_k(sim, correct, k),
                                                            hits_at_k(sim.t(), correct, k))]).double()  # (6, n)
        scores = hits.mean(dim=0).tolist()
        chance = sum(min(k, n) for k in HELDOUT_KS) / len(HELDOUT_KS) / n
        sets[name] = {"pairs": n, "mean_recall": sum(scores) / n, "chance": chance}
        per_pair += scores
        chance_sum += chance * n
    return {"mean_recall": sum(per_pair) / len(per_pair), "per_pair": per_pair, "sets": sets,
            "chance": {"mean_recall": chance_sum / len(per_pair)}}


# --------------------------------------------------------------------------------------- the question

#: the demo's question, pre-registered on 2026-11-27 before any run of it (module docstring)
QUESTION: dict[str, Any] = {
    "registered": "2026-11-27",
    "text": "Does DiffCLIP retrieve held-out pairs of its own training distribution better than CLIP trained on "
            "the same data, seed and budget (Hammoud & Ghanem 2025, §4: DiffCLIP ahead on image–text "
            "retrieval)?",
    "metric": "held-out retrieval mean recall: R@1, R@5, R@10, image→text and text→image, averaged over the 222 "
              "held-out pairs (91 Tux Paint test pairs, 131 emoji test pairs, each split its own gallery)",
    "key": "primary.mean_recall",
    "baseline": "clip", "variant": "diffclip",
    "test": "demo (one seed): two-sided paired t-test over the 222 held-out pairs of the per-pair score "
            "difference, with its 95 % interval; study: the same metric paired over seeds. α = 0.05, one "
            "pre-registered test per variant, so no multiplicity correction for it",
}
#: the paper's effect a null must exclude, in points of mean recall (:data:`diffattn.studies.claims.DIFFCLIP_RETRIEVAL`:
#: the paper gives no retrieval gain in these units; +2 points, fixed before the run, is the order of its headline
#: gains; its Table 2 at CC3M gives +1.2 image and +1.8 text retrieval R@5)
PAPER_EFFECT = claims.DIFFCLIP_RETRIEVAL.size
#: the positive control, pre-registered with :data:`QUESTION`: the baseline's held-out retrieval mean recall at
#: least twice chance (chance (1 + 5 + 10) / 3 / n averaged over the 222 pairs = 4.80 %; 2 × = 9.6 %)
CONTROL = Control("baseline held-out retrieval mean recall (%; R@1/5/10 both directions over the 222 held-out "
                  "Tux Paint + emoji pairs, chance 4.8 %)", "primary.mean_recall", 9.6, scale=100.0)


def verdict(test: dict[str, Any] | None, control_passed: bool, alpha: float = 0.05) -> str:
    """One of :data:`VERDICTS` from a :func:`~diffattn.studies.stats.paired_test` of variant − baseline in points
    (None: no test), by :func:`~diffattn.studies.verdict.derive_verdict` against
    :data:`~diffattn.studies.claims.DIFFCLIP_RETRIEVAL` with the test's own p (one pre-registered test per variant,
    no multiplicity correction): "inconclusive" when the control failed or there is no test; "reproduced" /
    "opposite" when p < ``alpha``; the null when the upper end of the 95 % interval lies below
    :data:`PAPER_EFFECT`; "inconclusive" otherwise (the interval holds both 0 and the paper's effect)."""
    if not test:
        return Verdict.INCONCLUSIVE.value
    return derive_verdict(test["mean_diff"], test["ci95"], test["p"], claims.DIFFCLIP_RETRIEVAL, alpha=alpha,
                          control_passed=control_passed).value


def why(word: str) -> str:
    """What a tested :func:`verdict` means, for the report line."""
    return {Verdict.REPRODUCED.value: "the variant is ahead, p < 0.05",
            Verdict.OPPOSITE.value: "the variant is behind, p < 0.05",
            Verdict.NULL_EXCLUDES.value: f"no significant difference, and the interval ends below the paper's "
                                         f"+{PAPER_EFFECT:g} points of mean recall",
            Verdict.INCONCLUSIVE.value: f"the interval holds both 0 and the paper's +{PAPER_EFFECT:g}: this budget "
                                        f"cannot tell them apart"}[word]


def _difference_text(lab: str, base: str, test: dict[str, Any], paired_over: str) -> str:
    """The paired difference of the question's metric as the report states it."""
    lo, hi = test["ci95"]
    return (f"{lab} − {base} = {test['mean_diff']:+.2f} points of mean recall, 95 % interval [{lo:+.2f}, {hi:+.2f}], "
            f"p = {test['p']:.3g} (paired t {paired_over}); the paper's effect taken as +{PAPER_EFFECT:g} points.")


def compare_to_baseline(summary: dict[str, dict], seed: int) -> dict[str, Any]:
    """The demo's answer at one seed: :data:`CONTROL` on the first variant (the baseline) and, for every other
    variant, the paired test over the held-out pairs of its per-pair score minus the baseline's (in points) and
    its :func:`verdict`. Returns ``{"control": check_control's dict, "tests": {label: test + "verdict"},
    "lines": the report's lines}``."""
    labels = list(summary)
    base = labels[0]
    control = check_control({seed: summary}, CONTROL)
    value = control["values"][0] if control["values"] else float("nan")
    lines = [f"**Control** (pre-registered {QUESTION['registered']}): {CONTROL.name} must be ≥ {CONTROL.threshold:g}; "
             f"{base} reached {value:.1f} at seed {seed}: "
             + ("**passed**." if control["passed"] else "**failed**, so the verdict is inconclusive: the baseline "
                                                        "did not learn the task."), ""]
    tests: dict[str, Any] = {}
    for lab in labels[1:]:
        a = [100 * v for v in summary[lab]["primary"]["per_pair"]]
        b = [100 * v for v in summary[base]["primary"]["per_pair"]]
        test = paired_test(a, b) if control["passed"] else None
        word = verdict(test, control["passed"])
        tests[lab] = {**(test or {}), "verdict": word}
        if test:
            lines.append(f"**Verdict, {lab} vs {base}: {word}** ({why(word)}). " + _difference_text(
                lab, base, test, f"over the {test['n']} held-out pairs; {test['wins']} pairs higher, "
                                 f"{test['losses']} lower"))
        else:
            lines.append(f"**Verdict, {lab} vs {base}: {word}** (the control failed; no test).")
    if len(labels) < 2:
        lines.append("**Verdict: inconclusive** (one variant: nothing to compare).")
    return {"control": control, "tests": tests, "lines": lines}


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


# ------------------------------------------------------------------------------------------------- plots


def _plot_learning_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    plt = diag_plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, rows in curves.items():
        ax.plot([s for s, _ in rows], [v for _, v in rows], label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("contrastive loss (train batch)")
    ax.legend(fontsize=8)
    ax.set_title("learning curves (same data, seed and budget)")
    return diag_plots.save_figure(fig, path)


def _plot_lambdas(lams: dict[str, dict[str, list[float]]], path: Path) -> Path:
    plt = diag_plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, towers in lams.items():
        names = [f"{t} {i}" for t, v in towers.items() for i in range(len(v))]
        vals = [x for v in towers.values() for x in v]
        if vals:
            ax.plot(names, vals, marker="o", label=label)
    ax.set_xlabel("tower and layer")
    ax.set_ylabel("λ (mean over heads)")
    ax.legend(fontsize=8)
    ax.set_title("learned λ per layer (Ye et al. 2024 eq. 2 re-parameterisation)")
    return diag_plots.save_figure(fig, path)


#: how the attention figure names each layer kind (:attr:`diffattn.diagnostics.AttentionMaps.kind`) in a row's title
KIND_TITLES = {"standard": "softmax", "diff": "A1 − λA2, signed", "gated": "gated, signed", "retrofit": "retrofit"}


def _plot_attention(images: torch.Tensor, masks: torch.Tensor, cls_maps: dict[str, torch.Tensor], grid, path: Path,
                    rgb: np.ndarray, kinds: dict[str, str] | None = None) -> Path:
    """Row 0: the images with their foreground outline; one row per model: the last layer's CLS attention (mean over
    heads) over the patch grid, one colour scale per model, stated in the row's title because the rows' ranges
    differ by an order of magnitude (a softmax map reaches 0.3, a differential one ±0.01). A row is titled by its
    layer's kind (``kinds[label]``, :data:`KIND_TITLES`), never by its values' sign: a differential map without a
    negative entry is still differential. Its colour scale is diverging and centred on 0 for a map that can be
    signed (any kind but standard softmax) or has negative entries, else from 0. A uniform map says so."""
    plt = diag_plots.pyplot()
    n, rows = len(images), 1 + len(cls_maps)
    fig, axes = plt.subplots(rows, n, figsize=(1.9 * n, 1.9 * rows), squeeze=False)
    H, W = masks.shape[-2:]
    for j in range(n):
        ax = axes[0, j]
        ax.imshow(rgb[j], extent=(0, W, H, 0))
        ax.contour(masks[j].float().numpy(), levels=[0.5], colors="k", linewidths=0.6)
        ax.axis("off")
    axes[0, 0].set_title("image", fontsize=8, loc="left")
    for i, (label, maps) in enumerate(cls_maps.items(), start=1):
        v = float(maps.abs().max()) or 1.0
        kind = (kinds or {}).get(label)
        signed = kind not in (None, "standard") or bool((maps < 0).any())  # diverging, centred on 0; else from 0
        style = dict(cmap="RdBu_r", vmin=-v, vmax=v) if signed else dict(cmap="viridis", vmin=0, vmax=v)
        for j in range(n):
            ax = axes[i, j]
            im = ax.imshow(maps[j].reshape(grid).numpy(), extent=(0, W, H, 0), **style)
            ax.contour(masks[j].float().numpy(), levels=[0.5], colors="k", linewidths=0.6)
            if not signed and diag_plots.is_uniform(maps[j]):
                ax.text(0.5, 0.5, "uniform", transform=ax.transAxes, ha="center", va="center", fontsize=7,
                        color="white", bbox=dict(facecolor="black", alpha=0.6, lw=0))
            ax.set_xticks([])
            ax.set_yticks([])
        name = KIND_TITLES.get(kind, kind) if kind is not None else ("signed" if signed else "non-negative")
        scale = f"±{v:.2g}" if signed else f"0 to {v:.2g}"
        axes[i, 0].set_title(f"{label} ({name}): own colour scale, {scale}", fontsize=8, loc="left")
        axes[i, 0].set_ylabel(f"{label}\npatch row", fontsize=9)
        fig.colorbar(im, ax=list(axes[i]), fraction=0.02)
    for j in range(n):
        axes[-1, j].set_xlabel("patch column", fontsize=8)
    fig.suptitle(f"CLS attention of the last vision layer over the {grid[0]}×{grid[1]} patch grid (mean over "
                 f"heads; black: foreground outline).\nEach row has its own colour scale, stated in its title: "
                 f"compare where a model looks, not colours across rows.", fontsize=9)
    return diag_plots.save_figure(fig, path)


@torch.no_grad()
def _attention_maps(models: dict[str, Any], n: int = 6, dataset: str = "tuxpaint_captions"
                    ) -> tuple[torch.Tensor, torch.Tensor, dict, tuple, np.ndarray, dict[str, str]]:
    """The same ``n`` test images of ``dataset`` (an image–caption set with foreground masks: ``tuxpaint_captions``
    or ``emoji``) through every model: last-layer CLS rows (n, P), mean over heads, and each model's last-layer
    kind."""
    data = get_dataset(dataset, split="test")
    first = next(iter(models.values()))
    idx = list(range(0, len(data), max(1, len(data) // n)))[:n]
    images = torch.stack([first.eval_transform(data.load_image(i)) for i in idx])
    masks = torch.stack([data.load_mask(i) for i in idx])
    rgb = np.stack([np.asarray(data.load_image(i)) for i in idx])
    grid = (first.img_size // first.visual.patch_embed.patch_size,) * 2
    out, kinds = {}, {}
    for label, model in models.items():
        with capture_attention(model.visual) as cap:
            model.encode_image(images)
        out[label] = cap.layers[-1].combined.mean(dim=1)[:, 0, 1:]  # (n, P): CLS row over the patches
        kinds[label] = cap.layers[-1].kind
    return images, masks, out, grid, rgb, kinds


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
    images, masks, cls_maps, grid, rgb, kinds = _attention_maps(models, n=n, dataset=dataset)
    return _plot_attention(images, masks, cls_maps, grid, Path(path), rgb, kinds)


# ------------------------------------------------------------------------------------------------- table


def _get(d: dict, path: str):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


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
    level = _get(variant, suite)
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
            v, c = _get(summary[lab], key), chances[key]
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
    plots = [_plot_learning_curves(curves, out / "learning_curves.png").name]
    if any(v for t in lams.values() for v in t.values()):
        plots.append(_plot_lambdas(lams, out / "lambda_per_layer.png").name)
    images, masks, cls_maps, grid, rgb, kinds = _attention_maps(models)
    plots.insert(0, _plot_attention(images, masks, cls_maps, grid, out / "attention_maps.png", rgb, kinds).name)
    emoji = _attention_maps(models, dataset="emoji")  # Noto emoji: free to publish, unlike the GPL-2 stamps
    plots.insert(1, _plot_attention(*emoji[:4], out / "attention_maps_emoji.png", emoji[4], emoji[5]).name)
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


# ------------------------------------------------------------------------------------------------- study

#: the variants a study config may name (the first listed in the config is the baseline)
VARIANTS = tuple(DEMO_VARIANTS)
#: the budget keys of diffattn/configs/studies/diffclip.yaml (None: the demo recipe's value)
DEFAULTS: dict[str, Any] = {"steps": None, "batch_size": None, "quick": False, "max_pairs": None,
                            "curve_points": None, "device": None}


def check_config(cfg: dict[str, Any], where: str) -> None:
    """``steps``, ``batch_size``, ``max_pairs`` and ``curve_points`` are None (the recipes' values; no curve) or
    ints >= 1."""
    errors: list[str] = []  # every constraint the config breaks, reported together
    for key in ("steps", "batch_size", "max_pairs", "curve_points"):
        v = cfg[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            errors.append(f"{key} in {where} must be null (the demo recipe's value) or an int >= 1, got {v!r}")
    errors += device_errors(cfg, where)
    if errors:
        raise ValueError("; ".join(errors))


def _metrics():
    neither = {"clip.foreground_attention.signed.density_ratio", "clip.foreground_attention.relu.density_ratio"}
    return [Metric(name, key, 100.0 if kind == "pct" else 1.0, 1 if kind in ("pct", ".1f") else 3,
                   None if key in neither else higher_is_better(key) is not False,
                   claim=claims.DIFFCLIP_RETRIEVAL if key == CONTROL.key else None)
            for name, key, kind in DEMO_ROWS if kind not in ("list", "int") and key != "train_seconds"]


def _finished_demo(folder: Path, cfg: dict[str, Any]) -> dict | None:
    """The summary of a finished demo in ``folder`` run with this config's variants, steps and batch size, else
    None (so that a re-run of the study only trains the missing seeds)."""
    import yaml

    path = folder / "results.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text()).get("summary", {})
    if [s.get("variant") for s in summary.values()] != list(cfg["variants"]):
        return None
    if any("primary" not in s for s in summary.values()):  # a demo from before the question: measure it again
        return None
    if cfg["curve_points"] and any(len(s.get("curve", {}).get("steps", ())) < cfg["curve_points"]
                                   for s in summary.values()):
        return None
    for s in summary.values():
        run_cfg = folder / s["variant"] / "config.yaml"
        if not run_cfg.is_file():
            return None
        run = (yaml.safe_load(run_cfg.read_text()) or {}).get("run", {})
        if any(cfg[k] is not None and run.get(k) != cfg[k] for k in ("steps", "batch_size")):
            return None
    return summary


@register_study
class DiffCLIPStudy(Study):
    """The demo at every seed (``<out>/seed<k>/``, each with its own report; finished seeds are read back), then the
    table's metrics as mean ± std over seeds with paired tests against the first variant."""

    name = "diffclip"
    variants = {v: label for v, (_, label) in DEMO_VARIANTS.items()}
    defaults = DEFAULTS

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        return raised_errors(check_config, cfg, where)

    def control(self, cfg: StudyConfig) -> Control:
        return CONTROL

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        out = Path(cfg["out"])
        per_seed = {}
        for seed in cfg["seeds"]:
            folder = out / f"seed{seed}"
            summary = _finished_demo(folder, cfg)
            if summary is None:
                print(f"[study] seed {seed}: diffattn demo -> {folder}", flush=True)
                summary = demo(folder, tuple(cfg["variants"]), steps=cfg["steps"], batch_size=cfg["batch_size"],
                               seed=seed, quick=cfg["quick"], progress=progress, max_pairs=cfg["max_pairs"],
                               curve_points=cfg["curve_points"], device=cfg["device"])["summary"]
            else:
                print(f"[study] seed {seed}: reusing the finished demo in {folder}", flush=True)
            per_seed[seed] = summary
        return per_seed

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        intro = ("CLIP vs DiffCLIP variants (Hammoud & Ghanem 2025, §4) trained from scratch on the offline Tux Paint "
                 "+ emoji pairs with the demo's recipes (demo/*), one budget, several seeds; accuracies and recalls "
                 "in %. The control is the demo's question's (held-out retrieval mean recall), on the mean over "
                 "seeds.\n\n" + study_answer(per_seed))
        extra = ["Per-seed reports: " + ", ".join(f"[seed {s}](seed{s}/report.md)" for s in per_seed)]
        if cfg["curve_points"]:
            extra.insert(0, curve_table(per_seed))
        return write_study(Path(cfg["out"]), cfg, "Study: CLIP vs DiffCLIP", intro, per_seed, _metrics(), seconds,
                           extra, control=self.control(cfg))


def study_answer(per_seed: dict[int, dict]) -> str:
    """The report section that answers :data:`QUESTION` over seeds, at the top of the study's report: for every
    variant but the first, the paired test over seeds of its held-out retrieval mean recall minus the baseline's (in
    points; the pre-registered test, not Holm-adjusted with the table's secondary metrics) and its :func:`verdict`,
    inconclusive when :data:`CONTROL` fails on the baseline's mean over seeds (the control line follows the
    section, as in every study report)."""
    control = check_control(per_seed, CONTROL)
    labels = list(next(iter(per_seed.values())))
    base, n = labels[0], len(per_seed)
    lines = [f"## The question (pre-registered {QUESTION['registered']})", "", QUESTION["text"] + " Metric: "
             + QUESTION["metric"] + f"; paired over the {n} seeds. Control: below.", ""]
    for lab in labels[1:]:
        a, b = ([100 * per_seed[s][v]["primary"]["mean_recall"] for s in per_seed] for v in (lab, base))
        test = paired_test(a, b) if control["passed"] and n >= 2 else None
        word = verdict(test, control["passed"])
        if test:
            lines.append(f"- **{lab} vs {base}: {word}** ({why(word)}). " + _difference_text(
                lab, base, test, f"over {n} seeds; higher on {test['wins']} of {n}"))
        else:
            lines.append(f"- **{lab} vs {base}: {word}** (no test: "
                         + ("the control failed)." if not control["passed"] else "fewer than 2 seeds)."))
    return "\n".join(lines)


def run(cfg: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Every seed of the demo, aggregated. The 0.1.0 entry point, kept as an alias of ``execute`` of
    :class:`DiffCLIPStudy`; removed in 0.3.0."""
    return DiffCLIPStudy().execute(cfg, progress)


#: the metrics measured along training (:func:`curve_point`) and their names in the report
CURVE_METRICS = (("zero_shot_top1", "zero-shot Tux Paint top-1"), ("image_to_text@1", "Tux Paint image→text R@1"),
                 ("text_to_image@1", "Tux Paint text→image R@1"))


def curve_table(per_seed: dict[int, dict]) -> str:
    """The report section of the learning curves: per metric, one row per measured step with every variant's mean ±
    sample std over seeds (in %). Seeds share the steps (same budget)."""
    labels = list(next(iter(per_seed.values())))
    steps = next(iter(per_seed.values()))[labels[0]]["curve"]["steps"]
    lines = ["## Along training", "",
             f"Measured on the Tux Paint test split at steps {steps} (mean ± sample std over {len(per_seed)} seeds, "
             f"in %): how fast each model learns, not only where it ends. No test per step: the paired tests above "
             f"are on the final models."]
    for key, name in CURVE_METRICS:
        lines += ["", f"| {name}: step | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
        for i, step in enumerate(steps):
            cells = []
            for lab in labels:
                m, sd = mean_std([100 * res[lab]["curve"][key][i] for res in per_seed.values()])
                cells.append(f"{m:.1f} ± {sd:.1f}")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
