"""The YAML recipes shipped inside the package: tiny runs, the demo, the studies and the papers' recipes.

They are package data (``src/diffattn/configs/``; a source checkout also reaches them as ``configs/``), so a pip
install finds them by name from any folder::

    diffattn train tiny/clip                 # = <package>/configs/tiny/clip.yaml
    diffattn train configs/tiny/clip.yaml    # the checkout's spelling works everywhere too
    diffattn study diffclip                  # = <package>/configs/studies/diffclip.yaml

A path to an existing file always wins over a packaged name, so your own copy of a recipe is read as given.
:func:`apply_sets` is the one parser of ``--set key=value`` overrides (``diffattn train`` and ``diffattn study``).
Only the standard library is imported here (and PyYAML when a ``--set`` value is parsed).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["CONFIG_DIR", "config_names", "find_config", "parse_set", "apply_sets"]

#: The folder of the packaged recipes.
CONFIG_DIR = Path(__file__).resolve().parent
_SUFFIXES = (".yaml", ".yml")
#: Leading folders the recipes are spelled with in a checkout; stripped before looking up a packaged name.
_PREFIXES = ("src/diffattn/configs/", "diffattn/configs/", "configs/")


def config_names(group: str | None = None) -> list[str]:
    """Names of the packaged recipes (``tiny/clip``, ``studies/diffclip``, ``daa_gpt2_owt``, …), sorted; with
    ``group`` (``tiny``, ``demo``, ``studies``) only that folder's, without the folder."""
    base = CONFIG_DIR if group is None else CONFIG_DIR / group
    names = [p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*") if p.suffix in _SUFFIXES]
    return sorted(names)


def _packaged(name: str) -> Path | None:
    for suffix in ("", *_SUFFIXES):
        path = (CONFIG_DIR / f"{name}{suffix}").resolve()
        if path.suffix in _SUFFIXES and path.is_file() and path.is_relative_to(CONFIG_DIR):
            return path
    return None


def find_config(config: str | os.PathLike, group: str | None = None, argument: str = "config") -> Path:
    """The YAML file that ``config`` names.

    Args:
        config: a path to an existing file (read as given), or the name of a packaged recipe with or without
            ``.yaml`` and with or without a leading ``configs/`` (``tiny/clip``, ``configs/tiny/clip.yaml``).
        group: a folder tried first for bare names (``group="studies"`` makes ``diffclip`` mean
            ``studies/diffclip``).
        argument: the argument's name in the error message.

    Raises:
        FileNotFoundError: neither a file nor a packaged recipe; the message names ``argument`` and lists the
            packaged names.
    """
    path = Path(config)
    if path.is_file():
        return path
    name = str(config).replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    tries = [f"{group}/{name}", name] if group and not name.startswith(f"{group}/") else [name]
    for candidate in tries:
        found = _packaged(candidate) if candidate and ".." not in candidate.split("/") else None
        if found is not None:
            return found
    known = config_names(group) if group else config_names()
    raise FileNotFoundError(f"{argument} must be a YAML file or the name of a packaged recipe, got {str(config)!r} "
                            f"(no such file; packaged{f' {group}' if group else ''}: {', '.join(known)})")


def parse_set(item: str, *, min_depth: int = 1, example: str = "key") -> tuple[list[str], Any]:
    """``"a.b=value"`` → (``["a", "b"]``, the value parsed as YAML: ``3e-4``, ``true``, ``[1, 2]``). A key of fewer
    than ``min_depth`` dotted parts, a missing ``=`` or a value that is not YAML is a :class:`UsageError` naming the
    item (``example`` spells the expected key, e.g. ``section.key``)."""
    import yaml

    key, sep, value = item.partition("=")
    parts = [p.strip() for p in key.strip().split(".")]
    if not sep or not key.strip() or not all(parts):
        raise UsageError(f"--set takes {example}=value, got {item!r}")
    if len(parts) < min_depth:
        raise UsageError(f"--set key must be {example} (e.g. optim.lr), got {key.strip()!r}")
    try:
        return parts, yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise UsageError(f"--set {item}: the value is not valid YAML ({getattr(e, 'problem', None) or e})") from None


def apply_sets(data: dict[str, Any], items: Iterable[str] | dict[str, Any] | None, *, min_depth: int = 1,
               example: str = "key", where: str = "") -> dict[str, Any]:
    """A deep copy of ``data`` with every ``--set`` override applied (:func:`parse_set`; or a mapping of dotted keys
    to values already parsed): a dotted key sets an entry of a nested mapping, created when missing; a parent that is
    not a mapping is a :class:`UsageError` (``where`` names the file)."""
    out = copy.deepcopy(data)
    pairs = [(k.split("."), v) for k, v in items.items()] if isinstance(items, dict) else \
        [parse_set(item, min_depth=min_depth, example=example) for item in items or ()]
    for parts, value in pairs:
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UsageError(f"--set {'.'.join(parts)}: {p!r}{' in ' + where if where else ''} is not a mapping")
        node[parts[-1]] = value
    return out
