"""AttentionSpec: one value for a model's attention, validated once, built into every family's layers; the loose
keyword arguments of before build the same models through one deprecation path, and config.json files of before
load as they did; λ_init's default is defined once."""

import ast
import dataclasses
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import diffattn
import diffattn.adapters as A
from diffattn.lambdas import DEFAULT_LAMBDA_INIT
from diffattn.layers import (
    Attention,
    AttentionSpec,
    Block,
    DiffAttention,
    DiffAttentionV2,
    GatedDiffAttention,
    GroupedDiffAttention,
    LooseAttention,
)
from diffattn.layers.blocks import LOOSE_KEYWORDS
from diffattn.models.causal_lm import CausalLM, LMBlock
from diffattn.models.clip import CLIP, TextTransformer
from diffattn.models.motif import MotifLM
from diffattn.models.registry import model_family
from diffattn.models.text import TextClassifier
from diffattn.models.vit import VisionTransformer
from diffattn.models.vlm import VisionLanguageModel

VIT = dict(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=4)


def _seeded(build, seed=0):
    torch.manual_seed(seed)
    return build().eval()


def test_default_lambda_init_is_defined_once():
    assert DEFAULT_LAMBDA_INIT == 0.8
    assert AttentionSpec("diff").lambda_init == DEFAULT_LAMBDA_INIT
    for layer in (DiffAttention, GatedDiffAttention, DiffAttentionV2, GroupedDiffAttention):
        assert {f.name: f.default for f in dataclasses.fields(layer.Config)}["lambda_init"] is DEFAULT_LAMBDA_INIT
    assert "lambda_init" not in AttentionSpec.settings_of("standard")
    for owner in (A.RetrofitAdapter, A.retrofit):
        assert inspect.signature(owner).parameters["lambda_init"].default is DEFAULT_LAMBDA_INIT, owner
    assert A.RetrofitConfig("daa").lambda_init == DEFAULT_LAMBDA_INIT


