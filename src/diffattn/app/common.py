"""What more than one command uses: argparse types that turn a bad value into a one-line usage error naming the
option (:func:`bounded`, :func:`device_type`) and the help of ``--device``."""

from __future__ import annotations

import argparse
import math

from ..errors import UsageError
from ..utils import DEVICE_VALUES, check_device

__all__ = ["bounded", "device_type", "DEVICE_HELP"]

#: what ``--device`` says on ``demo`` and ``study``, as on ``train`` and ``eval``
DEVICE_HELP = ("cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu; CUDA_VISIBLE_DEVICES picks the "
               "GPUs torch sees)")


def bounded(kind: type, minimum: float | None = None, *, strict: bool = False):
    """An argparse ``type`` that parses ``kind`` and rejects values below ``minimum`` (or equal, if ``strict``),
    so a bad number is a one-line usage error naming the option instead of a traceback later."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"needs {kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"needs a finite number, got {text!r}")
        if minimum is not None and (value <= minimum if strict else value < minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def device_type(text: str) -> str:
    """An argparse ``type`` for ``--device``: the spelling check of :func:`diffattn.utils.check_device` as argparse's
    one-line error (the hardware is checked later, by :func:`diffattn.utils.resolve_device`)."""
    try:
        return check_device(text)
    except UsageError:
        raise argparse.ArgumentTypeError(f"must be {DEVICE_VALUES}, got {text!r}") from None
