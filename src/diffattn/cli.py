"""The ``diffattn`` command.

    diffattn demo      # the main job on its embedded data: standard vs differential vs gated ViT on real digits
    diffattn models    # list registered models (optionally a pattern: diffattn models 'diffclip*')

``demo`` trains three vision transformers that differ only in their attention (ViT, DiffViT, DGViT; M-DGSA (2025)
§4.3) with the same budget and seed on scikit-learn's bundled handwritten digits (1,797 real 8×8 scans, UCI
"Optical Recognition of Handwritten Digits"), then reports clean test accuracy and accuracy under additive
Gaussian input noise at several levels (M-DGSA (2025) §5.1's noise-injection protocol), parameters, time and λ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["main", "demo"]

DEMO_MODELS = {"standard": "vit_nano", "diff": "diff_vit_nano", "gated": "dg_vit_nano"}
#: the ``*_nano`` configs at the digits' size: 8×8 grey images, 2×2 patches (16 tokens + CLS), 2 blocks of width 64
DEMO_OVERRIDES = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, depth=2)


def _digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): digits scaled to [0, 1], standardised, stratified 75/25 split."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:  # pragma: no cover - scikit-learn is in the eval/test extras
        raise SystemExit("diffattn demo needs scikit-learn: pip install 'diffattn[eval]'") from e
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.tensor(data.target, dtype=torch.long)
    idx_tr, idx_te = train_test_split(range(len(y)), test_size=0.25, stratify=y.numpy(), random_state=seed)
    x_tr, x_te = x[idx_tr], x[idx_te]
    mean, std = x_tr.mean(), x_tr.std()
    return (x_tr - mean) / std, y[idx_tr], (x_te - mean) / std, y[idx_te]


@torch.no_grad()
def _accuracy(model, x, y, noise: float = 0.0, seed: int = 0) -> float:
    model.eval()
    g = torch.Generator().manual_seed(seed)
    correct = 0
    for i in range(0, len(y), 256):
        xb = x[i:i + 256]
        if noise > 0:
            xb = xb + noise * torch.randn(xb.shape, generator=g)
        correct += (model(xb).argmax(-1) == y[i:i + 256]).sum().item()
    return correct / len(y)


@torch.no_grad()
def _lambda_values(model) -> list[float]:
    """Mean λ per differential layer (for the gate: mean of 1 − g is input dependent, so not reported)."""
    from .layers import DiffAttention, GatedDiffAttention

    out = []
    for m in model.modules():
        if isinstance(m, DiffAttention) and not isinstance(m, GatedDiffAttention):
            lam = m.lambda_weights(torch.zeros(1, 1, m.dim))[1]
            out.append(round(float(torch.as_tensor(lam).mean()), 4))
    return out


def demo(epochs: int = 30, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
         noise_levels: tuple[float, ...] = (0.5, 1.0), out_dir: str | Path | None = "runs/demo",
         attentions: tuple[str, ...] = ("standard", "diff", "gated")) -> list[dict]:
    """Train ViT / DiffViT / DGViT (``*_nano`` with :data:`DEMO_OVERRIDES`) on real digits with one budget and
    one seed; return a row per model. Models and ``results.json`` (written atomically) go to ``out_dir``."""
    from .models import create_model

    x_tr, y_tr, x_te, y_te = _digits(seed)
    rows = []
    for attention in attentions:
        name = DEMO_MODELS[attention]
        torch.manual_seed(seed)
        model = create_model(name, **DEMO_OVERRIDES)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
        steps = epochs * math.ceil(len(y_tr) / batch_size)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
        g = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        for _ in range(epochs):
            model.train()
            perm = torch.randperm(len(y_tr), generator=g)
            for i in range(0, len(perm), batch_size):
                b = perm[i:i + batch_size]
                loss = F.cross_entropy(model(x_tr[b]), y_tr[b], label_smoothing=0.1)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
        seconds = time.perf_counter() - t0
        row = {"attention": attention, "model": name, "params": params, "train_seconds": round(seconds, 1),
               "final_loss": round(loss.item(), 4), "test_acc": _accuracy(model, x_te, y_te)}
        for s in noise_levels:
            row[f"acc_noise_{s}"] = _accuracy(model, x_te, y_te, noise=s, seed=seed)
        row["lambda"] = _lambda_values(model)
        rows.append(row)
        print(f"{name:14s} params {params:7d}  test acc {row['test_acc']:.4f}  "
              + "  ".join(f"σ={s}: {row[f'acc_noise_{s}']:.4f}" for s in noise_levels)
              + f"  ({seconds:.1f} s)", flush=True)
        if out_dir is not None:
            model.save_pretrained(Path(out_dir) / name)
    if out_dir is not None:
        path = Path(out_dir) / "results.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, path)  # atomic
    return rows


def _table(rows: list[dict], noise_levels) -> str:
    head = "| attention | model | params | test acc | " + " | ".join(f"acc σ={s}" for s in noise_levels) + \
        " | train s | λ per layer |"
    sep = "|---|---|---:|---:|" + "---:|" * len(noise_levels) + "---:|---|"
    lines = [head, sep]
    for r in rows:
        lines.append(f"| {r['attention']} | {r['model']} | {r['params']:,} | {r['test_acc']:.4f} | "
                     + " | ".join(f"{r[f'acc_noise_{s}']:.4f}" for s in noise_levels)
                     + f" | {r['train_seconds']} | {r['lambda'] or '—'} |")
    return "\n".join(lines)


#: Modules that add subcommands: each defines ``register(subparsers)``, which adds its parsers and sets
#: ``func`` (called with the parsed args, returns the exit code) through ``set_defaults``. Imported lazily so that
#: ``diffattn models`` does not pay for the training and evaluation imports.
COMMAND_MODULES: tuple[str, ...] = ("diffattn.data.commands", "diffattn.train.commands", "diffattn.eval.commands")


def bounded(kind: type, minimum: float | None = None, *, strict: bool = False):
    """An argparse ``type`` that parses ``kind`` and rejects values below ``minimum`` (or equal, if ``strict``),
    so a bad number is a one-line usage error naming the option instead of a traceback later."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"needs {kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"needs a finite number, got {text!r}")
        if minimum is not None and (value <= minimum if strict else value < minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _demo_command(args: argparse.Namespace) -> int:
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    rows = demo(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                noise_levels=tuple(args.noise), out_dir=args.out, attentions=tuple(args.attention))
    print()
    print(_table(rows, args.noise))
    print(f"\nSaved models and results.json under {args.out}/ (load with diffattn.models.from_pretrained).")
    return 0


def _models_command(args: argparse.Namespace) -> int:
    from .models import list_models

    print("\n".join(list_models(args.pattern)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``diffattn`` argument parser with every subcommand registered."""
    import importlib

    from . import __version__

    p = argparse.ArgumentParser(prog="diffattn", description="Differential attention for PyTorch.")
    p.add_argument("--version", action="version", version=f"diffattn {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="train ViT / DiffViT / DGViT on real digits (embedded data) and compare")
    d.add_argument("--epochs", type=bounded(int, 1), default=30)
    d.add_argument("--batch-size", type=bounded(int, 1), default=32)
    d.add_argument("--lr", type=bounded(float, 0.0, strict=True), default=3e-3)
    d.add_argument("--seed", type=bounded(int, 0), default=0)
    d.add_argument("--noise", type=bounded(float, 0.0), nargs="*", default=[0.5, 1.0],
                   help="Gaussian input-noise levels σ")
    d.add_argument("--out", default="runs/demo", help="folder for the saved models and results.json")
    d.add_argument("--attention", nargs="+", default=["standard", "diff", "gated"], choices=list(DEMO_MODELS))
    d.set_defaults(func=_demo_command)
    m = sub.add_parser("models", help="list registered models")
    m.add_argument("pattern", nargs="?", default="*")
    m.set_defaults(func=_models_command)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
