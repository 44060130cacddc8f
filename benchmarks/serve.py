"""vLLM serving throughput: each differential architecture through diffattn's plugin against the same-size standard
Llama, in one run.

Every model has width 512, 4 layers, a SwiGLU MLP of 1408, vocabulary 8192, random weights:

- ``llama``: a transformers ``LlamaForCausalLM`` folder, served by vLLM's native model class;
- ``standard``: the same model saved by diffattn, served by the plugin with standard attention;
- ``diff`` (Ye et al. 2024; 8 heads of 64 = 4 differential heads of width 128), ``gated`` (M-DGSA), ``diff_v2``
  (Ye et al. 2026; 8 differential heads, 16 query heads of 64) and ``grouped_4to1`` (grouped differential attention
  as Motif-2-12.7B, arXiv 2510.06949: 4 signal heads and 1 noise head of 64 per key/value group, 1 group).

For each, ``vllm.LLM`` (prefix caching off, eager) gets a batch of 1 and of 16 random prompts of 512 tokens
submitted together, 128 greedy new tokens each (EOS ignored); output tokens/s = new tokens / wall time of the
``generate`` call (prefill included), median of ``--rounds`` rounds after a warm-up. Every engine stays up and the
rounds go through the models in turn (alternately forwards and backwards), so a drift of the machine's speed hits
every model alike. Runs in the serving environment (``make test-serving`` builds it); on a CUDA machine with the CUDA
``vllm`` the same command measures the GPU (``--dtype bfloat16``).

    .venv-serve/bin/python benchmarks/serve.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

DIM, DEPTH, HEADS, MLP, VOCAB, MAX_LEN = 512, 4, 8, 1408, 8192, 1024
PROMPT, NEW = 512, 128
ATTENTION = {
    "standard": dict(kind="standard"),
    "diff": dict(kind="diff", lambda_init="ye"),
    "gated": dict(kind="gated"),
    "diff_v2": dict(kind="diff_v2", lambda_init="ye"),
    "grouped_4to1": dict(kind="grouped", num_noise_heads=1, head_dim=64, num_kv_heads=2, lambda_init="ye"),
}


def write_models(root: Path) -> dict[str, Path]:
    """The model folders: ``llama`` by transformers, the others by diffattn's ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from diffattn.models import CausalLM

    torch.manual_seed(0)
    folders = {}
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=MLP, num_hidden_layers=DEPTH,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_LEN,
                      tie_word_embeddings=False)
    folders["llama"] = root / "llama"
    LlamaForCausalLM(cfg).save_pretrained(folders["llama"])
    for name, att in ATTENTION.items():
        heads = 5 if att["kind"] == "grouped" else HEADS
        model = CausalLM(VOCAB, DIM, DEPTH, heads, mlp_hidden=MLP, max_seq_len=MAX_LEN,
                         attention=dict(att, qkv_bias=False, out_bias=False))
        folders[name] = root / name
        model.save_pretrained(folders[name])
    return folders


def params_m(folder: Path) -> float:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys()) / 1e6


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def engine(folder: Path, batches: list[int], dtype: str, compiled: bool = False):
    import vllm

    return vllm.LLM(model=str(folder), skip_tokenizer_init=True, dtype=dtype, enforce_eager=not compiled,
                    gpu_memory_utilization=0.1 if not torch.cuda.is_available() else 0.08, max_model_len=MAX_LEN,
                    enable_prefix_caching=False, max_num_seqs=max(batches), seed=0)


