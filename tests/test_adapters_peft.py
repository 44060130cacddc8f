"""peft on a retrofitted model: save_adapter writes the bare model's file, load_adapter loads into a wrapped model,
lambda_summary has one row per layer; ``trainable=`` keeps a new task head trainable and saves it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import diffattn.adapters as A  # noqa: E402
from diffattn.adapters.saving import WEIGHTS_FILE  # noqa: E402

CFG = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           max_position_embeddings=32, num_labels=3)


def _base() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(**CFG)).eval()


def _trained() -> torch.nn.Module:
    """A retrofitted model as after some training: schedule at t = 3, every trainable weight moved."""
    model = A.retrofit(_base(), "daa", anneal_steps=10, trainable=("classifier",))
    A.step(model, 3)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _lora(model, **kw):
    cfg = peft.LoraConfig(target_modules=["query", "value"], r=2, lora_alpha=4, **kw)
    return peft.get_peft_model(model, cfg)


def _load(path):
    from safetensors.torch import load_file

    return load_file(str(path / WEIGHTS_FILE))


IDS = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(2))


def test_save_adapter_under_peft_writes_the_bare_models_file(tmp_path):
    model = _trained()
    wrapped = _lora(copy.deepcopy(model), modules_to_save=["diff_adapter", "classifier"])
    A.save_adapter(model, tmp_path / "bare")
    A.save_adapter(wrapped, tmp_path / "peft")
    bare, under = _load(tmp_path / "bare"), _load(tmp_path / "peft")
    assert sorted(under) == sorted(bare)  # no base_model.model., base_layer, modules_to_save, lora_ names
    assert "classifier.weight" in bare and "bert.encoder.layer.0.attention.self.diff_adapter.W_daa" in bare
    for k in bare:
        assert torch.equal(bare[k], under[k]), k
    # the trained copy is what is saved: move it, save again, the file follows
    with torch.no_grad():
        wrapped.base_model.model.bert.encoder.layer[1].attention.self.diff_adapter.modules_to_save["default"] \
            .W_daa.add_(1.0)
    A.save_adapter(wrapped, tmp_path / "peft")
    k = "bert.encoder.layer.1.attention.self.diff_adapter.W_daa"
    torch.testing.assert_close(_load(tmp_path / "peft")[k], bare[k] + 1.0, atol=0, rtol=0)


def test_load_adapter_into_a_peft_wrapped_base_is_exact(tmp_path):
    model = _trained()
    A.save_adapter(model, tmp_path)
    wrapped = _lora(_base())  # LoRA B = 0 at init: the wrapped model computes the base model
    out = A.load_adapter(wrapped, tmp_path).eval()
    assert out is wrapped
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        got = wrapped(input_ids=IDS).logits
    assert (got - want).abs().max().item() <= 1e-6
    lora = [p for n, p in wrapped.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)  # peft's own weights still train
    assert [r["step"] for r in A.lambda_summary(wrapped)] == [3, 3]
    # and the same file again from the wrapped model
    A.save_adapter(wrapped, tmp_path / "again")
    again, first = _load(tmp_path / "again"), _load(tmp_path)
    assert sorted(again) == sorted(first) and all(torch.equal(first[k], again[k]) for k in first)


def test_lambda_summary_under_peft_has_one_row_per_layer():
    model = _trained()
    wrapped = _lora(model, modules_to_save=["diff_adapter"])
    A.step(wrapped, 2)
    rows = A.lambda_summary(wrapped)
    assert [r["name"] for r in rows] == [f"bert.encoder.layer.{i}.attention.self" for i in (0, 1)]
    assert [r["step"] for r in rows] == [5, 5]
    a = 5 / 10  # DAA (2025) eq. 3 with the trained copy's λ_learn
    lam_learn = [float(wrapped.base_model.model.bert.encoder.layer[i].attention.self.diff_adapter
                       .modules_to_save["default"].lam.lambda_learn.detach()) for i in (0, 1)]
    for r, ll in zip(rows, lam_learn):
        assert r["lambda"] == pytest.approx((1 - a) * a * 0.8 + a * ll, abs=1e-6) and r["lambda"] != 0.0
    counts = A.count_parameters(wrapped)["layers"]
    assert [c["name"] for c in counts] == [r["name"] for r in rows] and all(c["new"] == 2 * 8 * 8 * 2 + 1
                                                                             for c in counts)


def test_trainable_keeps_a_new_head_training_and_saves_it(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "froze the task head" warning
        model = A.retrofit(_base(), "daa", trainable=("classifier",))
    assert all(p.requires_grad for p in model.classifier.parameters())
    assert not model.bert.embeddings.word_embeddings.weight.requires_grad
    assert A.retrofit_config(model).trainable == ("classifier",)
    A.save_adapter(model, tmp_path)
    assert {"classifier.weight", "classifier.bias"} <= set(_load(tmp_path))
    adapters_only = A.retrofit(_base(), "daa", train="adapters", trainable=("classifier",))
    trainable = {n for n, p in adapters_only.named_parameters() if p.requires_grad}
    assert {"classifier.weight", "classifier.bias"} <= trainable
    assert all("diff_adapter" in n or n.startswith("classifier.") for n in trainable)
    reloaded = A.load_adapter(_base(), tmp_path)
    assert all(p.requires_grad for p in reloaded.classifier.parameters())


def test_trainable_rejects_bad_names():
    with pytest.raises(ValueError, match=r"trainable names 'clasifier'.*\['classifier'\]"):
        A.retrofit(_base(), "daa", trainable=("clasifier",))
    with pytest.raises(TypeError, match="trainable must be a sequence of module names"):
        A.RetrofitConfig("daa", trainable="classifier")
    with pytest.raises(ValueError, match="trainable must not repeat"):
        A.RetrofitConfig("daa", trainable=("classifier", "classifier"))
    cfg = A.RetrofitConfig("daa", trainable=["classifier"])
    assert A.RetrofitConfig.from_dict(cfg.to_dict()) == cfg


def test_the_model_inside_a_peft_wrapper_is_read_as_bare(tmp_path):
    # peft's LoRA tuner gives the inner transformers model a peft_config, and transformers models have a base_model
    # property: those two attributes once made the inner model look like the PeftModel (no adapter found at all)
    model = _trained()
    wrapped = _lora(copy.deepcopy(model))
    inner = wrapped.base_model.model
    assert hasattr(inner, "peft_config") and hasattr(inner, "base_model")
    assert [n for n, _ in A.adapters(inner)] == [n for n, _ in A.adapters(model)]
    A.save_adapter(model, tmp_path / "bare")
    A.save_adapter(inner, tmp_path / "inner")
    bare, inside = _load(tmp_path / "bare"), _load(tmp_path / "inner")
    assert sorted(inside) == sorted(bare)
    assert all(torch.equal(inside[k], bare[k]) for k in bare)
