"""``diffattn study-summary [--check] [--root DIR]``: the summary tables of docs/studies.md and README.md rendered
from ``docs/study_summary.yaml`` (:func:`diffattn.studies.summary.render_files`).

    diffattn study-summary            # rewrite both tables (between their study-summary markers)
    diffattn study-summary --check    # exit 1 when either file differs from the rendering
"""

from __future__ import annotations

import argparse

from ..studies import summary

__all__ = ["register"]


def _summary_command(args: argparse.Namespace) -> int:
    changed = summary.render_files(args.root, check=args.check)
    for rel in changed:
        print(f"{rel}: {'differs from' if args.check else 'rewritten from'} docs/study_summary.yaml")
    return 1 if args.check and changed else 0


def register(subparsers) -> None:
    """Add ``diffattn study-summary``."""
    ap = subparsers.add_parser("study-summary", help="render the summary tables of docs/studies.md and README.md "
                               "from docs/study_summary.yaml (verdicts derived, never typed)",
                               description=summary.__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="the source checkout (default: the current folder)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a table differs from its rendering")
    ap.set_defaults(func=_summary_command)