def measure(llm, batch: int) -> float:
    """Output tokens/s of one ``generate`` call on ``batch`` prompts of :data:`PROMPT` tokens."""
    import vllm

    params = vllm.SamplingParams(max_tokens=NEW, min_tokens=NEW, ignore_eos=True, temperature=0.0, detokenize=False)
    g = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(0, VOCAB, (PROMPT,), generator=g).tolist()} for _ in range(batch)]
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    n = sum(len(r.outputs[0].token_ids) for r in res)
    assert n == batch * NEW, f"generated {n} tokens, expected {batch * NEW}"
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--models", nargs="+", default=["llama", *ATTENTION])
    ap.add_argument("--compile", action="store_true", help="vLLM's default compilation (torch.compile, CUDA graphs "
                    "on a GPU) instead of eager")
    ap.add_argument("--json", default=None, help="default benchmarks/results/serve_cpu[_compiled].json")
    ap.add_argument("--markdown", default=None, help="write the table into this file's 'serve' section")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: every engine is up at once
    import vllm

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = write_models(Path(tmp))
        engines = {}
        for name in args.models:  # every engine stays up, so the rounds interleave the models (drift hits all)
            engines[name] = engine(folders[name], args.batches, args.dtype, args.compile)
            measure(engines[name], 2)  # warm-up
            results[name] = {"params_m": round(params_m(folders[name]), 2), "tokens_s": {str(b): [] for b in
                                                                                        args.batches}}
        for r in range(args.rounds):
            for name in (args.models if r % 2 == 0 else args.models[::-1]):
                for b in args.batches:
                    results[name]["tokens_s"][str(b)].append(measure(engines[name], b))
            print(f"round {r + 1}:", {n: {b: round(v[-1], 1) for b, v in e["tokens_s"].items()}
                                      for n, e in results.items()}, flush=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else _cpu()
    record = {"device": device, "vllm": vllm.__version__, "torch": torch.__version__, "dtype": args.dtype,
              "compiled": args.compile, "prompt": PROMPT, "new_tokens": NEW, "rounds": args.rounds,
              "order": args.models, "results": results,
              "command": "python benchmarks/serve.py" + (" --compile" if args.compile else "") +
              (f" --markdown {args.markdown}" if args.markdown else "")}
    out = Path(args.json or f"benchmarks/results/serve_cpu{'_compiled' if args.compile else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    table = render(record)
    print(table)
    if args.markdown:
        from diffattn.utils import write_markdown_section

        write_markdown_section(args.markdown, "serve-compiled" if args.compile else "serve", table)


def _cpu() -> str:
    try:
        from diffattn.utils import cpu_name

        return f"{cpu_name()}, {os.cpu_count()} cores"
    except ImportError:  # pragma: no cover
        return platform.processor()


def render(record: dict) -> str:
    """The markdown section: each model's median tokens/s and its ratios to the two standard baselines."""
    res = record["results"]
    med = {n: {b: statistics.median(v) for b, v in e["tokens_s"].items()} for n, e in res.items()}
    mode = "compiled (vLLM's default)" if record.get("compiled") else "eager"
    flag = " --compile" if record.get("compiled") else ""
    about = (f"vLLM {record['vllm']}, torch {record['torch']}, {record['dtype']}, {mode}; prompts of "
             f"{record['prompt']} tokens, {record['new_tokens']} greedy new tokens each, a batch submitted at once; "
             f"output tokens/s = new tokens / wall time of `LLM.generate` (prefill included), median of "
             f"{record['rounds']} rounds, every engine up at once and the rounds interleaved. `llama` is vLLM's own "
             "LlamaForCausalLM; `standard` the same-size standard model saved by diffattn and served by the plugin "
             "(the same code path as the differential ones); the others are diffattn folders served by the plugin. "
             "Goal on the CPU: every differential architecture ≥ 0.9× the faster of the two standard models (the "
             "strongest baseline).")
    lines = [f"## Serving with vLLM, {mode}, {record['device']}", "", about, "",
             "Command:", "", "```", f".venv-serve/bin/python benchmarks/serve.py{flag} --markdown docs/benchmarks.md",
             "```",
             "", "| model | params M | batch | tokens/s | × llama | × standard | goal ≥ 0.9× the faster standard |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, e in res.items():
        for b in e["tokens_s"]:
            best = max(med["llama"][b], med["standard"][b])
            ratio = med[name][b] / best
            goal = "" if name in ("llama", "standard") else (
                f"met ({ratio:.2f})" if ratio >= 0.9 else f"**not met** ({ratio:.2f})")
            lines.append(f"| {name} | {e['params_m']:.1f} | {b} | {med[name][b]:.1f} | "
                         f"{med[name][b] / med['llama'][b]:.2f} | {med[name][b] / med['standard'][b]:.2f} | {goal} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
