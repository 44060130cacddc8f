"""``diffattn inspect``: the attention noise of a released differential-attention model (Motif, DiffLlama) or a
diffattn model on one prompt (:func:`diffattn.eval.inspection.inspect_folder`): λ, entropy, needle mass, maps.

    diffattn inspect path/to/Motif-2-12.7B --prompt "…" --needle "The code is 4711." --out inspect/
"""

from __future__ import annotations

import argparse
import json

from ..errors import user_input
from ..eval.inspection import inspect_folder
from .common import device_type

__all__ = ["register"]


def _ids(text: str) -> list[int]:
    """Token ids as the command line gives them: "1,2,3" or "1 2 3"."""
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs token ids separated by commas, got {text!r}") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


def _inspect_command(args: argparse.Namespace) -> int:
    with user_input():  # the folder, the text and the ids are what the user gave: their ValueErrors are usage errors
        res = inspect_folder(args.path, args.out, prompt=args.prompt, needle=args.needle, question=args.question,
                             ids=args.ids, needle_ids=args.needle_ids, question_ids=args.question_ids or [],
                             depth=args.depth, tokenizer=args.tokenizer, device=args.device, dtype=args.dtype,
                             backend=args.backend, head=args.head, save_maps=args.save_maps,
                             plots=not args.no_plots)
    if args.json:
        print(json.dumps(res, indent=1, default=float))
        return 0
    o = res["overall"]
    print(f"{res['model_class']} ({res['family']}, {res['dtype']}), {len(res['layers'])} attention layers, "
          f"{res['num_tokens']} tokens, needle at {res['needle']['start']}..{res['needle']['end'] - 1}")
    print("layer  λ mean    A1 entropy  needle mass (signed)  context mass (signed)")
    for r in res["layers"]:
        lam = f"{r['lambda_mean']:+.4f}" if "lambda_mean" in r else "   —   "
        ent = sum(r["entropy"]["A1"]) / len(r["entropy"]["A1"]) if r["entropy"].get("A1") else float("nan")
        nm, cm = (sum(v) / len(v) for v in (r["needle_mass"]["signed"], r["context_mass"]["signed"]))
        print(f"{r['layer']:>5}  {lam}  {ent:>10.3f}  {nm:>20.4f}  {cm:>21.4f}")
    print(f"mean: λ {o['lambda_mean']:+.4f}, needle {o['needle_mass_signed']:.4f}, context "
          f"{o['context_mass_signed']:.4f}")
    print(f"wrote summary.json and the figures to {args.out}")
    return 0


def register(subparsers) -> None:
    """Add ``diffattn inspect``."""
    i = subparsers.add_parser("inspect", help="attention noise of a released differential-attention model (Motif, "
                              "DiffLlama) or a diffattn model on one prompt: λ, entropy, needle mass, maps")
    i.add_argument("path", help="a released Motif folder, a transformers DiffLlama folder, or a diffattn model/run "
                   "folder")
    i.add_argument("--out", required=True, help="folder for summary.json and the figures")
    i.add_argument("--prompt", default=None, help="the context text (tokenised with the folder's tokenizer or "
                   "--tokenizer)")
    i.add_argument("--needle", default=None, help="text placed into the prompt at --depth; its attention mass is "
                   "measured")
    i.add_argument("--question", default=None, help="text appended after the context; its last token is the query "
                   "row")
    i.add_argument("--ids", type=_ids, default=None, help="the context as token ids, e.g. 5,17,3 (instead of "
                   "--prompt)")
    i.add_argument("--needle-ids", type=_ids, default=None, help="the needle as token ids (with --ids)")
    i.add_argument("--question-ids", type=_ids, default=None, help="the question as token ids (with --ids)")
    i.add_argument("--depth", type=float, default=0.5, help="where the needle goes, as a fraction of the prompt "
                   "(default 0.5)")
    i.add_argument("--tokenizer", default=None, help="bytes, gpt2, a tokenizer folder or a Hub id (default: the one "
                   "the run's config.yaml records, else the folder's own tokenizer files)")
    i.add_argument("--device", type=device_type, default=None, help="cpu (default), cuda or cuda:N")
    i.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "float64"],
                   help="compute dtype (default: the checkpoint's)")
    i.add_argument("--backend", default="auto", choices=["auto", "math", "sdpa", "triton"],
                   help="attention backend of the converted layers (the captured maps use math)")
    i.add_argument("--head", type=int, default=None, help="plot this signal head and its noise head (default: the "
                   "mean over heads)")
    i.add_argument("--save-maps", action="store_true", help="also write every layer's maps (maps.safetensors)")
    i.add_argument("--no-plots", action="store_true", help="summary.json only")
    i.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    i.set_defaults(func=_inspect_command)
