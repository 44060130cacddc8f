"""Training throughput (samples/s) of standard vs differential vs gated attention at the same size, side by side.

One optimizer step = forward + backward + AdamW on a random batch, the loss of each family's recipe (CLIP
contrastive, classification cross-entropy, next-token cross-entropy). The models of a family are timed in
interleaved rounds (A, B, C, A, B, C, …) so that a slow-down of the machine hits all of them alike; the median of
the rounds is reported.

On CUDA the step runs under bf16 autocast and the differential layers take the fused Triton kernel
(``backend="auto"``); the table also gives the peak memory of one step (activations, gradients and AdamW state
above what was allocated before it) and the parameter and optimizer memory.

    python benchmarks/train.py                       # CPU, the small families
    python benchmarks/train.py --device cuda --families vit_b16 clip_b16 --batch 64 --json train.json
    python benchmarks/train.py --render train.json --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

#: per family, the standard / differential / gated models at one size (registered names, or one name with the
#: ``attention`` override where the registered variants differ in more than the attention)
FAMILIES = {
    "clip": (("clip_tiny", {}), ("diffclip_tiny", {}), ("dgclip_tiny", {})),
    "vit": (("vit_cifar", {}), ("vit_cifar", {"attention": "diff"}), ("vit_cifar", {"attention": "gated"})),
    "lm": (("lm_small", {}), ("diff_lm_small", {}), ("dg_lm_small", {})),
    # ImageNet sizes: timm's ViT-B/16 layout; DGViT-B/16 also has the M-DGSA SwiGLU MLP and the query residual
    "vit_b16": (("vit_base_patch16_224", {}), ("diff_vit_base_patch16_224", {}), ("dg_vit_base_patch16_224", {})),
    "clip_b16": (("clip_vit_b16", {}), ("diffclip_vit_b16", {}), ("dgclip_vit_b16", {})),
}
KIND = {"vit_b16": "vit", "clip_b16": "clip"}
ATTENTION = ("standard", "diff", "gated")


def make_step(family: str, name: str, overrides: dict, batch: int, seq: int, device: torch.device,
              amp: torch.dtype | None, wrap=None):
    """A closure running one optimizer step of model ``name``; returns (step, parameter count). ``wrap`` (e.g.
    ``torch.compile``) is applied to the model for the forward; the optimizer holds the model's own parameters."""
    from diffattn.losses import clip_loss_from_features
    from diffattn.models import create_model

    torch.manual_seed(0)
    model = create_model(name, **overrides).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = wrap(model) if wrap is not None else model
    g = torch.Generator(device="cpu").manual_seed(0)
    family = KIND.get(family, family)
    if family == "clip":
        s = model.img_size
        x = torch.randn(batch, 3, s, s, generator=g).to(device)
        tok = torch.randint(1, 1000, (batch, model.context_length), generator=g)
        tok[:, -1] = 49407
        tok = tok.to(device)

        def loss_fn():
            out = fwd(x, tok)
            return clip_loss_from_features(out["image_embed"].float(), out["text_embed"].float(),
                                           out["logit_scale"].float())
    elif family == "vit":
        s = model.patch_embed.img_size
        x = torch.randn(batch, model.patch_embed.proj.in_channels, s, s, generator=g).to(device)
        y = torch.randint(0, model.num_classes, (batch,), generator=g).to(device)

        def loss_fn():
            return F.cross_entropy(fwd(x).float(), y)
    else:
        v = model.lm_head.out_features
        ids = torch.randint(0, v, (batch, seq + 1), generator=g).to(device)

        def loss_fn():
            return F.cross_entropy(fwd(ids[:, :-1]).float().flatten(0, 1), ids[:, 1:].flatten())

    def step():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def step_peak_mib(step, device: torch.device) -> float | None:
    """Peak CUDA memory of one step above what was allocated before it (activations, gradients, temporaries)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def profile(step, device: torch.device, label: str, steps: int = 2) -> None:
    """Print where ``steps`` steps spend their time: the host's and the device's totals and the top operators
    (torch.profiler), to tell a launch- or Python-bound step from a kernel-bound one."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with torch_profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall = (time.perf_counter() - t0) / steps * 1e3
    events = prof.key_averages()
    print(f"\n### profile {label}: {steps} steps, {wall:.1f} ms per step under the profiler (the table's totals "
          f"are over all {steps} steps)")
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=15, max_name_column_width=60))


