"""The ``diffattn eval`` and ``diffattn compare`` subcommands (registered through ``diffattn.cli.COMMAND_MODULES``).

    diffattn eval runs/diff_vit --quick            # results.json + report.md + plots in runs/diff_vit/eval/
    diffattn eval runs/tiny_clip --dataset fashion_mnist --device cuda:1   # zero-shot Fashion-MNIST on GPU 1
    diffattn eval eval.yaml                        # model:, dataset:, text:, mmvp:, quick:, seed:, out:, device:
    diffattn compare runs/vit runs/diff_vit        # side by side; a folder with several seeds gives mean ± std
    diffattn object-attention --results runs/studies/detection/detection.json --out object_attention.md
    diffattn lm-eval --model diffattn --model_args path=runs/lm/model --tasks lambada_openai   # lm-eval's CLI
    diffattn inspect path/to/Motif-2-12.7B --prompt "…" --needle "The code is 4711." --out inspect/
"""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError, user_input
from ..extras import MissingExtraError, require
from ..utils import device_type, resolve_device
from . import comparison, report, runner
from .detection import add_arguments, run_command
from .inspection import inspect_folder

__all__ = ["register"]


def _eval_command(args: argparse.Namespace) -> int:
    require("eval", "diffattn eval")  # before anything is written
    runner.check_eval_dataset(args.dataset, what="--dataset")
    if args.device is not None:
        resolve_device(args.device, "--device")  # a GPU torch cannot see is named as the flag, before any work
    res = runner.evaluate(args.target, args.out, dataset=args.dataset, text=args.text, mmvp=args.mmvp,
                          quick=args.quick, full=args.full, seed=args.seed, progress=not args.no_progress,
                          device=args.device)
    if res["skipped"]:
        kind, why = next(iter(res["skipped"].items()))
        raise UsageError(f"the {kind} suite was skipped ({why}); {res['output_dir']}/results.json records it")
    if args.json:  # for scripts: the results.json just written, on stdout
        print(json.dumps(res, indent=1, default=float))
        return 0
    print(report.summary_table(res))
    print(f"wrote results.json and report.md to {res['output_dir']}")
    return 0


def _compare_command(args: argparse.Namespace) -> int:
    require("eval", "diffattn compare")
    print(comparison.compare(args.runs, args.out, labels=args.labels), end="")
    if args.out:
        print(f"\nwrote {args.out} and its .json")
    return 0


def _object_attention_command(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("ultralytics") is None:
        raise MissingExtraError("diffattn object-attention needs ultralytics (AGPL-3.0): pip install "
                                "'diffattn[detect]'")
    return run_command(args.parser, args)


def _lm_eval_command(args: argparse.Namespace) -> int:
    from .lm_harness import main  # imports lm-eval (an optional library) on import

    main(args.args)
    return 0


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
    e = subparsers.add_parser("eval", help="evaluate a saved model / run: results.json, report.md and plots")
    e.add_argument("target", help="run directory, folder saved with save_pretrained, or a YAML file")
    e.add_argument("--out", default=None, help="output folder (default <target>/eval)")
    e.add_argument("--dataset", default=None, help="a built-in dataset that fits the model: digits or fashion_mnist "
                   "(vision transformer); tuxpaint_captions, emoji, fashion_mnist or digits (CLIP); moby_dick, "
                   "state_of_the_union or spamassassin (causal LM). Default: the run's, else by model type")
    e.add_argument("--device", type=device_type, default=None, help="cpu, cuda or cuda:N (default: cuda when "
                   "torch sees a GPU, else cpu; CUDA_VISIBLE_DEVICES picks the GPUs it sees)")
    e.add_argument("--text", default=None, help="a text file for the language-model evaluations")
    e.add_argument("--mmvp", default=None, help="an MMVP-VLM folder (Questions.csv + 'MLLM_VLM Images/')")
    e.add_argument("--quick", action="store_true", help="smoke-test protocol (256 test images, fewer episodes and "
                   "trials)")
    e.add_argument("--full", action="store_true", help="every test and training image (default: a seeded "
                   "stratified sample of 2,000 test and 5,000 training images; minutes on 2 CPU cores)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    e.add_argument("--json", action="store_true", help="print the results as JSON (what results.json holds) instead "
                   "of the summary table, for scripts")
    e.set_defaults(func=_eval_command)
    c = subparsers.add_parser("compare", help="compare evaluated runs side by side (mean ± std over seeds)")
    c.add_argument("runs", nargs="+", help="results.json files or run folders (a folder holding several seeds' "
                   "results is one column)")
    c.add_argument("--labels", nargs="+", default=None, help="column names (default: folder names)")
    c.add_argument("--out", default=None, help="write the markdown table here (and a .json beside it)")
    c.set_defaults(func=_compare_command)
    o = subparsers.add_parser("object-attention", help="how much the attention layers of the detectors of "
                              "diffattn study detection look at the objects (diffattn.eval.detection)")
    add_arguments(o)
    o.set_defaults(func=_object_attention_command, parser=o)
    h = subparsers.add_parser("lm-eval", add_help=False, help="lm-eval's command line with the 'diffattn' model "
                              "registered (diffattn.eval.lm_harness; every argument goes to lm-eval)")
    h.set_defaults(func=_lm_eval_command, passthrough=True)  # diffattn.cli.main hands it the other arguments
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
