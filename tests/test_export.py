"""ONNX export of every registered model family through ``diffattn.export_onnx``: the file runs in onnxruntime at
another batch size than it was exported at and gives the eager model's outputs."""

from __future__ import annotations

import pytest
import torch

import diffattn
from diffattn.models import registry

ort = pytest.importorskip("onnxruntime", reason="ONNX export needs the extra diffattn[export]")

#: a tiny model of each registered family, with inputs of batch ``b`` (differential, gated and V2 attention)
IDS, IMG = (lambda b: torch.randint(1, 60, (b, 8))), (lambda b: torch.randn(b, 3, 32, 32))
CASES = {
    "diff_vit_nano": ("VisionTransformer", lambda b: (IMG(b),)),
    "dg_vit_nano": ("VisionTransformer", lambda b: (IMG(b),)),
    "diff_lm_tiny": ("CausalLM", lambda b: (IDS(b),)),
    "diff_v2_lm_tiny": ("CausalLM", lambda b: (IDS(b),)),
    "dgt_tiny": ("TextClassifier", lambda b: (IDS(b),)),
    "diffclip_tiny": ("CLIP", lambda b: {"images": IMG(b), "tokens": IDS(b)}),
    "llava_diffclip_tiny": ("VisionLanguageModel", lambda b: (IMG(b), IDS(b))),
}


def test_every_registered_family_has_an_export_case():
    families = {registry.model_family(n).cls.__name__ for n in registry.list_models()}
    assert families == {family for family, _ in CASES.values()}


@pytest.mark.parametrize("name", list(CASES))
def test_export_onnx_matches_onnxruntime_at_another_batch(name, tmp_path):
    model = diffattn.create_model(name).train()  # export_onnx exports in eval mode and restores the mode
    path = diffattn.export_onnx(model, CASES[name][1](2), tmp_path / f"{name}.onnx", atol=1e-5)
    assert model.training and path == tmp_path / f"{name}.onnx"
    inputs = CASES[name][1](3)
    model.eval()
    with torch.no_grad():
        ref = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    ref = {"output": ref} if isinstance(ref, torch.Tensor) else ref
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    args = inputs if isinstance(inputs, dict) else {f"input_{i}": a for i, a in enumerate(inputs)}
    got = session.run(None, {k: v.numpy() for k, v in args.items()})
    names = [o.name for o in session.get_outputs()]
    assert names == list(ref)
    for key, out in zip(names, got):
        assert out.shape == tuple(ref[key].shape), key
        assert float((torch.from_numpy(out) - ref[key]).abs().max()) <= 1e-5, key


def test_plain_torch_onnx_export_of_a_causal_lm_fails_and_export_onnx_says_what_it_takes(tmp_path):
    model = diffattn.create_model("diff_lm_tiny").eval()
    with pytest.raises(TypeError, match="positional arguments"):  # why export_onnx wraps the forward
        torch.onnx.export(model, (IDS(2),), str(tmp_path / "x.onnx"), dynamo=False)
    with pytest.raises(TypeError, match=r"example_inputs must be a tensor, a tuple of tensors or a dict .* got str"):
        diffattn.export_onnx(model, "ids", tmp_path / "x.onnx")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        diffattn.export_onnx("diff_lm_tiny", IDS(2), tmp_path / "x.onnx")
