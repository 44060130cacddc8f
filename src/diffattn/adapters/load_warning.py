"""The warning when a checkpoint of a retrofitted transformers model is loaded into a plain model.

transformers reports checkpoint keys the model does not have on its loading logger; a filter attached by
:func:`install_load_warning` turns the report of dropped ``diff_adapter`` weights into a
:class:`RetrofitCheckpointWarning`. A leaf of :mod:`diffattn.adapters`: the retrofit (``core``) and the loaders
(``hf``) both attach it, and neither imports the other for it.
"""

from __future__ import annotations

import contextvars
import logging
import warnings

from .binding import ADAPTER_ATTR

__all__ = ["RetrofitCheckpointWarning", "install_load_warning"]

#: loggers transformers (4.5x and 5.x) reports unexpected checkpoint keys on
_LOAD_LOGGERS = ("transformers.modeling_utils",)
_loading_retrofit: contextvars.ContextVar[bool] = contextvars.ContextVar("diffattn_loading_retrofit", default=False)


class RetrofitCheckpointWarning(UserWarning):
    """A checkpoint of a retrofitted model was loaded into a model without the retrofit: its adapter weights were
    dropped and the model computes the pretrained (non-differential) attention."""


class _DroppedAdapterFilter(logging.Filter):
    """Turns transformers' report of unexpected ``diff_adapter`` keys into a :class:`RetrofitCheckpointWarning`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is transformers' business
            return True
        if f".{ADAPTER_ATTR}." not in msg:
            return True
        if _loading_retrofit.get():  # from_pretrained_retrofit checks these keys itself
            return False
        text = ("this checkpoint was saved from a model retrofitted with differential attention (diffattn): the "
                "model just loaded DROPPED its diff_adapter weights and computes the pretrained attention instead. "
                "Load it with diffattn.from_pretrained_retrofit(path).")
        warnings.warn(text, RetrofitCheckpointWarning, stacklevel=_caller_level())
        record.msg, record.args = f"{msg}\n[diffattn] {text}", None
        return True


def _caller_level() -> int:
    """The ``stacklevel`` that points the warning at the user's ``from_pretrained`` call (outside logging and
    transformers), so that the warning shows once per call site."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == __name__ or name == "logging" or name.startswith(("logging.", "transformers.",
                                                                          "huggingface_hub."))):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def install_load_warning() -> None:
    """Attach the filter that warns when a retrofitted checkpoint is loaded into a plain model (idempotent; done by
    :func:`diffattn.retrofit` of a transformers model and by the functions that load transformers checkpoints,
    never by an import)."""
    for name in _LOAD_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DroppedAdapterFilter) for f in logger.filters):
            logger.addFilter(_DroppedAdapterFilter())
