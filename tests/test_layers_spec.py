"""Attention kinds as registered units: each layer class owns its kind and Config; the rest of the library asks the
class, never the kind's name; a kind added from outside the library runs through a model, an override, a save and
load, the logit diagnostics and ``inspect``."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch

import diffattn
from diffattn.diagnostics import capture_logits, logit_layers
from diffattn.layers import ATTENTION_TYPES, Attention, AttentionSpec, attention_kind, register_attention
from diffattn.layers.spec import HEAD_LAYOUTS, check_positive_float

SRC = Path(__file__).resolve().parents[1] / "src" / "diffattn"


# ------------------------------------------------------------------ no kind names outside layers/ and convert/

def _constants(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def kind_comparisons(source: str, kinds: set[str]) -> list[str]:
    """The comparisons in ``source`` (``==``, ``!=``, ``in``, ``not in``) with a string literal, or a literal
    tuple/list/set of them, that is an attention kind's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = _constants(node.left).union(*(_constants(c) for c in node.comparators))
            if names & kinds:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_kind_comparison():
    kinds = set(ATTENTION_TYPES)
    assert kind_comparisons("if spec.kind == 'grouped': pass", kinds) == ["1: spec.kind == 'grouped'"]
    assert kind_comparisons("x = k in ('diff', 'gated')", kinds) == ["1: k in ('diff', 'gated')"]
    assert kind_comparisons("x = layer.head_layout == 'paired'", kinds) == []


def test_no_comparison_with_an_attention_kind_name_outside_layers_and_convert():
    """The kinds live in their layer classes (layers/) and the released layouts' converters (convert/) name the
    kinds they map; everything else asks the class (``title``, ``differential``, ``head_layout``, …)."""
    kinds = set(ATTENTION_TYPES)
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("layers/", "convert/")):
            continue
        hits = kind_comparisons(path.read_text(encoding="utf-8"), kinds)
        if hits:
            found[rel] = hits
    assert found == {}


# --------------------------------------------------------------------------------- every kind is a unit

@pytest.mark.parametrize("kind", ["standard", "diff", "gated", "diff_v2", "grouped", "stable_audio"])
def test_each_kind_owns_its_config_and_its_class_answers_for_it(kind):
    cls = ATTENTION_TYPES[kind]
    spec = AttentionSpec(kind)
    assert type(spec) is cls.Config and spec.kind == kind and spec.layer_class is cls
    assert cls.kind == kind and isinstance(cls.title, str) and cls.head_layout in HEAD_LAYOUTS
    assert isinstance(cls.differential, bool) and cls.differential == (kind != "standard")
    layer = spec.build(64, 4)
    assert type(layer) is cls and attention_kind(layer) == kind and layer.config == spec
    assert AttentionSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match=f"{cls.__name__} takes a config of attention kind '{kind}'"):
        cls(64, 4, AttentionSpec("standard" if kind != "standard" else "diff"))


def test_registering_a_kind_needs_its_own_config():
    class NoConfig(Attention):
        kind = "no_config"

    with pytest.raises(TypeError, match="NoConfig must declare its own Config"):
        register_attention(NoConfig)
    assert "no_config" not in ATTENTION_TYPES
    with pytest.raises(ValueError, match="attention kind 'diff' is already registered by DiffAttention"):
        register_attention(type("Other", (ATTENTION_TYPES["diff"],), {"kind": "diff", "Config":
                                                                       ATTENTION_TYPES["diff"].Config}))


# ------------------------------------------------------------------------ a kind added from outside the library

class TemperedAttention(Attention):
    """Standard attention with its logits divided by a temperature T: softmax(Q Kᵀ / (T √d)) V (a kind defined
    here, as a user would, to run a new kind through the library)."""

    kind = "tempered"
    title = "tempered"

    @dataclasses.dataclass(frozen=True)
    class Config(AttentionSpec):
        kind: str = "tempered"
        temperature: float = 1.0

        def __post_init__(self) -> None:
            super().__post_init__()
            check_positive_float("attention temperature", self.temperature)

    def __init__(self, dim, num_heads, config=None, *, depth=0, **settings):
        config = self.resolve_config(config, settings)
        super().__init__(dim, num_heads, config, depth=depth)
        self.scale = self.head_dim**-0.5 / config.temperature


