"""Training throughput (samples/s) of standard vs differential vs gated attention at the same size, side by side.

One optimizer step = forward + backward + AdamW on a random batch, the loss of each family's recipe (CLIP
contrastive, classification cross-entropy, next-token cross-entropy). The models of a family are timed in
interleaved rounds (A, B, C, A, B, C, …) so that a slow-down of the machine hits all of them alike; the median of
the rounds is reported.

    python benchmarks/train.py                       # CPU, every family
    python benchmarks/train.py --device cuda --families vit clip --batch 128
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

#: per family, the standard / differential / gated models at one size (registered names, or one name with the
#: ``attention`` override where the registered variants differ in more than the attention)
FAMILIES = {
    "clip": (("clip_tiny", {}), ("diffclip_tiny", {}), ("dgclip_tiny", {})),
    "vit": (("vit_cifar", {}), ("vit_cifar", {"attention": "diff"}), ("vit_cifar", {"attention": "gated"})),
    "lm": (("lm_small", {}), ("diff_lm_small", {}), ("dg_lm_small", {})),
}
ATTENTION = ("standard", "diff", "gated")


def make_step(family: str, name: str, overrides: dict, batch: int, seq: int, device: torch.device,
              amp: torch.dtype | None):
    """A closure running one optimizer step of model ``name``; returns (step, parameter count)."""
    from diffattn.losses import clip_loss_from_features
    from diffattn.models import create_model

    torch.manual_seed(0)
    model = create_model(name, **overrides).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(0)
    if family == "clip":
        s = model.img_size
        x = torch.randn(batch, 3, s, s, generator=g).to(device)
        tok = torch.randint(1, 1000, (batch, model.context_length), generator=g)
        tok[:, -1] = 49407
        tok = tok.to(device)

        def loss_fn():
            out = model(x, tok)
            return clip_loss_from_features(out["image_embed"].float(), out["text_embed"].float(),
                                           out["logit_scale"].float())
    elif family == "vit":
        s = model.patch_embed.img_size
        x = torch.randn(batch, model.patch_embed.proj.in_channels, s, s, generator=g).to(device)
        y = torch.randint(0, model.num_classes, (batch,), generator=g).to(device)

        def loss_fn():
            return F.cross_entropy(model(x).float(), y)
    else:
        v = model.lm_head.out_features
        ids = torch.randint(0, v, (batch, seq + 1), generator=g).to(device)

        def loss_fn():
            return F.cross_entropy(model(ids[:, :-1]).float().flatten(0, 1), ids[:, 1:].flatten())

    def step():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128, help="LM sequence length")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    amp = torch.bfloat16 if device.type == "cuda" else None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# training throughput, batch {args.batch}, {where}, {'bf16 autocast' if amp else 'fp32'}; median of "
          f"{args.rounds} interleaved rounds of {args.steps} steps\n")
    print("| family | attention | model | params | samples/s | vs standard |")
    print("|---|---|---|---:|---:|---:|")
    for family in args.families:
        steps = {}
        for attention, (name, overrides) in zip(ATTENTION, FAMILIES[family]):
            step, n = make_step(family, name, overrides, args.batch, args.seq, device, amp)
            for _ in range(args.warmup):
                step()
            steps[attention] = (step, n)
        times: dict[str, list[float]] = {a: [] for a in steps}
        for _ in range(args.rounds):
            for a, (step, _) in steps.items():
                sync(device)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step()
                sync(device)
                times[a].append((time.perf_counter() - t0) / args.steps)
        base = args.batch / statistics.median(times["standard"])
        for attention, (name, overrides) in zip(ATTENTION, FAMILIES[family]):
            sps = args.batch / statistics.median(times[attention])
            label = name + "".join(f" {k}={v}" for k, v in overrides.items())
            print(f"| {family} | {attention} | {label} | {steps[attention][1]:,} | {sps:,.1f} | {sps / base:.2f}× |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
