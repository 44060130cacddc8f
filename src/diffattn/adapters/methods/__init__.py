"""The math of every retrofit: one adapter module per retrofitted attention layer.

Per standard head of width d (h query heads, model width D), with the pretrained W_q, W_k, W_v, W_o kept:

| method          | second branch                        | output                                    | new params |
|-----------------|--------------------------------------|-------------------------------------------|------------|
| ``daa``         | A2 = A(Q W_daa, K), W_daa (h, d, d)  | (A1 − λ(t) A2) V                          | D²/h (+1)  |
| ``dex``         | none                                 | (A1 V)(I − λ(t) W_dex), W_dex (h, d, d)   | D²/h (+1)  |
| ``diffq``       | Q2 = (X W_dq) W_q, W_dq (D, D)       | (A(Q1, K) − λ(t) A(Q2, K)) V              | D² (+1)    |
| ``diffk``       | K2 = (X W_dk) W_k, W_dk (D, D)       | (A(Q, K1) − λ(t) A(Q, K2)) V              | D² (+1)    |
| ``diffv``       | V2 = (X W_dv) W_v, W_dv (D, D)       | A (V1 − λ(t) V2)                          | D² (+1)    |
| ``shared_qk``   | A2 = A1                              | (1 − λ_init)·RMSNorm((A1 − λ A1) V)        | 4d + d     |
| ``split_heads`` | Q/K channels of a head in 2 groups   | (1 − λ_init)·RMSNorm((A1 − λ A2) V)       | 2d + d     |

DAA (2025): eq. 3 for λ(t), eq. 4 for DAA, eq. 11 for DEX (after Kong et al. 2025), App. B for the parameter
counts, App. D for the pseudocode (every new matrix is the identity at init). λ(t) is
:class:`diffattn.lambdas.AnnealedLambda`: λ(0) = 0, so at step 0 the layer computes the pretrained function exactly,
and the (t/T)·λ_init ramp moves it off that point even while every new matrix is still the identity.

Li et al. 2025 (§3.2 "original" = ``split_heads``, §3.3 "proposed" = ``shared_qk``): λ is re-parameterised (Ye et al.
2024 eq. 2, :class:`~diffattn.lambdas.ReparamLambda`), each head output goes through an RMSNorm of the head width and
is scaled by (1 − λ_init). These layers do **not** compute the pretrained function (the RMSNorm alone changes it), so
to keep the library's promise that a retrofit starts from the pretrained model, their output is blended in over the
annealing window: O = (1 − β) O_pretrained + β O_diff, β(t) = min(1, t/T). From t = T on the layer is exactly
Li et al.'s. This blend is our addition, not the paper's.

shared-QK is degenerate, faithfully so: (A1 − λ A1) V = (1 − λ) A1 V, and the RMSNorm that follows removes every
dependence on λ except its sign (Li et al.'s public code has the same property). We implement it as published.

split-heads splits the d channels of each pretrained Q/K head into two groups of d/2 that keep rotary pairs
(channel i and i + d/2 under ``rotate_half`` RoPE) together: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest, so each
branch's scores stay functions of relative position. Scale: the model's scale × √2 (the width halves); λ vectors
have the branch width d/2 (Ye et al. 2024); V keeps width d.

DAA applies W_daa to the query **before** rotary embedding (when the model has one), so A2 stays a function of
relative positions; at init both orders agree.

Every method computes its attention with :func:`diffattn.functional.diff_attention` or
:func:`diffattn.functional.attention` (:mod:`.ops`, called from :func:`run_method`), so masks, grouped-query
attention, fully masked rows and the backends (SDPA, the fused Triton kernel on CUDA) have one implementation. A
float64 model computes in float64 throughout, λ included; lower precisions keep λ in float32.

Layout: one module per method (:mod:`.daa`, :mod:`.dex`, :mod:`.diffq`, :mod:`.diffk`, :mod:`.diffv`,
:mod:`.shared_qk`, :mod:`.split_heads`), each one :class:`RetrofitMethod` class registered by name
(:func:`register_method`); :mod:`.base` holds the protocol, the two schedules and the registry, :mod:`.adapter` the
:class:`RetrofitAdapter` module and the calls the bindings make (:func:`second_branch`, :func:`run_method`), which
dispatch through the registry. A new method is one module registered the same way: in the user's own code, or a new
file in this package, which is found and imported without editing any other file (docs/design.md, "How to extend").
"""

from __future__ import annotations

import importlib
import pkgutil

from ...deprecations import moved_attribute
from .adapter import MAX_STEP, RetrofitAdapter, branch_maps, run_method, second_branch
from .base import (
    AnnealedMethod,
    BlendedMethod,
    Branches,
    InputMethod,
    RetrofitMethod,
    build_method,
    list_methods,
    method_class,
    register_method,
    unregister_method,
)
from .ops import MASKED_ROWS, split_channels

__all__ = [
    "METHODS",
    "METHOD_MODULES",
    "ANNEALED_METHODS",
    "BLENDED_METHODS",
    "INPUT_METHODS",
    "MASKED_ROWS",
    "MAX_STEP",
    "RetrofitAdapter",
    "RetrofitMethod",
    "AnnealedMethod",
    "BlendedMethod",
    "InputMethod",
    "Branches",
    "register_method",
    "unregister_method",
    "build_method",
    "method_class",
    "list_methods",
    "run_method",
    "branch_maps",
    "second_branch",
    "split_channels",
]

# Every module of this package but the shared ones is a method: importing it registers it. The papers' methods come
# first, in the papers' order, then any other module in name order, so a method shipped with diffattn is one new file.
# (tests/test_layering.py counts this discovery as an import of every module of the package.)
_PAPER_ORDER = ("daa", "dex", "diffq", "diffk", "diffv", "shared_qk", "split_heads")
_SHARED = {"adapter", "base", "ops"}
_found = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _SHARED and not m.name.startswith("_"))
#: the method modules this package ships, in the order they are registered
METHOD_MODULES = tuple(f"{__name__}.{n}" for n in (*(n for n in _PAPER_ORDER if n in _found),
                                                   *(n for n in _found if n not in _PAPER_ORDER)))
for _module in METHOD_MODULES:
    importlib.import_module(_module)

#: the methods this package ships (one module each), registered in this order; :func:`list_methods` also names
#: those registered later from other modules
METHODS = list_methods()
#: methods with the annealed λ(t) of DAA (2025) eq. 3 (DEX: Kong et al. 2025)
ANNEALED_METHODS = tuple(m for m in METHODS if not method_class(m).blended)
#: methods of Li et al. 2025, re-parameterised λ and per-head RMSNorm, blended in by β(t)
BLENDED_METHODS = tuple(m for m in METHODS if method_class(m).blended)
#: which projection input a method transforms: X' = X W_d{q,k,v} (DAA (2025) App. D.2)
INPUT_METHODS = {m: method_class(m).which for m in METHODS if issubclass(method_class(m), InputMethod)}

#: old names of the method groups, kept as aliases that warn (rows of :data:`diffattn.deprecations.DEPRECATIONS`)
_RENAMED = {"SEED001_METHODS": "ANNEALED_METHODS", "SEED002_METHODS": "BLENDED_METHODS"}

__getattr__ = moved_attribute(__name__, {old: (lambda new=new: globals()[new]) for old, new in _RENAMED.items()})
