"""YOLO26 detectors with and without differential attention, trained and validated through Ultralytics, offline.

    diffattn study detection      # yolo26n vs yolo26n-diffpsa vs yolo26n-diffattn, seeds 0 1 2

For each model and seed: ``model.train()`` on the generated Tux Paint detection set (:mod:`diffattn.data.detection`)
with the same budget (epochs, image size, batch, images), then ``model.val()`` on its val split for mAP50 and
mAP50-95; parameters and GFLOPs (at 640×640, Ultralytics' convention) come from Ultralytics' own
``get_num_params`` / ``get_flops``. Writes the study's ``results.json`` and ``report.md`` (mean ± std over seeds,
paired tests, and the smallest Δ mAP50 the seeds can detect: :func:`detectable_differences`), ``detection.json``
(the budget and one row per run, with its ``best.pt``: what ``diffattn object-attention --results`` reads) and
``detection.md`` (:func:`summarize`), and
``attention_maps.png``: for one val image, the attention of every attention layer of each first-seed model
(:func:`diffattn.detect.maps.attention_maps`), as the row of the query at the centre of the first labelled object,
averaged over heads and drawn over the image, each panel scaled to its own range (printed in its title).
Every setting in :data:`diffattn.detect.OFFLINE_TRAIN_ARGS` applies (:func:`diffattn.detect.offline_env` runs
before Ultralytics is imported). Needs the extra ``diffattn[detect]``.

Control (:data:`CONTROL`, stated before any comparison): the baseline's mean mAP50 on the val split must reach
10 % (an untrained detector scores 0); below that the detectors are not compared.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..data.detection import export_detection
from ..detect.offline import OFFLINE_TRAIN_ARGS, OFFLINE_VAL_ARGS, disable_sync, offline_env
from ..extras import MissingExtraError
from ..io import atomic_write_file
from . import claims
from .base import Study, StudyConfig
from .common import minimum_errors
from .report import Control, Metric, run_seeds
from .stats import mean_std, min_detectable_difference

__all__ = ["DetectionStudy", "VARIANTS", "DEFAULTS", "CONTROL", "require_ultralytics", "train_one", "summarize",
           "detectable_differences", "plot_maps", "run_compare"]

#: variant → (what :func:`diffattn.detect.yolo` builds, label)
VARIANTS: dict[str, tuple[str, str]] = {
    "yolo26n": ("yolo26n.yaml", "yolo26n"),
    "yolo26n_diffpsa": ("yolo26n-diffpsa", "yolo26n-diffpsa"),
    "yolo26n_diffattn": ("yolo26n-diffattn", "yolo26n-diffattn"),
    "yolo26s": ("yolo26s.yaml", "yolo26s"),
    "yolo26s_diffpsa": ("yolo26s-diffpsa", "yolo26s-diffpsa"),
    "yolo26s_diffattn": ("yolo26s-diffattn", "yolo26s-diffattn"),
}
DEFAULT_VARIANTS = ["yolo26n", "yolo26n_diffpsa", "yolo26n_diffattn"]
#: the positive control: the baseline's val mAP50 at least 10 % (an untrained detector scores 0)
CONTROL = Control("baseline mAP50 on the val split (%; untrained: 0)", "mAP50", 10.0, scale=100.0)
#: the budget (diffattn/configs/studies/detection.yaml); ``data``: an existing data.yaml (null: generated in out)
DEFAULTS: dict[str, Any] = {
    "epochs": 3, "imgsz": 128, "batch": 16, "n_train": 128, "n_val": 48, "threads": 1, "optimizer": "auto",
    "lr0": None, "data": None,
}
DEFAULT_MODELS = tuple(VARIANTS[v][0] for v in DEFAULT_VARIANTS)


def require_ultralytics(what: str) -> None:
    """Raise :class:`~diffattn.extras.MissingExtraError` naming ``what`` when Ultralytics (the ``detect`` extra,
    AGPL-3.0, never installed with the others) is absent; checked without importing it."""
    import importlib.util

    if importlib.util.find_spec("ultralytics") is None:
        raise MissingExtraError(f"{what} needs ultralytics (AGPL-3.0): pip install 'diffattn[detect]'")


def _info(model, imgsz: int = 640) -> dict:
    from ultralytics.utils.torch_utils import get_flops, get_num_params

    return {"params": int(get_num_params(model.model)), "gflops_640": round(float(get_flops(model.model, imgsz)), 3)}


def train_one(name: str, seed: int, data: Path, out: Path, *, epochs: int, imgsz: int, batch: int,
              threads: int = 1, optimizer: str = "auto", lr0: float | None = None) -> dict:
    """Train ``name`` with ``seed`` and validate it; returns mAP50, mAP50-95, params, GFLOPs, seconds.
    ``optimizer`` and ``lr0`` are Ultralytics' (``auto`` picks both from the iteration count; ``lr0`` applies
    to a named optimizer)."""
    offline_env()
    from ..detect import yolo

    torch.set_num_threads(threads)
    model = yolo(name)
    info = _info(model)
    t0 = time.time()
    model.train(data=str(data), epochs=epochs, imgsz=imgsz, batch=batch, seed=seed,
                project=str((out / "runs").resolve()),  # absolute: Ultralytics puts a relative one under its runs_dir
                name=f"{name.removesuffix('.yaml')}-s{seed}", warmup_epochs=1, val=False, optimizer=optimizer,
                **({} if lr0 is None else {"lr0": lr0}), **OFFLINE_TRAIN_ARGS)
    train_s = time.time() - t0
    metrics = model.val(data=str(data), imgsz=imgsz, batch=batch, **OFFLINE_VAL_ARGS)
    return {"model": name, "seed": seed, "mAP50": float(metrics.box.map50), "mAP50-95": float(metrics.box.map),
            **info, "train_s": round(train_s, 1), "weights": str(Path(model.trainer.best))}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(rows: list[dict]) -> str:
    """The Markdown table of ``rows``: mAP50 and mAP50-95 as mean ± std over seeds, the paired difference in mAP50
    from the first model (same seed, mean ± std of the per-seed differences, and on how many seeds it is higher),
    params, GFLOPs, time."""
    names = list(dict.fromkeys(r["model"] for r in rows))
    base = {r["seed"]: 100 * r["mAP50"] for r in rows if r["model"] == names[0]}
    lines = [f"| model | mAP50 | mAP50-95 | Δ mAP50 vs {names[0].removesuffix('.yaml')} (paired) | params | "
             "GFLOPs (640) | train s / run | seeds |", "|---|---|---|---|---|---|---|---|"]
    for name in names:
        rs = [r for r in rows if r["model"] == name]
        m50, s50 = _mean_std([100 * r["mAP50"] for r in rs])
        m, s = _mean_std([100 * r["mAP50-95"] for r in rs])
        secs = statistics.fmean(r["train_s"] for r in rs)
        diffs = [100 * r["mAP50"] - base[r["seed"]] for r in rs if r["seed"] in base]
        if name == names[0] or not diffs:
            delta = "–"
        else:
            dm, ds = _mean_std(diffs)
            delta = f"{dm:+.1f} ± {ds:.1f} (higher on {sum(d > 0 for d in diffs)} of {len(diffs)})"
        lines.append(f"| {name.removesuffix('.yaml')} | {m50:.1f} ± {s50:.1f} | {m:.1f} ± {s:.1f} | {delta} | "
                     f"{rs[0]['params']:,} | {rs[0]['gflops_640']:.1f} | {secs:.0f} | {len(rs)} |")
    return "\n".join(lines) + "\n"


def plot_maps(rows: list[dict], data: Path, out_png: Path, imgsz: int) -> list[dict]:
    """Draw the attention of every attention layer of each model's first seed over the first val image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image
    from ultralytics import YOLO

    from ..detect.maps import attention_maps

    image_path = sorted((data.parent / "images" / "val").glob("*.png"))[0]
    label = (data.parent / "labels" / "val" / (image_path.stem + ".txt")).read_text().split("\n")[0].split()
    cx, cy = float(label[1]), float(label[2])
    img = np.asarray(Image.open(image_path).convert("RGB").resize((imgsz, imgsz)))
    x = torch.from_numpy(img.copy()).permute(2, 0, 1)[None].float() / 255.0
    firsts = {}
    for r in rows:
        firsts.setdefault(r["model"], r)
    panels, summary = [], []
    for name, r in firsts.items():
        model = YOLO(r["weights"]).model.float().eval()
        for layer, maps, (h, w) in attention_maps(model, x):
            q = min(int(cy * h), h - 1) * w + min(int(cx * w), w - 1)  # the query token at the object centre
            row = maps[0, :, q].mean(0).reshape(h, w).numpy()
            panels.append((f"{name.removesuffix('.yaml')}\n{layer}", row))
            summary.append({"model": name, "layer": layer, "grid": [h, w], "query": q,
                            "min": float(row.min()), "max": float(row.max())})
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(2.6 * (len(panels) + 1), 3))
    axes[0].imshow(img)
    axes[0].plot([cx * imgsz], [cy * imgsz], "r+", ms=12)
    axes[0].set_title(image_path.name, fontsize=7)
    for ax, (title, row) in zip(axes[1:], panels):  # each panel on its own range (printed): maps can be near-flat
        ax.imshow(img, alpha=0.45)
        ax.imshow(row, cmap="viridis", vmin=float(row.min()), vmax=float(row.max()) + 1e-12, alpha=0.75,
                  extent=(0, imgsz, imgsz, 0), interpolation="nearest")
        ax.set_title(f"{title}\n[{row.min():.3g}, {row.max():.3g}]", fontsize=6)
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    with atomic_write_file(out_png) as f:
        fig.savefig(f, dpi=120, format="png")
    plt.close(fig)
    return summary


