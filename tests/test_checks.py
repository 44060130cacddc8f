"""The checks of one setting's value (diffattn.checks): what each accepts, the message naming the setting, what it
got and what it needs, and that the module is a leaf every config can import."""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from pathlib import Path

import pytest

import diffattn.checks as checks
from diffattn.checks import check_flag, check_positive_float, check_positive_int, check_probability, is_int


def test_is_int_excludes_bools_and_floats():
    assert is_int(0) and is_int(-3) and is_int(10**20)
    assert not any(is_int(v) for v in (True, False, 1.0, "1", None, Fraction(1)))


@pytest.mark.parametrize(("check", "kwargs", "good", "bad", "need"), [
    (check_flag, {}, (True, False), (1, 0, "yes", None), "a bool"),
    (check_positive_int, {}, (None, 1, 4096), (0, -1, 1.0, True, "2"), "None or an integer >= 1"),
    (check_positive_int, {"optional": False}, (1, 7), (None, 0, 2.0), "an integer >= 1"),
    (check_positive_float, {}, (1e-9, 2, 0.5, Fraction(1, 3)), (None, 0, -1.0, math.inf, math.nan, True, "1"),
     "a finite float > 0"),
    (check_positive_float, {"optional": True}, (None, 30.0), (0.0, -2), "None or a finite float > 0"),
    (check_probability, {}, (0, 0.0, 0.5, 0.999), (1.0, -0.1, math.nan, None, False, "0.1"), "a float in [0, 1)"),
])
def test_each_check_accepts_what_it_needs_and_names_the_setting_otherwise(check, kwargs, good, bad, need):
    for v in good:
        check("attention x", v, **kwargs)
    for v in bad:
        with pytest.raises(ValueError) as e:
            check("attention x", v, **kwargs)
        assert str(e.value) == f"attention x must be {need}, got {v!r}"


def test_the_configs_messages_keep_their_owner():
    from diffattn.layers import AttentionSpec
    from diffattn.models.config import check_args

    with pytest.raises(ValueError, match=r"^attention causal must be a bool, got 'no'$"):
        AttentionSpec("diff", causal="no")
    with pytest.raises(ValueError, match=r"^attention attn_drop must be a float in \[0, 1\), got 1\.0$"):
        AttentionSpec("standard", attn_drop=1.0)
    with pytest.raises(ValueError, match=r"^ViT: drop_rate must be a float in \[0, 1\), got 1$"):
        check_args("ViT", drop_rate=1)


def test_checks_is_a_leaf():
    """It imports nothing from diffattn, so that any config (layers, models, train) can use it."""
    tree = ast.parse(Path(checks.__file__).read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m == "" or m.startswith("diffattn")], imported
    assert all(not m.startswith(".") for m in imported)
    assert set(checks.__all__) == {"is_int", "check_flag", "check_positive_int", "check_positive_float",
                                   "check_probability"}
