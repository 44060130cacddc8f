"""The kinds of model ``diffattn eval`` evaluates, one module each (:mod:`.vit`, :mod:`.clip`, :mod:`.lm`), each
declaring its :class:`EvalKind` (:mod:`.base`); this package registers them into :data:`EVAL_KINDS`, the one table
of kinds, and :func:`kind_of` finds the kind of a loaded model. A new kind is a new module here, registered below
(or, outside the package, one :func:`register_eval_kind` call).
"""

from .base import EVAL_KINDS, EvalContext, EvalKind, get_eval_kind, kind_of, register_eval_kind
from .clip import CLIP
from .lm import LM
from .vit import VIT

__all__ = ["EVAL_KINDS", "EvalContext", "EvalKind", "register_eval_kind", "get_eval_kind", "kind_of", "VIT", "CLIP",
           "LM"]

for _kind in (VIT, CLIP, LM):  # the order of the report's sections and of --dataset's messages
    register_eval_kind(_kind)