def markdown(result: dict) -> str:
    """The table of a result (``--json``), with its device and command."""
    lines = [f"### Training throughput, {result['where']}", "",
             f"Device: {result['where']}, torch {result['torch']}, {result['precision']}; batch {result['batch']}; "
             f"median of {result['rounds']} interleaved rounds of {result['steps']} steps after {result['warmup']} "
             f"untimed steps. Step memory: peak allocated during one step above what was allocated before it "
             f"(activations, gradients, temporaries); state: parameters and AdamW moments.", "",
             "Command:", "", "```", result["command"], "```", "",
             "| family | attention | model | params | samples/s | × standard | step peak MiB | state MiB |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        peak = f"{r['step_peak_mib']:,.0f}" if r.get("step_peak_mib") is not None else ""
        lines.append(f"| {r['family']} | {r['attention']} | {r['model']} | {r['params']:,} | {r['samples_s']:,.1f} | "
                     f"{r['vs_standard']:.2f} | {peak} | {r['state_mib']:,.0f} |")
    others = [r for r in result["rows"] if r["attention"] != "standard"]
    if others:
        met = [r for r in others if r["vs_standard"] >= 0.93]
        lines += ["", f"Goal: ≥ 0.93× the standard model's samples/s at the same batch: "
                      f"**{'met' if len(met) == len(others) else 'not met'}** ({len(met)} of {len(others)} models; "
                      + ", ".join(f"{r['model']} {r['vs_standard']:.2f}×" for r in others) + ")."]
    return "\n".join(lines)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=["clip", "vit", "lm"], choices=list(FAMILIES))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128, help="LM sequence length")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--profile", action="store_true", help="also print a torch.profiler summary of two steps each")
    p.add_argument("--render", type=Path, help="do not measure: print (and with --markdown write) this result")
    p.add_argument("--markdown", type=Path, help="write the table into this file's train-<device> section")
    args = p.parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        text = markdown(result)
        if args.markdown:
            from diffattn.utils import write_markdown_section

            write_markdown_section(args.markdown, f"train-{result['device_type']}", text)
        print(text)
        return 0
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    amp = torch.bfloat16 if device.type == "cuda" else None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    result = dict(where=where, device_type=device.type, torch=torch.__version__,
                  precision="bf16 autocast" if amp else "fp32", batch=args.batch, rounds=args.rounds,
                  steps=args.steps, warmup=args.warmup, rows=[],
                  command="python benchmarks/train.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"# training throughput, batch {args.batch}, {where}, {result['precision']}; median of "
          f"{args.rounds} interleaved rounds of {args.steps} steps\n")
    print("| family | attention | model | params | samples/s | vs standard | step peak MiB | state MiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for family in args.families:
        steps = {}
        for attention, (name, overrides) in zip(ATTENTION, FAMILIES[family]):
            step, n = make_step(family, name, overrides, args.batch, args.seq, device, amp)
            for _ in range(args.warmup):
                step()
            steps[attention] = (step, n, step_peak_mib(step, device))
        times: dict[str, list[float]] = {a: [] for a in steps}
        for _ in range(args.rounds):
            for a, (step, _, _) in steps.items():
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
            _, n, peak = steps[attention]
            row = dict(family=family, attention=attention, model=label, params=n, samples_s=sps,
                       vs_standard=sps / base, step_peak_mib=peak, state_mib=3 * 4 * n / 2**20,
                       step_ms=[1e3 * t for t in times[attention]])
            result["rows"].append(row)
            peak_s = f"{peak:,.0f}" if peak is not None else ""
            print(f"| {family} | {attention} | {label} | {n:,} | {sps:,.1f} | {sps / base:.2f}× | {peak_s} | "
                  f"{row['state_mib']:,.0f} |", flush=True)
        if args.profile:
            for attention, (step, _, _) in steps.items():
                try:
                    profile(step, device, f"{family} {attention}")
                except Exception as e:  # noqa: BLE001 - the profile is a diagnostic, never fatal
                    print(f"profile {family} {attention} failed: {type(e).__name__}: {e}")
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
