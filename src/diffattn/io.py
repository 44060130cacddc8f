"""Atomic writes: a file or a whole checkpoint directory appears complete or not at all.

Every save in the library goes through :func:`atomic_write_file` or :func:`atomic_write_dir`: the content is
written to a temporary path in the same directory, flushed to disk, and renamed into place. For a directory the
swap is one ``renameat2(RENAME_EXCHANGE)`` system call on Linux, so a reader (or a process killed at any
instruction) sees either the previous checkpoint or the new one; elsewhere the previous directory is first renamed
to ``<name>.old`` and :func:`recover_dir` (called by every loader) puts it back if the process died between the
two renames.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write_file", "atomic_write_dir", "recover_dir"]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths with ``renameat2``; False where the call is unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    res = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return res == 0


@contextlib.contextmanager
def atomic_write_file(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary file beside ``path``; on a clean exit flush, fsync and rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_write_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on a clean exit it replaces ``path`` atomically.

    Files already in ``path`` that the new content does not write are not carried over: the new directory is
    exactly what was written inside the block.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        _fsync_tree(tmp)
        if not path.exists():
            os.rename(tmp, path)
        elif path.is_dir() and _exchange(tmp, path):
            shutil.rmtree(tmp)  # tmp now holds the previous content
        else:
            if not path.is_dir():
                raise FileExistsError(f"cannot save a directory to {str(path)!r}: a file of that name exists")
            old = path.with_name(path.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_dir(path: str | os.PathLike) -> Path:
    """Finish a directory swap that a killed process left half done (only reachable without ``renameat2``)."""
    path = Path(path)
    old = path.with_name(path.name + ".old")
    if not path.exists() and old.is_dir():
        os.rename(old, path)
    return path
