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

Where a load reads from: a path that looks local (:func:`looks_local`) is read from disk and never sent to the
Hugging Face Hub; a missing one is one line naming it, with the closest names beside it (:func:`missing_path`). Only
a Hub id (``org/name``) goes to the Hub, through :func:`from_hub`: when the Hub cannot be reached the cache answers
at once, without huggingface_hub's five retries with back-off.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import difflib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import UsageError, did_you_mean, one_line

__all__ = ["atomic_write_file", "atomic_write_dir", "recover_dir", "remove_stale_temporaries", "remove_dir",
           "umask", "check_torch_file", "load_torch_file", "looks_local", "missing_path", "local_path", "hub_reachable",
           "from_hub"]

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


# ------------------------------------------------------------------------------------ local paths and Hub ids

#: a Hugging Face Hub repo id: ``name`` or ``org/name`` (letters, digits, ``_``, ``-``, ``.``)
_REPO_ID = re.compile(r"[\w][\w.-]{0,95}(/[\w][\w.-]{0,95})?")


def looks_local(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a path on this machine rather than a Hugging Face Hub repo id: a ``pathlib.Path``,
    anything that exists, starts with ``.``, ``~`` or a separator, is not a repo id's ``name`` or ``org/name``
    (more than one ``/``, a backslash, other characters), or whose first folder exists (``runs/x`` where ``runs/``
    is a folder here). Only an ``org/name`` (or bare ``name``) that names nothing here may be a Hub id."""
    if isinstance(source, os.PathLike):
        return True
    s = str(source)
    if not s or s.startswith((".", "~", "/", os.sep)) or os.path.exists(s):
        return True
    if not _REPO_ID.fullmatch(s) or ".." in s or "--" in s or s.endswith((".", "-")):
        return True
    return "/" in s and os.path.isdir(s.split("/")[0])


def _nearest(path: str | os.PathLike) -> str:
    """``"; did you mean …?"`` with the closest existing names for the first missing part of ``path``, looked up in
    the deepest folder above it that exists (the rest of ``path`` kept), else ``""``."""
    shown = Path(os.fspath(path))
    real = shown.expanduser()
    tail: list[str] = []
    while not real.exists() and real != real.parent and shown != shown.parent:
        tail.append(real.name)
        real, shown = real.parent, shown.parent
    if not tail or not real.is_dir():
        return ""
    try:
        names = [c.name for _, c in zip(range(10000), real.iterdir()) if not c.name.startswith(".")]
    except OSError:
        return ""
    close = difflib.get_close_matches(tail[-1], names, n=3, cutoff=0.6)
    return did_you_mean(os.fspath(path), [str(shown.joinpath(c, *reversed(tail[:-1]))) for c in close])


def missing_path(path: str | os.PathLike, what: str, needs: str = "") -> FileNotFoundError:
    """The one-line error for a local ``path`` that does not exist: ``"{what} 'path' does not exist; did you mean
    …?; {needs}"``, the suggestions taken from the names beside it."""
    return FileNotFoundError(f"{what} {os.fspath(path)!r} does not exist{_nearest(path)}" + (f"; {needs}" if needs
                                                                                              else ""))


def local_path(source: str | os.PathLike, what: str, needs: str = "") -> Path | None:
    """The existing local path ``source`` names (``~`` expanded); None for a Hub id (:func:`looks_local`); a
    local-looking path that does not exist raises :func:`missing_path`'s error."""
    if not looks_local(source):
        return None
    path = Path(os.fspath(source)).expanduser()
    if not path.exists():
        raise missing_path(source, what, needs)
    return path


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub's endpoint answers one request (``HF_ENDPOINT``; no retries, ``timeout``
    seconds at most): a machine without a network says no at once instead of after huggingface_hub's back-off."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().request("HEAD", constants.ENDPOINT, timeout=timeout)
    except Exception:  # noqa: BLE001 - no route, no name, refused, timed out: all mean unreachable
        return False
    return True


def from_hub(download: Callable[..., str], repo_id: str, what: str, **kwargs) -> Path:
    """``download(repo_id, **kwargs)`` (huggingface_hub's ``hf_hub_download`` or ``snapshot_download``) as a Path.

    Offline (``HF_HUB_OFFLINE``, ``local_files_only=True``, or an endpoint that does not answer one request,
    :func:`hub_reachable`) the hub's cache answers at once; a miss there is a one-line ``FileNotFoundError``, and
    any other failure of the Hub (no such repo, no access, no such file) a one-line
    :class:`~diffattn.errors.UsageError`, both naming ``what`` and ``repo_id``."""
    from huggingface_hub import constants

    reason = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "local_files_only=True"
              if kwargs.get("local_files_only") else None)
    if reason is None and not hub_reachable():
        reason = f"{constants.ENDPOINT} cannot be reached"
    try:
        return Path(download(repo_id, **({**kwargs, "local_files_only": True} if reason else kwargs)))
    except Exception as e:  # noqa: BLE001 - the hub's many error types: one line naming the id
        if reason is not None:
            raise FileNotFoundError(f"{what} {repo_id!r} is neither a local path nor in the Hugging Face Hub's cache, "
                                    f"and the Hub was not asked ({reason}){_nearest(repo_id)}") from None
        raise UsageError(f"{what} {repo_id!r} is not a local path, and the Hugging Face Hub did not give it "
                         f"({type(e).__name__}: {one_line(e).split('; ')[0]}){_nearest(repo_id)}") from None
