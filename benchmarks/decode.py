"""Decoding and prefill speed of standard, differential (V1, V2) and gated causal LMs of equal size, and of a
retrofitted Hugging Face Llama against its base, on one CPU thread.

- LMs: ``lm_small`` (standard), ``diff_lm_small`` (Ye et al. 2024), ``diff_v2_lm_small`` (Diff Transformer V2,
  Ye et al. 2026) and ``dg_lm_small`` (M-DGSA 2025), random weights, float32, with the static KV cache
  (``CausalLM.new_kv_caches(max_length=...)``, what ``generate`` uses).
- Hugging Face: a ``LlamaForCausalLM`` of the same shape (random weights, SDPA attention, decoding with
  transformers' ``StaticCache``) and the same model retrofitted with DAA (``diffattn.retrofit(model, "daa")``).

Per prefix P and batch B: the prompt is prefilled at batch 1 (the prefill table times it, for P ≤ ``--max-prefill``;
a longer prefix tiles the longest prompt's keys and values, since decode time does not depend on their values), the
cache is repeated to batch B, then greedy decoding of T tokens is timed per token; rounds interleave the models and
the median over rounds is reported, with each row's ratio to the standard LM (or to the base Llama) of the same
run. ``diff[dynamic]`` is the differential LM with the growing ``KVCache``. "growth" is the mean time of the last
quarter of the T steps over the first quarter: about 1.00 when a step does not get slower with the number of
generated tokens beyond what attending over one more key costs.

    python benchmarks/decode.py --markdown docs/benchmarks.md
    python benchmarks/decode.py --quick          # prefixes 256 and 2048, batch 1, to check the ratios
    python benchmarks/decode.py --flex ...       # also the prefill attention core with compiled FlexAttention
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import os
import statistics
import time
from pathlib import Path

import torch

import diffattn
from diffattn.layers import KVCache, StaticKVCache
from diffattn.utils import cpu_name, write_markdown_section

LMS = {"standard": "lm_small", "diff": "diff_lm_small", "diff_v2": "diff_v2_lm_small", "gated": "dg_lm_small"}


def build_lms(**overrides) -> dict[str, torch.nn.Module]:
    """The LMs of :data:`LMS` (``overrides``: of their configs, e.g. a dry run's ``dim=64, depth=2``)."""
    out = {}
    for label, name in LMS.items():
        torch.manual_seed(0)
        out[label] = diffattn.create_model(name, **overrides).eval()
    return out


def build_llamas(dim: int = 512, depth: int = 8) -> dict[str, torch.nn.Module] | None:
    """A Llama of lm_small's shape (``dim``, ``depth``) and its DAA retrofit (same weights), or None without
    transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    from diffattn.models.causal_lm import llama_mlp_hidden

    cfg = LlamaConfig(vocab_size=32000, hidden_size=dim, intermediate_size=llama_mlp_hidden(dim),
                      num_hidden_layers=depth, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=16384, attn_implementation="sdpa")
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    retro = diffattn.retrofit(copy.deepcopy(base), "daa").eval()
    return {"llama": base, "llama+daa": retro}


def nparams(m: torch.nn.Module) -> float:
    return sum(p.numel() for p in m.parameters()) / 1e6


# ------------------------------------------------------------------------------------------------ caches


def prefill(label: str, model, ids: torch.Tensor, max_length: int):
    """Run the prompt; return (seconds, cache, next token)."""
    t0 = time.perf_counter()
    if label.startswith("llama"):
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits
    else:
        cache = model.new_kv_caches(max_length=max_length)
        logits = model(ids, kv_caches=cache)
    dt = time.perf_counter() - t0
    return dt, cache, logits[:, -1].argmax(-1, keepdim=True)


def _layers(label: str, cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a prompt cache, each (1, heads, S, width)."""
    if label.startswith("llama"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(c.k[:, :, :c.length], c.v[:, :, :c.length]) for c in cache]


def _fill(t: torch.Tensor, prefix: int, batch: int) -> torch.Tensor:
    """(1, h, S, w) → (batch, h, prefix, w): tiled along the sequence when S < prefix, repeated over the batch."""
    if t.shape[2] < prefix:
        t = t.repeat(1, 1, -(-prefix // t.shape[2]), 1)
    return t[:, :, :prefix].repeat(batch, 1, 1, 1)


def filled_cache(label: str, model, src, batch: int, prefix: int, max_length: int):
    """A fresh cache of ``batch`` rows holding ``prefix`` positions from the prompt cache ``src`` (its keys and
    values tiled when the prompt is shorter: decode time does not depend on the values)."""
    if label.startswith("llama"):
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=max_length)
        for i, (k, v) in enumerate(_layers(label, src)):
            cache.update(_fill(k, prefix, batch), _fill(v, prefix, batch), i)
        return cache
    out = []
    for k, v in _layers(label, src):
        c = KVCache() if label.endswith("[dynamic]") else StaticKVCache(max_length)
        c.update(_fill(k, prefix, batch), _fill(v, prefix, batch))
        out.append(c)
    return out


def decode(label: str, model, cache, tok: torch.Tensor, steps: int) -> list[float]:
    """Greedy decoding of ``steps`` tokens; seconds per step."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if label.startswith("llama"):
            logits = model(input_ids=tok, cache=cache, use_cache=True).logits
        else:
            logits = model(tok, kv_caches=cache)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    return times


def growth(times: list[float]) -> float:
    q = max(1, len(times) // 4)
    return statistics.mean(times[-q:]) / statistics.mean(times[:q])


# ------------------------------------------------------------------------------------------------- run


def run(args) -> tuple[list[dict], list[dict]]:
    models = build_lms()
    models["diff[dynamic]"] = models["diff"]  # the same model with the growing KVCache, for the growth column
    if not args.no_hf:
        llamas = build_llamas()
        if llamas:
            models.update(llamas)
    sizes = {k: nparams(m) for k, m in models.items()}
    prompt_models = {k: m for k, m in models.items() if "[" not in k}
    prefill_rows, decode_rows = [], []
    longest = max(args.tokens, args.long_tokens)
    prompts = sorted(p for p in args.prefixes if p <= args.max_prefill) or [min(args.prefixes)]
    caches: dict[int, dict] = {}
    firsts: dict[int, dict] = {}
    for prefix in prompts:
        ids = torch.randint(0, 32000, (1, prefix), generator=torch.Generator().manual_seed(prefix))
        pf: dict[str, list[float]] = {k: [] for k in prompt_models}
        caches[prefix], firsts[prefix] = {}, {}
        with torch.no_grad():
            for _ in range(args.rounds):
                for label, m in prompt_models.items():
                    caches[prefix].pop(label, None)
                    gc.collect()
                    dt, caches[prefix][label], firsts[prefix][label] = prefill(label, m, ids, prefix + longest)
                    pf[label].append(dt)
        for label in prompt_models:
            prefill_rows.append(dict(prefix=prefix, model=label, params=sizes[label],
                                     ms=1e3 * statistics.median(pf[label])))
        print_rows(prefill_rows[-len(prompt_models):], "prefill")
    for prefix in args.prefixes:
        src = max(p for p in prompts if p <= prefix) if min(prompts) <= prefix else min(prompts)
        for batch in args.batches:
            steps = args.tokens if prefix * batch <= 4096 else args.long_tokens
            cell = {k: m for k, m in models.items() if batch == 1 or not k.endswith("[dynamic]")}  # run time
            per: dict[str, list[float]] = {k: [] for k in cell}
            gr: dict[str, list[float]] = {k: [] for k in cell}
            with torch.no_grad():
                for _ in range(args.rounds):
                    for label, m in cell.items():
                        base = label.split("[")[0]
                        c = filled_cache(label, m, caches[src][base], batch, prefix, prefix + steps)
                        gc.collect()
                        times = decode(label, m, c, firsts[src][base].repeat(batch, 1), steps)
                        del c
                        per[label].append(statistics.mean(times))
                        gr[label].append(growth(times))
            for label in cell:
                ms = 1e3 * statistics.median(per[label])
                decode_rows.append(dict(prefix=prefix, batch=batch, model=label, params=sizes[label], steps=steps,
                                        ms=ms, tok_s=batch * 1e3 / ms, growth=statistics.median(gr[label]),
                                        tiled=src < prefix))
            print_rows(decode_rows[-len(cell):], "decode")
    return prefill_rows, decode_rows


def flex_rows(args) -> list[dict]:
    """Prefill attention core of one layer of the LMs (causal, B = 1): standard SDPA (8 heads of width 64), the
    differential operator's zero-padded ``sdpa`` path and :func:`diffattn.ops.unpadded.flex_diff_attention` (compiled
    FlexAttention, no padding; its compilation is timed apart)."""
    import torch.nn.functional as F

    from diffattn.ops import diff_attention
    from diffattn.ops.unpadded import flex_diff_attention

    rows = []
    for n in sorted(p for p in args.prefixes if p <= args.max_prefill):
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
        qd, kd = torch.randn(1, 8, n, 64, generator=g), torch.randn(1, 8, n, 64, generator=g)
        vd = torch.randn(1, 4, n, 128, generator=g)
        args_d = (qd[:, 0::2], kd[:, 0::2], qd[:, 1::2], kd[:, 1::2], vd, 0.5)
        fns = {"standard": functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
               "diff[sdpa, padded]": functools.partial(diff_attention, *args_d, is_causal=True, backend="sdpa",
                                                       scale=0.125),
               "diff[flex]": functools.partial(flex_diff_attention, *args_d, is_causal=True, scale=0.125)}
        with torch.no_grad():
            t0 = time.perf_counter()
            fns["diff[flex]"]()
            compile_s = time.perf_counter() - t0
            times: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, f in fns.items():
                    t0 = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t0)
        for name in fns:
            rows.append(dict(prefix=n, model=name, ms=1e3 * statistics.median(times[name]),
                             compile_s=compile_s if name == "diff[flex]" else None))
        print("\n".join(f"core P={r['prefix']} {r['model']:20s} {r['ms']:9.1f} ms" for r in rows[-3:]), flush=True)
    return rows


def _ratio(rows: list[dict], r: dict, keys: tuple[str, ...]) -> float:
    base = "llama" if r["model"].startswith("llama") else "standard"
    ref = next(x for x in rows if x["model"] == base and all(x[k] == r[k] for k in keys))
    return r["ms"] / ref["ms"]


def print_rows(rows: list[dict], what: str) -> None:
    for r in rows:
        extra = f" B={r['batch']} {r['tok_s']:.1f} tok/s growth {r['growth']:.2f}" if what == "decode" else ""
        print(f"{what} P={r['prefix']} {r['model']:10s} {r['ms']:9.1f} ms{extra}", flush=True)


def machine() -> str:
    return (f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread "
            f"(torch {torch.__version__})")


def markdown(prefill_rows: list[dict], decode_rows: list[dict], args, command: str,
             core_rows: list[dict] | None = None) -> str:
    tiled = sorted({r["prefix"] for r in decode_rows if r["tiled"]})
    lines = ["## Decoding and prefill, cpu", "",
             f"Machine: {machine()}. float32, random weights; LMs of {prefill_rows[0]['params']:.1f} M parameters "
             f"(standard). Median of {args.rounds} interleaved rounds; {args.tokens} greedy tokens per decode cell "
             f"({args.long_tokens} where prefix × batch > 4096, to keep the run short). The LMs decode with the "
             f"static KV cache (what `generate` uses), `diff[dynamic]` is the differential LM with the growing "
             f"`KVCache` (batch 1 only); the Hugging Face rows decode with transformers' `StaticCache` (the prompt "
             f"is prefilled with its `DynamicCache`). Ratios: to `standard` (LMs) or to the base `llama` (its DAA "
             f"retrofit), same run."
             + (f" Prefix {', '.join(map(str, tiled))} is not prefilled (minutes per model on one thread): its "
                f"cache holds the longest prefilled prompt's keys and values tiled to the prefix length, which "
                f"changes no decode time." if tiled else ""),
             "", "Command:", "", "```", command, "```", "",
             "Decode, per token (growth: mean time of the last quarter of the steps over the first quarter):", "",
             "| prefix | batch | model | params M | ms/token | tokens/s | × standard | growth |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in decode_rows:
        lines.append(f"| {r['prefix']} | {r['batch']} | {r['model']} | {r['params']:.1f} | {r['ms']:.1f} | "
                     f"{r['tok_s']:.1f} | {_ratio(decode_rows, r, ('prefix', 'batch')):.2f} | {r['growth']:.2f} |")
    lines += ["", "Prefill of the prompt (batch 1):", "",
              "| prefix | model | ms | × standard |", "|---:|---|---:|---:|"]
    for r in prefill_rows:
        lines.append(f"| {r['prefix']} | {r['model']} | {r['ms']:.1f} | {_ratio(prefill_rows, r, ('prefix',)):.2f} |")
    if core_rows:
        lines += ["", "Prefill attention core of one layer (causal, B = 1; `diff[flex]`: compiled FlexAttention per "
                  "branch, no padding, compiled once per shape before timing):", "",
                  "| prefix | core | ms | × standard | compile s |", "|---:|---|---:|---:|---:|"]
        for r in core_rows:
            c = "" if r["compile_s"] is None else f"{r['compile_s']:.0f}"
            lines.append(f"| {r['prefix']} | {r['model']} | {r['ms']:.1f} | "
                         f"{_ratio(core_rows, r, ('prefix',)):.2f} | {c} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", type=int, nargs="+", default=[256, 2048, 8192])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens", type=int, default=32, help="decoded tokens per cell")
    p.add_argument("--long-tokens", type=int, default=8, help="decoded tokens where prefix × batch > 4096")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-prefill", type=int, default=2048,
                   help="prefill (and time) prompts up to this length; longer prefixes tile its cache")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face Llama rows")
    p.add_argument("--quick", action="store_true", help="prefixes 256 and 2048, batch 1 only")
    p.add_argument("--flex", action="store_true",
                   help="also time the prefill attention core with compiled FlexAttention (about a minute of "
                        "compilation per prefix)")
    p.add_argument("--markdown", type=Path, default=None, help="update this markdown file's section")
    args = p.parse_args(argv)
    if args.quick:
        args.prefixes, args.batches = [256, 2048], [1]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    prefill_rows, decode_rows = run(args)
    core_rows = flex_rows(args) if args.flex else None
    argv_s = " ".join(argv) if argv is not None else " ".join(os.sys.argv[1:])
    text = markdown(prefill_rows, decode_rows, args, f"python benchmarks/decode.py {argv_s}".strip(), core_rows)
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.markdown:
        write_markdown_section(args.markdown, "decode-cpu", text)


if __name__ == "__main__":
    main()
