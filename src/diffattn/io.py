"""Atomic writes: a file or a whole checkpoint directory appears complete or not at all.

Every save in the library goes through :func:`atomic_write_file` or :func:`atomic_write_dir`: the content is
written to a temporary path in the same directory, flushed to disk, and renamed into place. For a directory the
swap is one ``renameat2(RENAME_EXCHANGE)`` system call on Linux, so a reader (or a process killed at any
instruction) sees either the previous checkpoint or the new one; elsewhere the previous directory is first renamed
to ``<name>.old`` and :func:`recover_dir` (called by every loader) puts it back if the process died between the
two renames.

Files and directories follow the process's umask (``0644`` / ``0755`` under umask 022), as ``open`` and ``mkdir``
would give them. A temporary path is named ``.<target>.<pid>.<random>.tmp`` after the process writing it; a process
killed mid-save leaves it behind, and the next save or load of the same target removes it once that process is gone
(:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write_file", "atomic_write_dir", "recover_dir", "remove_stale_temporaries", "remove_dir",
           "umask", "check_torch_file", "load_torch_file"]

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
    """fsync every file below ``path`` and give every file and folder the mode the umask gives (some writers,
    safetensors among them, create their files 0600 whatever the umask)."""
    mask = umask()
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            continue
        if p.is_file():
            os.chmod(p, (0o666 | (p.stat().st_mode & 0o111)) & ~mask)
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            os.chmod(p, 0o777 & ~mask)
    _fsync_dir(path)


def umask() -> int:
    """The process's file-mode creation mask (read from /proc where it can be, without changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # pragma: no cover - platforms without /proc
    os.umask(mask)
    return mask


#: names of the temporary paths this process is writing right now (those of a dead writer are stale)
_ACTIVE: set[str] = set()


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _writer_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    try:  # a killed child that was not reaped yet is a zombie: it writes nothing any more
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and directories a killed save of ``path`` left beside it
    (``.<name>.<pid>.<random>.tmp`` whose writer process is gone); returns what was removed."""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[a-z0-9_]+\.tmp$")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None:
            continue
        pid = int(m.group(1))
        stale = entry.name not in _ACTIVE if pid == os.getpid() else not _writer_alive(pid)
        if not stale:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed


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
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
    _ACTIVE.add(os.path.basename(tmp))
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp gives 0600; a saved file follows the umask like open() does
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
    finally:
        _ACTIVE.discard(os.path.basename(tmp))


@contextlib.contextmanager
def atomic_write_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on a clean exit it replaces ``path`` atomically.

    Files already in ``path`` that the new content does not write are not carried over: the new directory is
    exactly what was written inside the block.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent))
    _ACTIVE.add(tmp.name)
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp gives 0700; the saved folder follows the umask like mkdir
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
    finally:
        _ACTIVE.discard(tmp.name)


def recover_dir(path: str | os.PathLike) -> Path:
    """Finish a directory swap that a killed process left half done (only reachable without ``renameat2``) and
    remove the temporaries of killed saves of ``path`` (:func:`remove_stale_temporaries`)."""
    path = Path(path)
    old = path.with_name(path.name + ".old")
    if not path.exists() and old.is_dir():
        os.rename(old, path)
    remove_stale_temporaries(path)
    return path


def check_torch_file(path: str | os.PathLike) -> Path:
    """Cheap checks that ``path`` can be a ``torch.save`` file (without reading it): it exists, is not empty, starts
    as a zip archive or a pickle does and, for a zip archive, its directory (at the end of the file) is intact, so
    a truncated file is found here. Raises ``FileNotFoundError`` or a ``ValueError`` naming the file."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise ValueError(f"{path} is empty (a save that never finished?)")
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path):
                pass
        except (zipfile.BadZipFile, OSError) as e:
            raise ValueError(f"{path} is damaged or truncated (its zip directory cannot be read: {e})") from None
    elif head[:1] != b"\x80":
        raise ValueError(f"{path} is not a PyTorch file (it is neither a zip archive nor a pickle): damaged, or "
                         f"another format")
    return path


def load_torch_file(path: str | os.PathLike, **kwargs):
    """``torch.load(path, map_location="cpu", weights_only=True)`` whose errors name the file and say what is wrong
    with it: missing, empty, truncated or damaged, not a PyTorch file at all, or holding objects that
    ``weights_only`` refuses. Raises ``FileNotFoundError`` or ``ValueError``."""
    import pickle

    import torch

    path = check_torch_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        first = next((s.strip() for s in str(e).splitlines() if s.strip()), type(e).__name__)
        if "GLOBAL" in str(e) or "Unsupported global" in str(e):
            raise ValueError(f"{path} holds objects that torch.load(weights_only=True) does not load ({first})") \
                from None
        raise ValueError(f"{path} is damaged or truncated ({first})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        first = next((s.strip() for s in str(e).splitlines() if s.strip()), type(e).__name__)
        raise ValueError(f"{path} is damaged or truncated ({type(e).__name__}: {first})") from None


def remove_dir(path: str | os.PathLike) -> None:
    """Delete the directory ``path``: it is first renamed to a temporary name beside it (one rename, so it is gone
    from ``path`` at once), then removed; a process killed in between leaves a temporary that
    :func:`remove_stale_temporaries` clears."""
    path = Path(path)
    if not path.exists():
        return
    doomed = path.with_name(f"{_tmp_prefix(path)}removed.tmp")
    os.rename(path, doomed)
    _ACTIVE.add(doomed.name)
    try:
        shutil.rmtree(doomed)
    finally:
        _ACTIVE.discard(doomed.name)