def run_compare(models: list[str], seeds: list[int], out: Path, *, data: Path | None = None, epochs: int = 3,
                imgsz: int = 128, batch: int = 16, n_train: int = 128, n_val: int = 48, threads: int = 1,
                optimizer: str = "auto", lr0: float | None = None) -> dict:
    """Train every model with every seed on the same data and budget; write ``detection.json``, ``detection.md``
    and the map figure into ``out``."""
    offline_env()
    disable_sync()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if data is None:
        data_dir = out / "data"
        if not (data_dir / "data.yaml").is_file():
            export_detection(data_dir, n_train=n_train, n_val=n_val, imgsz=imgsz, scale=(0.25, 0.6), max_objects=2)
        data = data_dir / "data.yaml"
    budget = {"epochs": epochs, "imgsz": imgsz, "batch": batch, "data": str(data), "optimizer": optimizer,
              "lr0": lr0}
    rows = []
    for seed in seeds:
        for name in models:
            rows.append(train_one(name, seed, Path(data), out, epochs=epochs, imgsz=imgsz, batch=batch,
                                  threads=threads, optimizer=optimizer, lr0=lr0))
            print(json.dumps(rows[-1]), flush=True)
            _write(out, rows, budget)
    maps = plot_maps(rows, Path(data), out / "attention_maps.png", imgsz)
    return _write(out, rows, budget, maps)