@pytest.mark.parametrize("kw, message", [
    (dict(kind="linear"),
     "attention kind must be one of \\('standard', 'diff', 'gated', 'diff_v2', 'grouped', 'stable_audio', 'gdla'\\), "
     "got 'linear'"),
    (dict(kind="diff", lambda_init="depth"), "lambda_init must be a finite float or 'ye', got 'depth'"),
    (dict(kind="diff", lambda_init=float("nan")), "lambda_init must be a finite float"),
    (dict(kind="diff", lambda_form="cosine"), "lambda_form must be None or one of \\('reparam'"),
    (dict(kind="diff", lambda_options=[1]), "lambda_options must be a dict or None, got list"),
    (dict(kind="standard", backend="triton"), "backend='triton' is for differential attention"),
    (dict(kind="diff", backend="flash"), "backend must be one of \\('auto', 'math', 'sdpa', 'triton'\\)"),
    (dict(kind="diff", q_residual=True), "kind 'diff' has no setting q_residual \\(a setting of kind 'gated'\\)"),
    (dict(kind="diff", gate_bias=False), "kind 'diff' has no setting gate_bias \\(a setting of kind 'gated'\\)"),
    (dict(kind="diff", head_dim=16), "kind 'diff' has no setting head_dim \\(a setting of kind 'diff_v2', 'grouped'"),
    (dict(kind="standard", lambda_init=0.5), "kind 'standard' has no setting lambda_init"),
    (dict(kind="diff", attn_drop=1.0), "attention attn_drop must be a float in \\[0, 1\\), got 1.0"),
    (dict(kind="diff", sub_norm="yes"), "attention sub_norm must be a bool, got 'yes'"),
    (dict(kind="diff", rope="full"), "rope must be None or one of \\('half', 'interleaved'\\), got 'full'"),
    (dict(kind="diff", num_kv_heads=0), "attention num_kv_heads must be None or an integer >= 1, got 0"),
    (dict(kind="diff", softcap=-1.0), "attention softcap must be None or a finite float > 0, got -1.0"),
])
def test_spec_validates_once_naming_the_setting(kw, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec(**kw)


def test_spec_lambda_init_type_is_a_type_error():
    with pytest.raises(TypeError, match="lambda_init must be a finite float or 'ye', got bool True"):
        AttentionSpec("diff", lambda_init=True)


def test_spec_json_round_trip_and_unknown_keys():
    spec = AttentionSpec("gated", lambda_init="ye", lambda_options={"bias": False}, q_residual=True, backend="math")
    d = spec.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert AttentionSpec.from_dict(d) == spec
    assert AttentionSpec("diff", lambda_init=1).lambda_init == 1.0
    assert isinstance(AttentionSpec("diff", lambda_init=1).lambda_init, float)
    # a dict saved when every kind held every setting: the settings this kind never read are dropped
    old = {**AttentionSpec("standard").to_dict(), "lambda_init": 0.8, "lambda_form": None, "sub_norm": None,
           "sub_norm_eps": 1e-5, "q_residual": False, "head_dim": None, "num_noise_heads": None}
    assert AttentionSpec.from_dict(old) == AttentionSpec("standard")
    with pytest.raises(ValueError, match="unknown AttentionSpec settings \\['lamda_init'\\]"):
        AttentionSpec.from_dict({"kind": "diff", "lamda_init": 0.5})


@pytest.mark.parametrize("kind, cls, extra", [
    ("standard", Attention, {}), ("diff", DiffAttention, {}), ("gated", GatedDiffAttention, {"q_residual": True}),
    ("diff_v2", DiffAttentionV2, {"head_dim": 8}),
])
def test_build_is_the_layer_class(kind, cls, extra):
    if kind != "standard":
        extra = {"lambda_init": "ye", **extra}
    spec = AttentionSpec(kind, backend="math", **extra)
    layer = _seeded(lambda: spec.build(32, 4, depth=2))
    ref = _seeded(lambda: cls(32, 4, depth=2, backend="math", **extra))
    assert layer.config == spec and _seeded(lambda: cls(32, 4, spec, depth=2)).config == spec
    assert type(layer) is cls
    if kind != "standard":
        assert layer.lambda_init == pytest.approx(0.8 - 0.6 * torch.exp(torch.tensor(-0.6)).item())
    x = torch.randn(2, 5, 32)
    sd, ref_sd = layer.state_dict(), ref.state_dict()
    assert sd.keys() == ref_sd.keys() and all(torch.equal(sd[k], ref_sd[k]) for k in sd)
    torch.testing.assert_close(layer(x), ref(x), atol=0, rtol=0)


def test_block_takes_a_spec_or_the_loose_arguments():
    spec = AttentionSpec("gated", lambda_init="ye", q_residual=True, attn_drop=0.1, proj_drop=0.2, causal=True)
    a = _seeded(lambda: Block(32, 4, depth=1, attention=spec, drop=0.2))
    with pytest.warns(FutureWarning, match="Block: attention='gated', attn_drop, causal, lambda_init, q_residual "
                                           "\\(the loose spelling.*removed in diffattn 0.3.0; use attention="):
        b = _seeded(lambda: Block(32, 4, depth=1, attention="gated", lambda_init="ye", q_residual=True, attn_drop=0.1,
                                  drop=0.2, causal=True))
    assert a.attn.causal and a.attn.q_residual and a.attn.attn_drop == 0.1 and a.attn.proj_drop.p == 0.2
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="Block: attention is an AttentionSpec, .* got \\['backend', 'causal'\\]"):
        Block(32, 4, attention=spec, causal=True, backend="math")
    with pytest.raises(ValueError, match="Block: attention is an AttentionSpec, .* got \\['q_residual'\\]"):
        Block(32, 4, attention=spec.to_dict(), q_residual=True)  # even one that agrees: one spelling at a time
    with pytest.raises(ValueError, match="Block: attention must be an AttentionSpec or its dict"):
        Block(32, 4, attention=3)
    with pytest.raises(TypeError, match="Block\\(\\) got unexpected keyword argument\\(s\\) \\['dropp'\\]"):
        Block(32, 4, dropp=0.1)


def _same(a, b, *inputs):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        torch.testing.assert_close(a(*inputs), b(*inputs), atol=0, rtol=0)


