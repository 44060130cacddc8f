"""The model registry: literal config tables, the 0.1.0 fingerprint, one override rule, size bounds."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from diffattn.layers import AttentionSpec
from diffattn.models import create_model, list_models, model_config
from diffattn.models.config import SIZE_BOUNDS, check_args
from diffattn.models.registry import model_family
from diffattn.models.summary import parameter_count

ROOT = Path(__file__).resolve().parents[1]
FINGERPRINT = ROOT / "tests" / "fixtures" / "model_registry_v0_1_0.json"
NEW_SINCE_0_1_0 = ["diff_v2_lm_base", "diff_v2_lm_small", "diff_v2_lm_tiny",  # Diff Transformer V2 LMs
                   "llava_clip_tiny", "llava_diffclip_tiny"]  # LLaVA-style VLMs


def _fingerprint(name: str) -> dict:
    with torch.device("meta"):
        model = create_model(name)
    sd = model.state_dict()
    keys = "\n".join(f"{k}:{tuple(sd[k].shape)}" for k in sorted(sd))
    return {"params": parameter_count(model), "num_keys": len(sd),
            "keys_sha256": hashlib.sha256(keys.encode()).hexdigest()}


def test_registry_matches_the_0_1_0_fingerprint():
    """Same names, and per name the same parameter count and state-dict keys/shapes as diffattn 0.1.0 (recorded by
    scripts/registry_fingerprint.py before the config tables were rewritten)."""
    recorded = json.loads(FINGERPRINT.read_text())
    assert len(recorded) == 72
    assert sorted(set(list_models()) - set(recorded)) == NEW_SINCE_0_1_0
    assert set(recorded) <= set(list_models())
    for name in ("vit_nano", "dg_vit_cifar_x16_3", "diffclip_vit_ti16", "dgclip_tiny", "dgt_mnli_x16_3",
                 "diff_lm_tiny", "clip_vit_b16", "lm_base"):
        assert _fingerprint(name) == recorded[name], name


@pytest.mark.slow
def test_every_registered_model_matches_the_0_1_0_fingerprint():
    recorded = json.loads(FINGERPRINT.read_text())
    assert {name: _fingerprint(name) for name in list_models() if name not in NEW_SINCE_0_1_0} == recorded


def test_every_registered_name_appears_literally_in_src():
    """No generated names: grep finds each name as a string literal (a key of a config table) in src/."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "diffattn").rglob("*.py"))
    literals = set(re.findall(r'"([a-z0-9_]+)"', text))
    missing = [n for n in list_models() if n not in literals]
    assert missing == []
    models = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "diffattn" / "models").rglob("*.py"))
    assert "globals()[" not in models


def test_overrides_one_rule():
    m = create_model("diffclip_tiny", vision_depth=1, text_embed_dim=32, attention="gated", embed_dim=16)
    assert len(m.visual.blocks) == 1 and m.text.embed_dim == 32 and m.image_projection.shape == (64, 16)
    assert type(m.visual.blocks[0].attn).__name__ == type(m.text.blocks[0].attn).__name__ == "GatedDiffAttention"
    # a one-tower override wins over the all-towers one, whatever the keyword order
    m = create_model("clip_tiny", vision_attention="diff", attention="standard")
    assert type(m.visual.blocks[0].attn).__name__ == "DiffAttention"
    assert type(m.text.blocks[0].attn).__name__ == "Attention"
    assert model_config("diffclip_tiny")["vision"]["depth"] == 2  # the table itself is never mutated
    with pytest.raises(ValueError, match=r"override 'depthh' is not an argument of CausalLM \('lm_tiny'\)"):
        create_model("lm_tiny", depthh=3)
    with pytest.raises(ValueError, match="pretrained=True"):
        create_model("dt_tiny", pretrained=True)
    with pytest.raises(ValueError, match="unknown model 'vit_nan'"):
        create_model("vit_nan")