def _write(out: Path, rows: list[dict], budget: dict, maps: list[dict] | None = None) -> dict:
    result = {"budget": budget, "runs": rows, "attention_maps": maps, "torch_threads": torch.get_num_threads()}
    with atomic_write_file(out / "detection.json", "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    with atomic_write_file(out / "detection.md", "w") as f:
        f.write(summarize(rows))
    return result


def detectable_differences(per_seed: dict[int, dict], *, alpha: float = 0.05, power: float = 0.8) -> str:
    """The report section on the smallest Δ mAP50 the seeds can detect: per variant, the sample std of its per-seed
    mAP50 differences from the baseline (in points) and :func:`diffattn.studies.stats.min_detectable_difference`
    of it (two-sided ``alpha``, ``power``), next to the measured mean difference."""
    labels = list(next(iter(per_seed.values())))
    n = len(per_seed)
    lines = ["## Smallest detectable Δ mAP50", "",
             f"With {n} seeds and the measured seed-to-seed spread of the paired differences, a two-sided paired "
             f"test at α = {alpha:g} detects a true mean Δ mAP50 of at least this size with probability "
             f"{power:.0%} (normal approximation, (z_(1−α/2) + z_power) · sd / √n): smaller true differences are "
             f"likely to be missed.", "", f"| variant | mean Δ mAP50 vs {labels[0]} | sd of the per-seed Δ | "
             f"smallest detectable Δ |", "|---|---:|---:|---:|"]
    for lab in labels[1:]:
        diffs = [100 * (res[lab]["mAP50"] - res[labels[0]]["mAP50"]) for res in per_seed.values()]
        m, sd = mean_std(diffs)
        mdd = min_detectable_difference(sd, n, alpha=alpha, power=power) if n >= 2 else float("nan")
        lines.append(f"| {lab} | {m:+.1f} | {sd:.1f} | {mdd:.1f} |")
    return "\n".join(lines)


def _data_yaml(cfg: dict[str, Any], out: Path) -> Path:
    if cfg["data"] is not None:
        if not Path(cfg["data"]).is_file():
            raise FileNotFoundError(f"data in the detection study: {cfg['data']} is not a data.yaml file")
        return Path(cfg["data"])
    data_dir = out / "data"
    if not (data_dir / "data.yaml").is_file():
        export_detection(data_dir, n_train=cfg["n_train"], n_val=cfg["n_val"], imgsz=cfg["imgsz"],
                         scale=(0.25, 0.6), max_objects=2)
    return data_dir / "data.yaml"


class DetectionStudy(Study, name="detection", title="Study: YOLO26 with and without differential attention",
                     variants=VARIANTS, default_variants=DEFAULT_VARIANTS, defaults=DEFAULTS, control=CONTROL):
    """The detection study (module docstring)."""

    def check(self, cfg: StudyConfig, where: str) -> list[str]:
        errors = minimum_errors(cfg, ("epochs", "imgsz", "batch", "n_train", "n_val", "threads"), where)
        if cfg["lr0"] is not None and not (isinstance(cfg["lr0"], (int, float)) and cfg["lr0"] > 0):
            errors.append(f"lr0 in {where} must be null or a number > 0, got {cfg['lr0']!r}")
        if cfg["data"] is not None and not isinstance(cfg["data"], str):
            errors.append(f"data in {where} must be null or the path of a data.yaml, got {cfg['data']!r}")
        return errors

    def run(self, cfg: StudyConfig, progress: bool = True) -> dict[int, dict]:
        """Every seed (``<out>/seed<k>/``), aggregated (module docstring)."""
        require_ultralytics("diffattn study detection")
        offline_env()
        disable_sync()
        out = Path(cfg["out"])
        out.mkdir(parents=True, exist_ok=True)
        data = _data_yaml(cfg, out)

        def one_seed(seed: int, folder: Path) -> dict:
            results = {}
            for v in cfg["variants"]:
                name, label = VARIANTS[v]
                r = train_one(name, seed, data, out, epochs=cfg["epochs"], imgsz=cfg["imgsz"], batch=cfg["batch"],
                              threads=cfg["threads"], optimizer=cfg["optimizer"], lr0=cfg["lr0"])
                print(json.dumps(r), flush=True)
                results[label] = r
            return results

        return run_seeds(cfg, one_seed)

    def report(self, cfg: StudyConfig, per_seed: dict[int, dict], seconds: float) -> dict[str, Any]:
        out = Path(cfg["out"])
        data = _data_yaml(cfg, out)
        budget = {"epochs": cfg["epochs"], "imgsz": cfg["imgsz"], "batch": cfg["batch"], "data": str(data),
                  "optimizer": cfg["optimizer"], "lr0": cfg["lr0"]}
        rows = [r for seed in cfg["seeds"] for r in per_seed[seed].values()]
        maps = plot_maps(rows, data, out / "attention_maps.png", cfg["imgsz"])
        _write(out, rows, budget, maps)
        metrics = [Metric("mAP50 (%)", "mAP50", 100.0, 1, claim=claims.DETECTION_MAP),
                   Metric("mAP50-95 (%)", "mAP50-95", 100.0, 1),
                   Metric("parameters", "params", 1.0, 0, None), Metric("GFLOPs at 640", "gflops_640", 1.0, 2, None),
                   Metric("train seconds per run", "train_s", 1.0, 0, None)]
        intro = (f"YOLO26 detectors ({', '.join(VARIANTS[v][1] for v in cfg['variants'])}) trained {cfg['epochs']} "
                 f"epochs at {cfg['imgsz']}² (batch {cfg['batch']}, Ultralytics' optimizer {cfg['optimizer']}) on the "
                 f"generated Tux Paint detection set ({data}), validated on its val split; every run offline "
                 f"(diffattn.detect.OFFLINE_TRAIN_ARGS). Per-run rows: detection.json; attention maps: "
                 f"attention_maps.png.")
        return self.write_report(cfg, intro, per_seed, metrics, seconds,
                                 [detectable_differences(per_seed), "## Per model\n\n" + summarize(rows)])

