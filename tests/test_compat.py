"""Checkpoints and adapters written by diffattn 0.1.0 (tests/fixtures/v0_1_0, made before the package was
reorganised) still load and compute exactly what they computed then."""

from __future__ import annotations

from pathlib import Path

import torch

import diffattn

FIX = Path(__file__).parent / "fixtures" / "v0_1_0"


def _io(path: Path) -> dict:
    return torch.load(path / "io.pt", weights_only=True)


def test_models_saved_by_0_1_0_load_exactly():
    for name in ("diff_vit_nano", "dg_vit_nano"):
        model = diffattn.from_pretrained(FIX / name).eval()
        io = _io(FIX / name)
        with torch.no_grad():
            y = model(io["x"])
        torch.testing.assert_close(y, io["y"], rtol=0, atol=1e-6, msg=name)


def _gpt2_base():
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config.from_json_file(str(FIX / "gpt2_daa" / "base" / "config.json"))
    model = GPT2LMHeadModel(cfg).eval()
    missing, unexpected = model.load_state_dict(load_file(str(FIX / "gpt2_daa" / "base" / "model.safetensors")),
                                                strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to wte
    return model


def test_adapters_saved_by_0_1_0_load_exactly():
    io = _io(FIX / "gpt2_daa")
    for sub, key in (("adapter", "y"), ("adapter_shared_qk", "y_shared_qk")):
        model = diffattn.load_adapter(_gpt2_base(), FIX / "gpt2_daa" / sub).eval()
        with torch.no_grad():
            y = model(io["ids"]).logits
        torch.testing.assert_close(y, io[key], rtol=0, atol=1e-5, msg=sub)
