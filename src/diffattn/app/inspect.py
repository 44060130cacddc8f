"""``diffattn inspect``: the attention noise of a released differential-attention model (Motif, DiffLlama) or a
diffattn model on one prompt (:func:`diffattn.eval.inspection.inspect_folder`): λ, entropy, needle mass, maps; or
of a saved Stable Audio 3 DiT on one deterministic input
(:func:`diffattn.eval.inspection_stable_audio.inspect_stable_audio_folder`): A1, A2, A1 − A2 per module and head.

    diffattn inspect path/to/Motif-2-12.7B --prompt "…" --needle "The code is 4711." --out inspect/
    diffattn inspect path/to/stable-audio-3/transformer --frames 32 --out inspect/
"""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError, user_input
from ..eval.inspection import DTYPES, inspect_folder
from ..eval.inspection_stable_audio import inspect_stable_audio_folder, stable_audio_folder
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


#: the options that build a text input, and those that build a Stable Audio 3 DiT's (dest names)
_TEXT_OPTIONS = ("prompt", "needle", "question", "ids", "needle_ids", "question_ids", "tokenizer")
_AUDIO_OPTIONS = ("frames", "context_tokens", "timestep", "seed")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _stable_audio_command(args: argparse.Namespace) -> int:
    given = [_option(k) for k in _TEXT_OPTIONS if getattr(args, k) is not None]
    if given:
        raise UsageError(f"{args.path} is a Stable Audio 3 DiT, which takes latents, not text: drop {', '.join(given)}"
                         f" (its input is set by --frames, --context-tokens, --timestep and --seed)")
    audio = {k: getattr(args, k) for k in _AUDIO_OPTIONS if getattr(args, k) is not None}
    with user_input():
        res = inspect_stable_audio_folder(args.path, args.out, device=args.device, dtype=DTYPES[args.dtype],
                                          backend=args.backend, head=args.head, save_maps=args.save_maps,
                                          plots=not args.no_plots, **audio)
    if args.json:
        print(json.dumps(res, indent=1, default=float))
        return 0
    i, c = res["input"], res["config"]
    print(f"{res['model_class']} (stable_audio, {res['dtype']}), {c['depth']} blocks × self + cross attention, "
          f"{c['num_heads']} heads, λ = 1; input: {i['memory_tokens']} memory + {i['latent_tokens']} latent tokens, "
          f"{i['context_tokens']} context tokens, t = {i['timestep']:g}, seed {i['seed']}")
    print("module                              A1 entropy  A2 entropy  negative mass  memory mass (signed)  "
          "diagonal (signed)")
    for r in res["layers"]:
        e1, e2, neg = (sum(v) / len(v) for v in (r["entropy"]["A1"], r["entropy"]["A2"], r["negative_mass"]))
        mem = (f"{sum(v) / len(v):>20.4f}" if (v := r.get("memory_mass", {}).get("signed")) else f"{'—':>20}")
        diag = (f"{sum(v) / len(v):>17.4f}" if (v := r.get("diagonal_mass", {}).get("signed")) else f"{'—':>17}")
        print(f"{r['name']:<34}  {e1:>10.3f}  {e2:>10.3f}  {neg:>13.4f}  {mem}  {diag}")
    print(f"wrote summary.json and the figures to {args.out}")
    return 0


def _inspect_command(args: argparse.Namespace) -> int:
    if stable_audio_folder(args.path) is not None:
        return _stable_audio_command(args)
    given = [_option(k) for k in _AUDIO_OPTIONS if getattr(args, k) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} set the input of a Stable Audio 3 DiT; {args.path} is not a saved "
                         f"StableAudio3DiTModel (config.json with _class_name 'StableAudio3DiTModel')")
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
                              "DiffLlama) or a diffattn model on one prompt: λ, entropy, needle mass, maps; or of a "
                              "saved Stable Audio 3 DiT on one generated input: A1, A2, A1 − A2 per module and head")
    i.add_argument("path", help="a released Motif folder, a transformers DiffLlama folder, a diffattn model/run "
                   "folder, or a saved diffusers StableAudio3DiTModel (its folder, or a pipeline's with transformer/)")
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
                   help="attention backend of the converted layers or of the DiT's processor (the captured maps "
                   "use math)")
    i.add_argument("--head", type=int, default=None, help="plot this signal head and its noise head (default: the "
                   "mean over heads)")
    i.add_argument("--frames", type=int, default=None, help="Stable Audio 3 DiT: latent frames of the input "
                   "(default 16 × the config's patch_size); its channels, the context and global widths and the "
                   "memory tokens come from the folder's config.json")
    i.add_argument("--context-tokens", type=int, default=None, help="Stable Audio 3 DiT: tokens of the "
                   "cross-attention context (default 8)")
    i.add_argument("--timestep", type=float, default=None, help="Stable Audio 3 DiT: the timestep t in [0, 1] "
                   "(default 0.5)")
    i.add_argument("--seed", type=int, default=None, help="Stable Audio 3 DiT: seed of the N(0, 1) latents, context "
                   "and global condition (default 0)")
    i.add_argument("--save-maps", action="store_true", help="also write every layer's maps (maps.safetensors)")
    i.add_argument("--no-plots", action="store_true", help="summary.json only")
    i.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    i.set_defaults(func=_inspect_command)
