"""``diffattn data``: list the datasets, export one as webdataset shards, tokenize a text set into a token memmap.

    diffattn data list
    diffattn data export tuxpaint_captions --format webdataset --out shards/ [--split train] [--shard-size 1000]
    diffattn data export tuxpaint_detect --out data/tuxpaint_detect [--seed 0]   (Ultralytics YOLO layout)
    diffattn data tokenize state_of_the_union --tokenizer gpt2 --split train --out data/sotu_train.bin
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _list(args: argparse.Namespace) -> int:
    from .catalog import DATASETS

    rows = [(d.name, d.kind, "yes" if d.installed(args.root) else "no (make data)", d.size, d.license)
            for d in DATASETS.values()]
    head = ("name", "kind", "installed", "size", "license")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.name == "tuxpaint_detect":  # generated detection set in Ultralytics' YOLO layout
        from .detection import export_detection

        m = export_detection(args.out, root=args.root, seed=args.seed)
        print(f"{m['counts']} (classes {m['classes']}) -> {args.out}/data.yaml")
        return 0
    from .formats import export_webdataset

    m = export_webdataset(args.name, args.out, split=args.split, root=args.root, shard_size=args.shard_size)
    print(f"{m['n_samples']} samples in {m['n_shards']} shard(s): {m['urls']} (keys {', '.join(m['keys'])})")
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    from .catalog import get_dataset
    from .corpora import CORPORA
    from .tokenizers import get_tokenizer
    from .tokens import tokenize_documents, write_token_memmap

    if args.name not in CORPORA:
        raise SystemExit(f"diffattn data tokenize: NAME must be a text set {sorted(CORPORA)}, got {args.name!r}")
    tok = get_tokenizer(args.tokenizer)
    ids = tokenize_documents(get_dataset(args.name, split=args.split, root=args.root).texts, tok)
    path = write_token_memmap(ids, args.out, vocab_size=tok.vocab_size, tokenizer=tok.name)
    print(f"{len(ids)} {tok.name} tokens -> {path} ({'uint16' if tok.vocab_size <= 2**16 else 'uint32'})")
    return 0


def register(subparsers) -> None:
    """Add ``diffattn data {list,export,tokenize}``."""
    p = subparsers.add_parser("data", help="offline datasets: list, export as webdataset shards, tokenize")
    sub = p.add_subparsers(dest="data_command", required=True)
    ls = sub.add_parser("list", help="every built-in dataset with its size, licence and whether it is installed")
    ls.add_argument("--root", default=None, help="data folder (default $DIFFATTN_DATA or ./data)")
    ls.set_defaults(func=_list)
    ex = sub.add_parser("export", help="write a built-in set as webdataset shards (open_clip's key layout), or "
                        "tuxpaint_detect as an Ultralytics YOLO detection set")
    ex.add_argument("name")
    ex.add_argument("--seed", type=int, default=0, help="generation seed (tuxpaint_detect)")
    ex.add_argument("--format", choices=["webdataset"], default="webdataset")
    ex.add_argument("--out", required=True, help="folder for the shards and their manifest")
    ex.add_argument("--split", default="train", choices=["train", "val", "test", "all", "trainval"])
    ex.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    ex.add_argument("--root", default=None, help="data folder (default $DIFFATTN_DATA or ./data)")
    ex.set_defaults(func=_export)
    tk = sub.add_parser("tokenize", help="tokenize a text set into a uint16/uint32 token file (nanoGPT layout)")
    tk.add_argument("name")
    tk.add_argument("--tokenizer", choices=["gpt2", "clip"], default="gpt2")
    tk.add_argument("--split", default="train", choices=["train", "val", "test", "all"])
    tk.add_argument("--out", required=True, help="the token file to write (a .json sidecar goes beside it)")
    tk.add_argument("--root", default=None, help="data folder (default $DIFFATTN_DATA or ./data)")
    tk.set_defaults(func=_tokenize)
