"""The model registry: literal config tables, the 0.1.0 fingerprint, one override rule, size bounds."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

from diffattn.models import create_model, list_models, model_config
from diffattn.models.config import SIZE_BOUNDS, check_args
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
