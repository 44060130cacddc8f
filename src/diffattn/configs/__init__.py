"""The YAML recipes shipped inside the package: tiny runs, the demo, the studies and the papers' recipes.

They are package data (``src/diffattn/configs/``; a source checkout also reaches them as ``configs/``), so a pip
install finds them by name from any folder::

    diffattn train tiny/clip                 # = <package>/configs/tiny/clip.yaml
    diffattn train configs/tiny/clip.yaml    # the checkout's spelling works everywhere too
    diffattn study diffclip                  # = <package>/configs/studies/diffclip.yaml

A path to an existing file always wins over a packaged name, so your own copy of a recipe is read as given.
Only the standard library is imported here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONFIG_DIR", "config_names", "find_config"]

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
