"""``diffattn data``: prepare the built-in datasets, list them, export one as webdataset shards, tokenize a text set
into a token memmap.

    diffattn data prepare [NAMES] [--root DIR] [--force] [--debian auto|install|extract]
    diffattn data list
    diffattn data export tuxpaint_captions --format webdataset --out shards/ [--split train] [--shard-size 1000]
    diffattn data export tuxpaint_detect --out data/tuxpaint_detect [--seed 0]   (Ultralytics YOLO layout)
    diffattn data tokenize state_of_the_union --tokenizer gpt2 --split train --out data/sotu_train.bin
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..data import corpora, data_root, tokenizers, tokens
from ..data import detection as detection_data
from ..data import export as export_data
from ..data.catalog import DATASETS, get_dataset
from ..extras import require
from . import prepare as preparing
from .prepare import ALIASES, BUNDLED, DEBIAN_MODES, TARGETS, is_prepared, resolve_names

__all__ = ["register"]

#: why the data directory is where it is (:func:`diffattn.data._common.data_root`)
_WHY = {"DIFFATTN_DATA": "from $DIFFATTN_DATA",
        "checkout": "the source checkout's data/; set DIFFATTN_DATA to use another",
        "user cache": "the user cache, $XDG_CACHE_HOME/diffattn or ~/.cache/diffattn; set DIFFATTN_DATA to use another",
        "--root": "from --root"}


def _data_dir(args: argparse.Namespace) -> tuple[Path, str]:
    return (Path(args.root), "--root") if args.root else data_root()


def _list(args: argparse.Namespace) -> int:
    root, why = _data_dir(args)
    print(f"data directory: {root} ({_WHY[why]})")

    def todo(name: str) -> str:
        return f"no: diffattn data prepare {ALIASES.get(name, name)}"

    rows = [(d.name, d.kind, "yes" if d.installed(root) else todo(d.name), d.size, d.license)
            for d in DATASETS.values()]
    rows.append(("gpt2", "tokenizer", "yes" if is_prepared(root, "gpt2") else todo("gpt2"),
                 "GPT-2 BPE ranks (tokenizers/gpt2.tiktoken)", "MIT (openai-whisper)"))
    head = ("name", "kind", "installed", "size", "license")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def _prepare_name(text: str) -> str:
    """argparse type of a ``data prepare`` NAME: one clear usage error naming the valid names."""
    try:
        resolve_names([text])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("NAME must be", "must be")) from None
    return text


def _prepare(args: argparse.Namespace) -> int:
    root, why = _data_dir(args)
    print(f"data directory: {root} ({_WHY[why]})")
    results = preparing.prepare(args.names, root=root, force=args.force, debian=args.debian)
    failed = [r for r in results.values() if not r.ok]
    done = [r.name for r in results.values() if r.ok]
    if done:
        print(f"ready in {root}: {', '.join(done)}")
    if failed:
        print(f"diffattn data prepare: not prepared: {', '.join(r.name for r in failed)} (the reasons are above)",
              file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    require("data", "diffattn data export")  # before anything is written
    if args.name == "tuxpaint_detect":  # generated detection set in Ultralytics' YOLO layout
        m = detection_data.export_detection(args.out, root=args.root, seed=args.seed)
        print(f"{m['counts']} (classes {m['classes']}) -> {args.out}/data.yaml")
        return 0
    m = export_data.export_webdataset(args.name, args.out, split=args.split, root=args.root, shard_size=args.shard_size)
    print(f"{m['n_samples']} samples in {m['n_shards']} shard(s): {m['urls']} (keys {', '.join(m['keys'])})")
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    require("data", "diffattn data tokenize")  # before anything is written
    if args.name not in corpora.CORPORA:
        raise SystemExit(f"diffattn data tokenize: NAME must be a text set {sorted(corpora.CORPORA)}, got "
                         f"{args.name!r}")
    tok = tokenizers.get_tokenizer(args.tokenizer)
    ids = tokens.tokenize_documents(get_dataset(args.name, split=args.split, root=args.root).texts, tok)
    path = tokens.write_token_memmap(ids, args.out, vocab_size=tok.vocab_size, tokenizer=tok.name)
    print(f"{len(ids)} {tok.name} tokens -> {path} ({'uint16' if tok.vocab_size <= 2**16 else 'uint32'})")
    return 0


def register(subparsers) -> None:
    """Add ``diffattn data {prepare,list,export,tokenize}``."""
    root_help = ("data folder (default: $DIFFATTN_DATA, else a source checkout's data/, else ~/.cache/diffattn; "
                 "`diffattn data list` shows which)")
    p = subparsers.add_parser("data", help="offline datasets: prepare, list, export as webdataset shards, tokenize")
    sub = p.add_subparsers(dest="data_command", required=True)
    pr = sub.add_parser("prepare", help="fetch and prepare built-in datasets into the data directory (idempotent)",
                        description=("Fetch and prepare built-in datasets into the data directory. Each name is "
                                     "skipped when already prepared (--force makes it again); one that cannot be "
                                     "prepared says why and what to run, and the others go on (exit status 1)."))
    pr.add_argument("names", nargs="*", type=_prepare_name, metavar="NAME",
                    help=f"what to prepare (default: all): {', '.join([*TARGETS, *ALIASES, *BUNDLED])}")
    pr.add_argument("--root", default=None, help=root_help)
    pr.add_argument("--force", action="store_true", help="fetch and prepare again even where already prepared")
    pr.add_argument("--debian", choices=DEBIAN_MODES, default="auto",
                    help="how missing Debian packages are obtained: install (apt-get install, needs root), extract "
                    "(apt-get download + dpkg-deb -x into the data directory, no root), auto (install as root, "
                    "else extract)")
    pr.set_defaults(func=_prepare)
    ls = sub.add_parser("list", help="the data directory and every built-in dataset: size, licence, prepared?")
    ls.add_argument("--root", default=None, help=root_help)
    ls.set_defaults(func=_list)
    ex = sub.add_parser("export", help="write a built-in set as webdataset shards (open_clip's key layout), or "
                        "tuxpaint_detect as an Ultralytics YOLO detection set")
    ex.add_argument("name")
    ex.add_argument("--seed", type=int, default=0, help="generation seed (tuxpaint_detect)")
    ex.add_argument("--format", choices=["webdataset"], default="webdataset")
    ex.add_argument("--out", required=True, help="folder for the shards and their manifest")
    ex.add_argument("--split", default="train", choices=["train", "val", "test", "all", "trainval"])
    ex.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    ex.add_argument("--root", default=None, help=root_help)
    ex.set_defaults(func=_export)
    tk = sub.add_parser("tokenize", help="tokenize a text set into a uint16/uint32 token file (nanoGPT layout)")
    tk.add_argument("name")
    tk.add_argument("--tokenizer", choices=["gpt2", "clip"], default="gpt2")
    tk.add_argument("--split", default="train", choices=["train", "val", "test", "all"])
    tk.add_argument("--out", required=True, help="the token file to write (a .json sidecar goes beside it)")
    tk.add_argument("--root", default=None, help=root_help)
    tk.set_defaults(func=_tokenize)
