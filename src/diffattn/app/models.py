"""``diffattn models [PATTERN] [--json | --names]``: the registered models, a table with their size, family,
attention and pretrained tags."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError, did_you_mean
from ..models import list_models, list_pretrained
from ..models.registry import model_info

__all__ = ["register"]


def _models_command(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        raise UsageError(f"no registered model matches {args.pattern!r}"
                         f"{did_you_mean(args.pattern.strip('*?'), list_models())} (diffattn models lists them all)")
    if args.names:
        print("\n".join(names))
        return 0
    rows = [dict(model_info(n), pretrained=[t for _, t in list_pretrained(n)]) for n in names]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = [("name", "params", "family", "attention", "pretrained", "description")]
    for r in rows:
        att = r["attention"] if isinstance(r["attention"], str) else \
            ", ".join(f"{t} {a}" for t, a in r["attention"].items())
        table.append((r["name"], f"{r['params'] / 1e6:.2f}M", r["family"], att, ", ".join(r["pretrained"]) or "—",
                      r["description"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [c.rjust(w) if i == 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells + [row[-1]]).rstrip())
    return 0


def register(subparsers) -> None:
    """Add ``diffattn models``."""
    m = subparsers.add_parser("models", help="list registered models")
    m.add_argument("pattern", nargs="?", default="*", help="shell-style pattern, e.g. 'diffclip*'")
    m.add_argument("--json", action="store_true", help="a JSON list with one object per model (name, family, "
                   "description, attention, params, module, pretrained tags)")
    m.add_argument("--names", action="store_true", help="names only, one per line")
    m.set_defaults(func=_models_command)