def test_families_take_a_spec_or_the_loose_arguments():
    images = torch.randn(2, 3, 16, 16)
    with pytest.warns(FutureWarning, match="VisionTransformer: attention='diff', lambda_init, qkv_bias, sub_norm"):
        loose = _seeded(lambda: VisionTransformer(**VIT, attention="diff", lambda_init="ye", sub_norm=False,
                                                  qkv_bias=False))
    _same(_seeded(lambda: VisionTransformer(**VIT, attention=AttentionSpec("diff", lambda_init="ye", sub_norm=False,
                                                                             qkv_bias=False))), loose, images)
    ids = torch.randint(1, 100, (2, 7))
    text = dict(vocab_size=100, max_len=8, embed_dim=32, depth=2, num_heads=4, drop_rate=0.0)
    with pytest.warns(FutureWarning, match="TextClassifier: attention='gated', q_residual"):
        loose = _seeded(lambda: TextClassifier(**text, attention="gated", q_residual=True))
    _same(_seeded(lambda: TextClassifier(**text, attention=AttentionSpec("gated", q_residual=True))), loose, ids)
    lm = dict(vocab_size=100, dim=32, depth=2, num_heads=4, max_seq_len=16)
    spec = AttentionSpec("diff", lambda_init="ye", num_kv_heads=2, qkv_bias=False, out_bias=False)
    a = _seeded(lambda: CausalLM(**lm, attention=spec))
    assert a.attention_spec.causal and a.attention_spec.rope == "half" and a.attention == "diff"
    with pytest.warns(FutureWarning, match="CausalLM: attention='diff', num_kv_heads"):
        _same(a, _seeded(lambda: CausalLM(**lm, attention="diff", num_kv_heads=2)), ids)
    assert isinstance(a.blocks[0], LMBlock)
    tower = dict(vocab_size=100, context_length=8, embed_dim=32, depth=2, num_heads=4)
    clip_a = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention=AttentionSpec("diff")),
                                  text=dict(tower, attention={"kind": "gated"})))
    with pytest.warns(FutureWarning):
        clip_b = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention="diff"),
                                      text=dict(tower, attention="gated")))
    assert clip_a.text.attention_spec.causal  # the text tower is causal whatever the spec says
    _same(clip_a, clip_b, images, ids)
    with pytest.raises(ValueError, match="CausalLM: attention is an AttentionSpec, .* got \\['lambda_form'\\]"):
        CausalLM(**lm, attention=spec, lambda_form="constant")


def test_registered_models_take_a_spec_and_set_loose_overrides_in_theirs():
    spec = AttentionSpec("gated", q_residual=True, lambda_init="ye")
    model = diffattn.create_model("dg_vit_tiny_patch16_224", attention=spec, img_size=32, depth=2)
    assert model.attention_spec == spec and model.blocks[1].attn.q_residual
    with pytest.warns(FutureWarning) as record:
        model = diffattn.create_model("dg_vit_tiny_patch16_224", lambda_init="ye", img_size=32, depth=2)
    assert model.attention_spec == spec  # the registered spec, with the override in it
    assert [str(w.message) for w in record] == [  # one warning, naming the partial dict that now does the same
        "create_model('dg_vit_tiny_patch16_224'): lambda_init='ye' (the loose spelling of the attention settings) "
        "is deprecated since diffattn 0.2.0 and removed in diffattn 0.3.0; use attention={'lambda_init': 'ye'} (a "
        "partial dict updates the "
        "registered attention; in a recipe: --set model.overrides.attention.lambda_init=ye) instead"]
    assert diffattn.create_model("dg_vit_tiny_patch16_224", attention={"lambda_init": "ye"}, img_size=32,
                                 depth=2).attention_spec == spec


def test_spec_models_save_and_load(tmp_path):
    images = torch.randn(2, 3, 16, 16)
    spec = AttentionSpec("diff", lambda_init="ye", lambda_form="dual_scalar", backend="math")
    model = _seeded(lambda: VisionTransformer(**VIT, attention=spec))
    model.save_pretrained(tmp_path / "vit")
    cfg = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert cfg["attention"] == spec.to_dict()
    loaded = diffattn.from_pretrained(tmp_path / "vit").eval()
    assert loaded.attention_spec == spec
    _same(model, loaded, images)

    ids = torch.randint(1, 100, (2, 8))
    tower = dict(vocab_size=100, context_length=8, embed_dim=32, depth=2, num_heads=4)
    clip = _seeded(lambda: CLIP(embed_dim=16, vision=dict(VIT, attention=spec),
                                text=dict(tower, attention=AttentionSpec("gated", lambda_init=0.5))))
    clip.save_pretrained(tmp_path / "clip")
    loaded = diffattn.from_pretrained(tmp_path / "clip").eval()
    assert loaded.visual.attention_spec == spec and loaded.text.attention_spec.lambda_init == 0.5
    _same(clip, loaded, images, ids)


