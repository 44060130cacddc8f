"""diffattn.app: every command of ``diffattn`` lives there, one module per command group, and the library packages
hold no argument parsing (no module outside ``app`` and ``cli`` imports argparse)."""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

import diffattn.cli
from diffattn.app.common import bounded, device_type
from diffattn.app.parser import COMMAND_MODULES, build_parser

PKG = Path(__file__).resolve().parents[1] / "src" / "diffattn"
#: where argparse may be imported: the commands and the entry point
COMMAND_PACKAGES = ("app", "cli")
#: modules outside them that import argparse for something other than a command line, with the reason
ARGPARSE_ELSEWHERE = {
    "convert/checkpoint.py": "allows argparse.Namespace when unpickling third-party checkpoints that store their args",
}
#: the subcommands in the order ``diffattn --help`` lists them, with the module of each one's handler
COMMANDS = {
    "demo": "demo", "study": "study", "models": "models", "openclip-train": "external", "timm-train": "external",
    "data": None, "train": "train", "eval": "eval", "compare": "eval", "object-attention": "eval", "lm-eval": "eval",
    "inspect": "inspect", "study-summary": "summary",
}
#: the data subcommands (``diffattn data …``), all in diffattn.app.data
DATA_COMMANDS = ("prepare", "list", "export", "tokenize")


def argparse_imports(source: str) -> list[int]:
    """Line numbers of ``import argparse`` / ``from argparse import …`` in ``source``, at any depth."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "argparse")]


def test_only_the_commands_import_argparse():
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.split("/")[0] in COMMAND_PACKAGES or rel in ARGPARSE_ELSEWHERE:
            continue
        lines = argparse_imports(path.read_text(encoding="utf-8"))
        if lines:
            found[rel] = lines
    assert not found, f"argparse outside diffattn.app / diffattn.cli (a command belongs in diffattn.app): {found}"
    for rel in ARGPARSE_ELSEWHERE:
        assert argparse_imports((PKG / rel).read_text(encoding="utf-8")), f"{rel} no longer imports argparse: drop it"


def test_the_argparse_check_is_not_vacuous():
    assert argparse_imports("import argparse\ndef f():\n    from argparse import Namespace\n") == [1, 3]
    assert argparse_imports("import os\nfrom .argparse import x\n") == []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_is_handled_in_its_app_module():
    commands = _subcommands(build_parser())
    assert list(commands) == list(COMMANDS)
    for name, module in COMMANDS.items():
        if module is None:
            continue
        assert commands[name].get_default("func").__module__ == f"diffattn.app.{module}", name
    data = _subcommands(commands["data"])
    assert list(data) == list(DATA_COMMANDS)
    assert {p.get_default("func").__module__ for p in data.values()} == {"diffattn.app.data"}


def test_command_modules_are_the_app_modules_that_register_commands():
    """Each module of :data:`COMMAND_MODULES` is in diffattn.app and registers commands; every other module there
    is the parser, the shared argument types or the installer."""
    names = {p.stem for p in (PKG / "app").glob("*.py")} - {"__init__"}
    assert len(set(COMMAND_MODULES)) == len(COMMAND_MODULES)
    assert {m.removeprefix("diffattn.app.") for m in COMMAND_MODULES} == names - {"parser", "common", "prepare"}
    for name in COMMAND_MODULES:
        assert callable(importlib.import_module(name).register), name


def test_cli_holds_only_the_entry_point():
    assert diffattn.cli.__all__ == ["main"]
    assert not (PKG / "cli" / "commands.py").exists()
    with pytest.raises(AttributeError):
        diffattn.cli.build_parser  # noqa: B018 (the parser is diffattn.app.parser's)


def test_argument_types_name_what_they_got_and_need():
    assert device_type("cuda:1") == "cuda:1" and device_type("cpu") == "cpu"
    with pytest.raises(argparse.ArgumentTypeError, match="must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        device_type("gpu")
    steps = bounded(int, 1)
    assert steps("3") == 3 and steps.__name__ == "int"
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        steps("0")
    with pytest.raises(argparse.ArgumentTypeError, match="needs int, got 'two'"):
        steps("two")
    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0.0, got 0"):
        bounded(float, 0.0, strict=True)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="needs a finite number, got 'nan'"):
        bounded(float)("nan")