@pytest.mark.parametrize("name, override, arg", [
    ("vit_nano", {"num_classes": 10**12}, "num_classes"),
    ("vit_nano", {"depth": 100000}, "depth"),
    ("dt_tiny", {"vocab_size": 10**10}, "vocab_size"),
    ("lm_tiny", {"dim": 2**20}, "dim"),
    ("clip_tiny", {"text_context_length": 10**7}, "context_length"),
    ("vit_nano", {"embed_dim": True}, "embed_dim"),
])
def test_sizes_are_bounded_before_allocation(name, override, arg):
    """A size beyond SIZE_BOUNDS is refused with the argument, the value and the bound in the message; nothing of
    that size is allocated (the 0.1.0 code tried to allocate 256 TB for num_classes=10**12)."""
    lo, hi = SIZE_BOUNDS[arg]
    with pytest.raises(ValueError, match=rf"{arg} must be an integer in \[{lo}, {hi}\], got"):
        create_model(name, **override)


def test_check_args_rules():
    with pytest.raises(ValueError, match=r"X: drop_rate must be a float in \[0, 1\), got 1.0"):
        check_args("X", drop_rate=1.0)
    with pytest.raises(ValueError, match=r"X: norm_eps must be a finite number > 0, got nan"):
        check_args("X", norm_eps=float("nan"))
    check_args("X", num_kv_heads=None, mlp_hidden=None, depth=1, drop_path_rate=0.0)


def test_every_family_takes_lambda_form(tmp_path):
    from diffattn.models import from_pretrained

    vit = create_model("diff_vit_nano", depth=1, lambda_form="dual_scalar")
    clip = create_model("diffclip_tiny", lambda_form="constant", vision_lambda_form="dual_scalar")
    text = create_model("dgt_tiny", lambda_form="constant")
    lm = create_model("diff_lm_tiny", lambda_form="dual_scalar")
    assert vit.blocks[0].attn.lambda_form == "dual_scalar"
    assert (clip.visual.blocks[0].attn.lambda_form, clip.text.blocks[1].attn.lambda_form) == ("dual_scalar", "constant")
    assert text.blocks[0].attn.lambda_form == "constant" and lm.blocks[1].attn.lambda_form == "dual_scalar"
    assert create_model("dgt_tiny").blocks[0].attn.lambda_form == "gate"  # None: the layer's own form
    vit.save_pretrained(tmp_path / "v")
    back = from_pretrained(tmp_path / "v")
    assert back.blocks[0].attn.lambda_form == "dual_scalar"
    assert all(torch.equal(a, b) for a, b in zip(vit.state_dict().values(), back.state_dict().values()))


# ------------------------------------------------------------------------ attention overrides update the spec

#: another valid value of each AttentionSpec setting than ``base``'s, for a model with ``heads`` query heads
def _other(field: str, base: AttentionSpec, heads: int):
    if field == "num_kv_heads":  # as many K/V heads as query heads: valid for every kind and size
        return heads if base.num_kv_heads != heads else None
    if field == "lambda_options":  # an option of the kind's own λ form
        return {"diff": {"std": 0.05}, "gated": {"bias": False}, "diff_v2": {"bias": True}}[base.kind]
    options = {"lambda_init": (0.5, 0.3), "lambda_form": ("constant", "dual_scalar"), "qkv_bias": (False, True),
               "out_bias": (False, True), "sub_norm": (False, True), "sub_norm_eps": (1e-6, 1e-4),
               "sub_norm_affine": (False, True), "causal": (True, False), "attn_drop": (0.1, 0.2),
               "proj_drop": (0.2, 0.1), "backend": ("math", "sdpa"), "rope": ("interleaved", "half"),
               "rope_theta": (500.0, 1000.0), "softcap": (30.0, 20.0), "sliding_window": (4, 8),
               "q_residual": (True, False), "gate_bias": (False, True), "head_dim": (8, 16),
               "num_noise_heads": (1, 2), "output_scale": ("fixed", "tied")}[field]
    return next(v for v in options if v != getattr(base, field))


def _targets(name: str) -> list[tuple[str | None, type]]:
    family = model_family(name)
    return list(family.towers.items()) or [(None, family.cls)]


def _spec_in(name: str, cfg: dict, tower: str | None, cls: type) -> AttentionSpec:
    """The spec ``cls`` builds from configuration ``cfg`` of ``name`` (what its constructor makes of it)."""
    args = cfg if tower is None else cfg.get(tower, {})
    attention = args.get("attention", inspect.signature(cls).parameters["attention"].default)
    return cls.LOOSE.resolve(attention, {}, args)


