"""Errors a user causes and can fix: a typo in a config, a missing or damaged file, a run directory that is in use.

Library code raises :class:`UsageError` (a ``ValueError``, so ``except ValueError`` keeps working) with a one-line
message that names the file, the config key or the argument at fault. The ``diffattn`` command prints such an error
as one line, ``diffattn: error: …``, and exits with status 2 (:func:`diffattn.cli.main`); everything else is a bug
and keeps its traceback. Leaf module: it imports nothing from diffattn.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterable, Iterator

__all__ = ["UsageError", "RunExistsError", "user_input", "yaml_error", "one_line", "is_user_error",
           "did_you_mean"]


class UsageError(ValueError):
    """A mistake the user can fix; the message is one line naming the file, key or argument."""


class RunExistsError(UsageError):
    """``diffattn train`` into a directory that already holds a run, without ``--resume`` or ``--overwrite``."""


@contextlib.contextmanager
def user_input(prefix: str = "") -> Iterator[None]:
    """Re-raise a ``ValueError`` raised inside the block as a :class:`UsageError` (``prefix`` + its message).

    For the code that reads what a user gave (a config, files, data): there a ``ValueError`` means the input is
    wrong, not the library. Errors that are already ``UsageError`` pass through unchanged."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(f"{prefix}{e}") from e


def yaml_error(path: str | os.PathLike, err: Exception) -> UsageError:
    """A :class:`UsageError` for a YAML syntax error in ``path``, naming the file, line and column (1-based)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{os.fspath(path)}:{mark.line + 1}:{mark.column + 1}" if mark is not None else os.fspath(path)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    return UsageError(f"{where}: invalid YAML: {problem}" + (f" ({context})" if context else ""))


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (its lines joined with '; ')."""
    text = str(err)
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    return "; ".join(lines) or type(err).__name__


def is_user_error(err: BaseException) -> bool:
    """Whether the ``diffattn`` command reports ``err`` as one line (exit 2) rather than a traceback:
    :class:`UsageError`, and the file-system errors a user's path causes (a missing file or data set,
    a file where a folder is needed, no permission)."""
    return isinstance(err, (UsageError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
                            FileExistsError))


def did_you_mean(name: object, choices: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'a' or 'b'?"`` for the ``choices`` closest to a mistyped ``name``
    (:func:`difflib.get_close_matches`, cutoff 0.6), else ``""``: the tail of an "unknown name" message."""
    close = difflib.get_close_matches(str(name), list(choices), n=n, cutoff=0.6)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    return "; did you mean " + (quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]) + "?"
