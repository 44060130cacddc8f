"""Host cost: the aten ops (views excluded) that one forward + backward dispatches, differential against standard.

On a GPU, small and medium models train host-bound: the step takes as long as its ops take to launch. This counts
them on the CPU (``diffattn.utils.count_ops``) for one block of each attention kind and for whole ViT-B/16 models,
on the eager ``sdpa`` path and on the fused-kernel path, the path a GPU takes (the layers' λ, combination and
sub-norm in the kernels; the Triton kernels replaced by launchers that do nothing, so every aten op around them,
allocations included, is counted; tests/test_layers_ops.py does the same and holds the ceilings).

    python benchmarks/host_ops.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import diffattn  # noqa: E402
from diffattn.layers.attention import _AttentionBase  # noqa: E402
from diffattn.utils import count_ops as _count  # noqa: E402
from diffattn.utils import cpu_name, write_markdown_section  # noqa: E402
from test_layers_ops import block_ops, fused_path, llama_layer_ops  # noqa: E402  (one definition, with the test)

MODELS = ("diff_vit_base_patch16_224", "dg_vit_base_patch16_224")


def model_ops(name: str, backend: str = "sdpa", twin: bool = False) -> int:
    """Ops of one training step (B 2, 224², N = 197) of model ``name``, or of its standard twin (the same config
    with standard attention) when ``twin``."""
    torch.manual_seed(0)
    model = diffattn.create_model(name, **({"attention": {"kind": "standard"}} if twin else {}))
    for m in model.modules():
        if isinstance(m, _AttentionBase):
            m.backend = backend
    x = torch.randn(2, 3, 224, 224)

    def count() -> int:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        return sum(_count(lambda: model(x).sum().backward()).values())

    if backend != "triton":
        return count()
    with fused_path() as calls:
        n = count()
    assert calls, f"{name}: no layer took the fused path"
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", type=Path, help="write the table into this file's 'Host cost' section")
    ap.add_argument("--no-models", action="store_true", help="blocks and layers only (the ViT-B/16 counts take "
                    "a few minutes on 2 CPU cores)")
    ap.add_argument("--json", type=Path, help="write the table, the machine and the torch version here as JSON")
    args = ap.parse_args()
    std = block_ops("standard")
    ratios, fused_ratios = {}, {}  # eager (sdpa) and fused-kernel paths
    rows = ["| block (width 64, 4 heads, B 2, N 16) | eager ops | × standard | fused-kernel ops | × standard |",
            "|---|---|---|---|---|", f"| standard | {std} | 1.00 | {std} | 1.00 |"]
    for kind in ("diff", "gated", "diff_v2"):
        e, f = block_ops(kind), block_ops(kind, backend="triton")
        ratios[kind], fused_ratios[kind] = e / std, f / std
        rows.append(f"| {kind} | {e} | {e / std:.2f} | {f} | {f / std:.2f} |")
    base, daa = llama_layer_ops(None), llama_layer_ops("daa")
    rows += ["", "| Llama decoder layer (width 64, 4 heads, B 2, N 16) | eager ops | × base |", "|---|---|---|",
             f"| base | {base} | 1.00 |", f"| DAA retrofit | {daa} | {daa / base:.2f} |"]
    if not args.no_models:
        rows += ["", "| model (B 2, 224², forward + backward) | standard twin | eager ops | × twin | fused-kernel ops "
                 "| × twin |", "|---|---|---|---|---|---|"]
        for name in MODELS:
            twin, e, f = model_ops(name, twin=True), model_ops(name), model_ops(name, "triton")
            rows.append(f"| {name} | {twin} | {e} | {e / twin:.2f} | {f} | {f / twin:.2f} |")
    text = "\n".join(rows)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(machine=cpu_name(), torch=torch.__version__, table=text,
                                             block_ratios=ratios, fused_block_ratios=fused_ratios),
                                        indent=1))
    if args.markdown:
        body = (f"## Host cost (ops per training step), cpu\n\nMachine: {cpu_name()}, torch {torch.__version__}. "
                "Command: `python benchmarks/host_ops.py --markdown docs/benchmarks.md`. Goal: every differential "
                "block ≤ 1.3× the standard block on the path a GPU takes (the fused-kernel column).\n\n" + text)
        write_markdown_section(args.markdown, "host-ops", body)


if __name__ == "__main__":
    main()
