"""The ``diffattn`` argument parser: :func:`build_parser` adds the subcommands of every module of
:data:`COMMAND_MODULES`, in that order (the order ``diffattn --help`` lists them). :func:`diffattn.cli.main` imports
this module (torch, the studies, the training and evaluation code) after it has answered ``--version``."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from .._version import __version__

__all__ = ["build_parser", "plain_text", "ArgumentParser", "COMMAND_MODULES"]

#: Modules that add subcommands: each defines ``register(subparsers)``, which adds its parsers and sets ``func``
#: (called with the parsed args, returns the exit code) through ``set_defaults``; ``passthrough=True`` there hands
#: every argument the parser does not know to the command (``args.args``).
COMMAND_MODULES: tuple[str, ...] = (
    "diffattn.app.demo",  # demo
    "diffattn.app.study",  # study
    "diffattn.app.models",  # models
    "diffattn.app.external",  # openclip-train, timm-train
    "diffattn.app.data",  # data {prepare,list,export,tokenize}
    "diffattn.app.train",  # train
    "diffattn.app.eval",  # eval, compare, object-attention, lm-eval
    "diffattn.app.inspect",  # inspect
    "diffattn.app.summary",  # study-summary
)


def plain_text(text: str) -> str:
    """``text`` without the reST markup of docstrings: double backquotes dropped, a role such as :func: replaced by
    the name it points to (its last part where the role has a tilde)."""
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    return re.sub(r":[a-z]+:`(~?)([^`]+)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error, ``diffattn: error: <subcommand>: <message>`` (exit status 2), and help
    without reST markup (:func:`plain_text`): help strings and descriptions borrowed from docstrings read as
    text."""

    def format_help(self) -> str:
        return plain_text(super().format_help())

    def format_usage(self) -> str:
        return plain_text(super().format_usage())

    def error(self, message: str):
        print(f"diffattn: error: {self.prog.removeprefix('diffattn').strip() + ': ' if self.prog != 'diffattn' else ''}"
              f"{message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The ``diffattn`` argument parser with every subcommand registered."""
    p = ArgumentParser(prog="diffattn", description="Differential attention for PyTorch.")
    p.add_argument("--version", action="version", version=f"diffattn {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (also DIFFATTN_DEBUG=1); "
                   "may be given anywhere on the command line")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p