def _heads(cfg: dict, tower: str | None, cls: type) -> int:
    args = cfg if tower is None else cfg.get(tower, {})
    return args.get("num_heads", inspect.signature(cls).parameters["num_heads"].default)


def _cases(name: str) -> list[tuple[str | None, str, object]]:
    """(tower, setting, value) for every setting that applies to each tower's kind, but those the class fixes (a
    text tower is causal)."""
    family, cfg = model_family(name), model_config(name)
    cases = []
    for tower, cls in _targets(name):
        base = _spec_in(name, cfg, tower, cls)
        cases += [(tower, f, _other(f, base, _heads(cfg, tower, cls))) for f in AttentionSpec.settings_of(base.kind)
                  if f not in cls.LOOSE.force]
    assert family is model_family(name) and cases
    return cases


def test_an_attention_override_changes_that_setting_only_in_every_model():
    """Every registered model, every AttentionSpec setting its kind (each tower's) takes: ``attention={field:
    value}`` (``<tower>_attention=`` for a tower) gives the registered spec with that one setting changed; the kind
    and every other setting (and the other towers) stay. What the constructor makes of the configuration, for
    every pair; the built models agree (next test)."""
    count = 0
    for name in list_models():
        family, registered = model_family(name), model_config(name)
        for tower, field, value in _cases(name):
            arg = "attention" if tower is None else f"{tower}_attention"
            cfg = family.apply_overrides(name, {arg: {field: value}})
            for t, cls in _targets(name):
                base = _spec_in(name, registered, t, cls)
                want = replace(base, **{field: value}) if t == tower else base
                assert _spec_in(name, cfg, t, cls) == want, (name, t, field, value)
            count += 1
    assert count > 1500  # 77 models × about 20 settings (CLIP and the VLMs twice)


def test_built_models_keep_their_spec_under_an_attention_override():
    """Each registered model built (meta device, one block) with one setting overridden, the settings taken in turn
    over the models so that each kind builds each of its settings: the built spec of every tower is the registered
    one with that setting changed."""
    for i, name in enumerate(list_models()):
        cases = _cases(name)
        tower, field, value = cases[i % len(cases)]
        arg = "attention" if tower is None else f"{tower}_attention"
        with torch.device("meta"):
            model = create_model(name, depth=1, **{arg: {field: value}})
        registered = model_config(name)
        for t, cls in _targets(name):
            built = (model if t is None else getattr(model, {"vision": "visual"}.get(t, t))).attention_spec
            base = _spec_in(name, registered, t, cls)
            assert built == (replace(base, **{field: value}) if t == tower else base), (name, t, field)


def test_an_attention_override_keeps_the_kind_and_a_kind_change_is_explicit():
    """The examples of the docs: a partial dict keeps DiffViT a DiffViT; ``"kind"`` changes the kind, the settings
    only the old kind took (M-DGSA's q_residual) reset, the rest kept; a spec instance replaces; a CLIP tower's own
    dict leaves the other tower alone."""
    assert create_model("diff_vit_nano", attention={"lambda_init": 0.5}).attention_spec == AttentionSpec(
        "diff", lambda_init=0.5)
    dg = model_config("dg_vit_cifar_x2")["attention"]
    assert dg == {"kind": "gated", "q_residual": True, "proj_drop": 0.05}
    with torch.device("meta"):
        assert create_model("dg_vit_cifar_x2", attention={"kind": "diff"}).attention_spec == AttentionSpec(
            "diff", proj_drop=0.05)
        assert create_model("dg_vit_cifar_x2", attention=AttentionSpec("diff")).attention_spec == AttentionSpec("diff")
        clip = create_model("diffclip_dagger_tiny", text_attention={"backend": "math"})
    assert clip.visual.attention_spec == AttentionSpec("diff")
    assert clip.text.attention_spec == AttentionSpec("standard", causal=True, backend="math")
    with pytest.raises(ValueError, match=r"unknown AttentionSpec settings \['lamda_init'\]"):
        create_model("diff_vit_nano", attention={"lamda_init": 0.5})