def test_loose_models_save_their_spec_and_flat_configs_of_before_load(tmp_path):
    with pytest.warns(FutureWarning):
        model = _seeded(lambda: VisionTransformer(**VIT, attention="gated", lambda_init="ye", q_residual=True))
    spec = AttentionSpec("gated", lambda_init="ye", q_residual=True)
    model.save_pretrained(tmp_path / "vit")
    cfg = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert cfg["attention"] == spec.to_dict() and "lambda_init" not in cfg and "q_residual" not in cfg
    # a config.json of before (flat keys) loads silently to the same model
    flat = {k: v for k, v in cfg.items() if k != "attention"}
    flat.update(attention="gated", lambda_init="ye", q_residual=True, qkv_bias=True, attn_drop_rate=0.0,
                backend="auto")
    (tmp_path / "vit" / "config.json").write_text(json.dumps(flat))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = diffattn.from_pretrained(tmp_path / "vit").eval()
    assert loaded.attention_spec == spec
    _same(model, loaded, torch.randn(2, 3, 16, 16))


FAMILIES = [Block, LMBlock, VisionTransformer, TextTransformer, TextClassifier, CausalLM, MotifLM]


@pytest.mark.parametrize("cls", FAMILIES + sorted({f.cls for f in map(model_family, diffattn.list_models())}
                                                  | {c for f in map(model_family, diffattn.list_models())
                                                     for c in f.towers.values()}, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_attention_is_the_only_attention_parameter(cls):
    """No constructor takes a loose attention keyword: the settings are ``attention`` (a spec or its dict), and the
    keywords of before reach the one deprecation path (``cls.LOOSE.convert``) through ``**loose`` alone."""
    params = inspect.signature(cls.__init__).parameters
    spec_fields = {f.name for f in dataclasses.fields(AttentionSpec)} - {"kind"}
    assert not (set(params) & (set(LOOSE_KEYWORDS) | spec_fields)), cls
    var = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    if "attention" in params:  # the model families and their blocks
        assert [p.name for p in var] == ["loose"] and isinstance(cls.LOOSE, LooseAttention)
        assert set(cls.LOOSE.keywords) <= set(LOOSE_KEYWORDS)
        assert params["attention"].default is inspect.Parameter.empty or isinstance(params["attention"].default,
                                                                                    AttentionSpec)
    else:  # multi-tower models: the towers' dicts hold the attention
        assert not var and cls in (CLIP, VisionLanguageModel)
    # the only code that reads the loose keywords is LooseAttention (the constructors hand **loose to resolve)
    source = inspect.getsource(cls.__init__)
    assert not any(f"{k}=" in source.replace("LOOSE", "") for k in LOOSE_KEYWORDS if k != "causal"), cls


@pytest.mark.parametrize("kind", ["standard", "diff", "gated", "diff_v2"])
def test_loose_form_warns_once_and_builds_the_identical_model(kind):
    lm = dict(vocab_size=100, dim=32, depth=2, num_heads=4, max_seq_len=16)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loose = _seeded(lambda: CausalLM(**lm, attention=kind, lambda_init=0.5, num_kv_heads=2, backend="math"))
    assert [type(w.message) for w in record] == [FutureWarning]
    assert "removed in diffattn 0.3.0" in str(record[0].message) and record[0].filename == __file__
    lam = {} if kind == "standard" else {"lambda_init": 0.5}  # the loose λ_init of standard attention did nothing
    spec = AttentionSpec(kind, num_kv_heads=2, backend="math", qkv_bias=False, out_bias=False, **lam)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = _seeded(lambda: CausalLM(**lm, attention=spec))
    assert loose.attention_spec == model.attention_spec
    _same(model, loose, torch.randint(0, 100, (2, 9)))


def test_loose_keywords_without_a_kind_convert_from_the_family_default():
    """``CausalLM(lambda_init=0.5)``, the keywords alone as 0.1.0 took them (its default kind), is the deprecated
    spelling, not a spec given twice: one FutureWarning, the family's default spec with the setting changed. A spec
    the caller gave, with keywords as well, stays an error."""
    lm = dict(vocab_size=100, dim=32, depth=2, num_heads=4, max_seq_len=16)
    with pytest.warns(FutureWarning, match="lambda_init \\(the loose spelling") as record:
        loose = _seeded(lambda: CausalLM(**lm, lambda_init=0.5))
    assert len(record) == 1
    model = _seeded(lambda: CausalLM(**lm, attention=AttentionSpec("diff", lambda_init=0.5, qkv_bias=False,
                                                                   out_bias=False)))
    assert loose.attention_spec == model.attention_spec
    _same(model, loose, torch.randint(0, 100, (2, 9)))
    with pytest.raises(ValueError, match="holds every attention setting"):
        CausalLM(**lm, attention=AttentionSpec("gated"), lambda_init=0.5)


def test_loose_attention_converts_with_the_family_defaults():
    loose = LooseAttention("X", ("lambda_init", "attn_drop_rate"), kind="diff", defaults={"qkv_bias": False},
                           fill={"proj_drop": "drop_rate"}, force={"causal": True})
    spec = AttentionSpec("diff")
    assert loose.resolve(spec, {}, {}) == AttentionSpec("diff", causal=True)
    kept = AttentionSpec("diff", causal=True)
    assert loose.resolve(kept, {}, {}) is kept  # not made (nor validated) again
    assert loose.resolve(kept.to_dict(), {}, {}) == kept
    with pytest.warns(FutureWarning, match="X: attn_drop_rate \\(the loose spelling"):
        got = loose.resolve(None, {"attn_drop_rate": 0.2}, {"drop_rate": 0.1})
    assert got == AttentionSpec("diff", qkv_bias=False, proj_drop=0.1, attn_drop=0.2, causal=True)
    with pytest.raises(TypeError, match="X\\(\\) got unexpected keyword argument\\(s\\) \\['sub_norm'\\]"):
        loose.resolve(None, {"sub_norm": True}, {})
    assert loose.upgrade({"depth": 2}, {}) == {"depth": 2}  # nothing loose: as it is
    assert loose.upgrade({"attention": "gated", "lambda_init": "ye", "drop_rate": 0.1}, {}) == {
        "drop_rate": 0.1, "attention": AttentionSpec("gated", lambda_init="ye", qkv_bias=False, proj_drop=0.1,
                                                     causal=True).to_dict()}


def test_updated_changes_the_settings_given_and_keeps_the_rest():
    """AttentionSpec.updated: a partial dict sets its settings only; a new kind keeps the settings it shares with the
    old one and starts its own at their defaults unless given, so the result validates; a spec replaces; bad input
    names it."""
    replace, fields = dataclasses.replace, dataclasses.fields
    dg = AttentionSpec("gated", lambda_init=0.3, q_residual=True, gate_bias=False, lambda_form="constant",
                       sub_norm=False, proj_drop=0.1, backend="math", num_kv_heads=2)
    assert dg.updated({"lambda_init": 0.5}) == replace(dg, lambda_init=0.5)
    assert dg.updated({}) == dg and dg.updated({"kind": "gated"}) == dg  # the same kind: nothing resets
    diff = dg.updated({"kind": "diff"})  # λ form and sub-norm are diff's settings too: kept
    assert diff == AttentionSpec("diff", lambda_init=0.3, lambda_form="constant", sub_norm=False, proj_drop=0.1,
                                 backend="math", num_kv_heads=2)
    assert dg.updated({"kind": "diff", "sub_norm": False}).sub_norm is False
    assert AttentionSpec("diff_v2", head_dim=8).updated({"kind": "standard"}) == AttentionSpec("standard")
    assert dg.updated(AttentionSpec("diff")) == AttentionSpec("diff")
    with pytest.raises(ValueError, match=r"unknown AttentionSpec settings \['lamda_init'\]"):
        dg.updated({"lamda_init": 0.5})
    with pytest.raises(ValueError, match=r"kind 'diff' has no setting q_residual \(a setting of kind 'gated'\)"):
        AttentionSpec("diff").updated({"q_residual": True})
    with pytest.raises(ValueError, match="kind 'standard' has no setting lambda_init"):
        AttentionSpec("standard", lambda_init=0.5)
    with pytest.raises(ValueError, match="attention must be an AttentionSpec or a dict of its settings, got str"):
        dg.updated("diff")
    assert set(AttentionSpec.settings_of("standard")) == {f.name for f in fields(AttentionSpec)} - {"kind"}
    assert set(AttentionSpec.settings_of("diff")) == {f.name for f in fields(DiffAttention.Config)} - {"kind"}
    assert "q_residual" in AttentionSpec.settings_of("gated") and "head_dim" not in AttentionSpec.settings_of("gated")


# ------------------------------------------------------------- nothing the project prints recommends the loose spelling

_ROOT = Path(__file__).resolve().parents[1]
_LOOSE = "|".join(sorted(LOOSE_KEYWORDS, key=len, reverse=True))
_KINDS = "|".join(sorted(("standard", "diff", "gated", "diff_v2", "grouped"), key=len, reverse=True))
_TOWER = r"(?:(?:vision|text|lm)_)?"
_MODELS = (r"(?:create_model|build|VisionTransformer|TextTransformer|TextClassifier|CausalLM|CLIP|MotifLM|"
           r"VisionLanguageModel|LMBlock|Block)")
#: the loose spellings: a config key beside the model's arguments, a kind's name as the attention, a loose keyword
#: of a model (or one tower's)
_DEPRECATED = [re.compile(rf"model\.overrides\.{_TOWER}(?:{_LOOSE})\b"),
               re.compile(rf"""\b{_TOWER}attention\s*=\s*["'](?:{_KINDS})["']"""),
               re.compile(rf"\b{_MODELS}\([^()]*\b{_TOWER}(?:{_LOOSE})\s*="),
               re.compile(rf"(?<![.\w])(?:vision|text|lm)_(?:{_LOOSE})\s*=")]
#: words of a text that describes the loose spelling as what it is
_DESCRIBED = re.compile(r"deprecated|of before|loose|0\.1\.0|FutureWarning", re.I)


def _loose_spellings(text: str) -> list[str]:
    return [m.group(0) for p in _DEPRECATED for m in p.finditer(text)]


def _src_strings(path: Path) -> list[tuple[int, str]]:
    """Every string of a source file (messages, ``--help``, docstrings) with its line, but the arguments of
    :func:`~diffattn.layers.blocks.warn_loose` and :func:`~diffattn.deprecations.warn_deprecated`, the deprecation
    warnings that name what the user wrote."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for c in ast.walk(tree) if isinstance(c, ast.Call)
            and getattr(c.func, "id", "") in ("warn_loose", "warn_deprecated") for n in ast.walk(c)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def test_nothing_the_project_prints_recommends_the_loose_spelling():
    """README.md, docs/, the recipes (configs/, comments included) and every string of src/ (error messages,
    ``--help``, docstrings) name ``model.overrides.attention.<field>`` and ``attention={...}``: a loose spelling
    appears only in a paragraph (a docs paragraph, a string) that calls it deprecated, and in the warning itself."""
    assert _loose_spellings("--set model.overrides.backend=triton; --set model.overrides.text_lambda_init=0.5") == [
        "model.overrides.backend", "model.overrides.text_lambda_init"]
    assert _loose_spellings("""create_model("diff_vit_nano", depth=2, lambda_init=0.5); attention='diff'""") == [
        "attention='diff'", 'create_model("diff_vit_nano", depth=2, lambda_init=']
    assert _loose_spellings("vision_lambda_form='constant'") == ["vision_lambda_form="]
    assert not _loose_spellings("--set model.overrides.attention.backend=triton; attention={'lambda_init': 0.5}; "
                                "DiffAttention(dim=64, num_heads=4, lambda_init=0.8); retrofit(m, 'daa', "
                                "lambda_init=0.8)")
    found = []
    for path in [_ROOT / "README.md", *sorted((_ROOT / "docs").rglob("*.md"))]:
        found += [(path.name, s) for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))
                  if not _DESCRIBED.search(para) for s in _loose_spellings(para)]
    configs = _ROOT / "src" / "diffattn" / "configs"
    for path in sorted(configs.rglob("*.yaml")):
        found += [(path.name, s) for s in _loose_spellings(path.read_text(encoding="utf-8"))]
        overrides = ((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("model") or {}).get("overrides")
        found += [(path.name, f"model.overrides.{k}") for k in overrides or {}
                  if re.fullmatch(rf"{_TOWER}(?:{_LOOSE})", k)]
    assert len(list(configs.rglob("*.yaml"))) > 20
    for path in sorted((_ROOT / "src" / "diffattn").rglob("*.py")):
        if path.name == "deprecations.py":  # the table of deprecated spellings
            continue
        found += [(f"{path.name}:{line}", s) for line, text in _src_strings(path) if not _DESCRIBED.search(text)
                  for s in _loose_spellings(text)]
    assert not found