@pytest.fixture
def tempered():
    register_attention(TemperedAttention)
    yield TemperedAttention
    del ATTENTION_TYPES["tempered"]


def _reference(model, x, temperature: float) -> torch.Tensor:
    """The same model with standard attention and q_proj scaled by 1/T: what tempered attention computes."""
    ref = diffattn.create_model("vit_nano", img_size=32, num_classes=10).double().eval()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    for k in list(sd):
        if ".attn.q_proj." in k:
            sd[k] = sd[k] / temperature
    ref.load_state_dict(sd)
    return ref(x)


def test_a_kind_added_from_a_test_module_runs_through_a_model_and_its_overrides(tempered):
    torch.manual_seed(0)
    model = diffattn.create_model("vit_nano", img_size=32, num_classes=10,
                                  attention={"kind": "tempered", "temperature": 2.0}).double().eval()
    assert type(model.blocks[0].attn) is tempered and model.attention_spec == AttentionSpec("tempered",
                                                                                           temperature=2.0)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(model(x), _reference(model, x, 2.0), rtol=1e-12, atol=1e-12)
    spec = model.attention_spec
    for field in dataclasses.fields(spec):  # overriding one setting changes that setting only
        if field.name in ("kind", "temperature"):
            continue
        value = {"num_kv_heads": 1, "qkv_bias": False, "out_bias": False, "causal": True, "attn_drop": 0.1,
                 "proj_drop": 0.1, "backend": "math", "rope": "half", "rope_theta": 500.0, "softcap": 30.0,
                 "sliding_window": 4}[field.name]
        assert spec.updated({field.name: value}) == dataclasses.replace(spec, **{field.name: value})
    assert spec.updated({"temperature": 3.0}).temperature == 3.0 and spec.updated({"kind": "diff"}).kind == "diff"
    with pytest.raises(ValueError, match="attention temperature must be a finite float > 0, got -1"):
        AttentionSpec("tempered", temperature=-1)
    with pytest.raises(ValueError, match=r"kind 'diff' has no setting temperature \(a setting of kind 'tempered'\)"):
        AttentionSpec("diff", temperature=2.0)


def test_a_kind_added_from_a_test_module_saves_loads_and_is_diagnosed(tempered, tmp_path):
    torch.manual_seed(0)
    lm = diffattn.models.CausalLM(vocab_size=50, dim=32, depth=2, num_heads=2, max_seq_len=32,
                                  attention=AttentionSpec("tempered", temperature=2.0, causal=True, rope="half"))
    lm.eval()
    ids = torch.randint(0, 50, (1, 12))
    lm.save_pretrained(tmp_path / "lm")
    loaded = diffattn.from_pretrained(tmp_path / "lm").eval()
    assert loaded.attention_spec == lm.attention_spec
    torch.testing.assert_close(loaded(ids), lm(ids), rtol=0, atol=0)

    assert [(n, k) for n, _, k in logit_layers(lm)] == [("blocks.0.attn", "tempered"), ("blocks.1.attn", "tempered")]
    with capture_logits(lm) as cap:
        lm(ids)
    layer = lm.blocks[0].attn
    q = layer.q_proj(lm.blocks[0].norm1(lm.tok_embed(ids)))  # the logits the layer's softmax saw, by hand
    k = layer.k_proj(lm.blocks[0].norm1(lm.tok_embed(ids)))
    q, k = (t.view(1, 12, 2, 16).transpose(1, 2) for t in (q, k))
    cos, sin = layer.rotary(torch.arange(12), dtype=q.dtype)
    from diffattn.layers import apply_rotary
    q, k = apply_rotary(q, cos, sin, "half"), apply_rotary(k, cos, sin, "half")
    want = q @ k.transpose(-1, -2) / (2.0 * math.sqrt(16))
    torch.testing.assert_close(cap.layers[0]["logits"][0], want.detach(), rtol=1e-5, atol=1e-5)

    from diffattn.eval.inspection import inspect_folder
    summary = inspect_folder(tmp_path / "lm", tmp_path / "inspect", ids=list(range(10)), needle_ids=[40, 41],
                             plots=False)
    assert len(summary["layers"]) == 2 and summary["layers"][0]["kind"] == "tempered"
