"""The evaluation commands: ``diffattn eval`` (:func:`diffattn.eval.runner.evaluate`), ``diffattn compare``
(:func:`diffattn.eval.comparison.compare`), ``diffattn object-attention`` (:mod:`diffattn.eval.detection`) and
``diffattn lm-eval`` (:mod:`diffattn.eval.lm_harness`).

    diffattn eval runs/diff_vit --quick            # results.json + report.md + plots in runs/diff_vit/eval/
    diffattn eval runs/tiny_clip --dataset fashion_mnist --device cuda:1   # zero-shot Fashion-MNIST on GPU 1
    diffattn eval eval.yaml                        # model:, dataset:, text:, mmvp:, quick:, seed:, out:, device:
    diffattn compare runs/vit runs/diff_vit        # side by side; a folder with several seeds gives mean ± std
    diffattn object-attention --results runs/studies/detection/detection.json --out object_attention.md
    diffattn lm-eval --model diffattn --model_args path=runs/lm/model --tasks lambada_openai   # lm-eval's CLI
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from ..errors import UsageError
from ..eval import comparison, report, runner
from ..eval.detection import compare_object_attention, object_attention_table
from ..extras import MissingExtraError, require
from ..io import atomic_write_file
from ..utils import resolve_device
from .common import device_type

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
    """The object attention of every run of the ``detection.json`` files (:func:`compare_object_attention`): both
    tables (signed, relu) printed and written to ``--out``, the rows to ``--out`` with ``.json``."""
    if importlib.util.find_spec("ultralytics") is None:
        raise MissingExtraError("diffattn object-attention needs ultralytics (AGPL-3.0): pip install "
                                "'diffattn[detect]'")
    p = args.parser  # the subcommand's parser reports the errors
    results = []
    for path in args.results:
        if not path.is_file():
            p.error(f"--results {path}: no such file")
        results.append(json.loads(path.read_text()))
    budget = results[0]["budget"]
    data = args.data or Path(budget["data"])
    imgsz = args.imgsz or int(budget["imgsz"])
    if imgsz < 32:
        p.error(f"--imgsz must be >= 32, got {imgsz}")
    runs = [r for res in results for r in res["runs"]]
    rows = compare_object_attention(runs, data, split=args.split, imgsz=imgsz, limit=args.limit)
    table = "\n".join(object_attention_table(rows, mode) for mode in ("signed", "relu"))
    with atomic_write_file(args.out, "w") as f:
        f.write(table)
    with atomic_write_file(args.out.with_suffix(".json"), "w") as f:
        f.write(json.dumps({"data": str(data), "split": args.split, "imgsz": imgsz, "rows": rows}, indent=1) + "\n")
    print(table)
    return 0


def _lm_eval_command(args: argparse.Namespace) -> int:
    from ..eval.lm_harness import main  # imports lm-eval (an optional library) on import

    main(args.args)
    return 0


def register(subparsers) -> None:
    """Add ``diffattn eval``, ``compare``, ``object-attention`` and ``lm-eval``."""
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
    o.add_argument("--results", type=Path, action="append", required=True,
                   help="a detection.json of diffattn study detection (repeat to combine runs)")
    o.add_argument("--data", type=Path, default=None,
                   help="the runs' data.yaml (default: the first results.json's budget 'data')")
    o.add_argument("--split", default="val")
    o.add_argument("--imgsz", type=int, default=None, help="default: the first results.json's budget imgsz")
    o.add_argument("--limit", type=int, default=None, help="at most this many images")
    o.add_argument("--out", type=Path, required=True, help="the Markdown table; the rows go to OUT with .json")
    o.set_defaults(func=_object_attention_command, parser=o)
    h = subparsers.add_parser("lm-eval", add_help=False, help="lm-eval's command line with the 'diffattn' model "
                              "registered (diffattn.eval.lm_harness; every argument goes to lm-eval)")
    h.set_defaults(func=_lm_eval_command, passthrough=True)  # diffattn.cli.main hands it the other arguments
