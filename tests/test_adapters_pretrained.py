"""save_pretrained of a retrofitted transformers model is a complete checkpoint: from_pretrained_retrofit restores
it exactly (architecture from config.json, retrofit from its diffattn_retrofit record, adapter tensors strictly),
and loading it into the plain architecture warns that the retrofit was dropped."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

T = pytest.importorskip("transformers")

import diffattn  # noqa: E402
import diffattn.adapters as A  # noqa: E402

IDS = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(3))


def _build(family: str, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "bert":
        cfg = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, num_labels=3)
        model = T.BertForSequenceClassification(cfg)
    elif family == "gpt2":  # tied lm_head: save_pretrained leaves it out of the file
        model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16))
    else:
        cfg = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=64)
        model = T.LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def _retrofitted(family: str, method: str = "daa", dtype=torch.float32) -> torch.nn.Module:
    model = A.retrofit(_build(family, dtype), method, anneal_steps=10, layers=[1] if family == "llama" else None,
                       trainable=("classifier",) if family == "bert" else ())
    A.step(model, 3)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as after training: every trainable tensor moved
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.mark.parametrize("family,method", [("bert", "daa"), ("gpt2", "diffk"), ("llama", "split_heads")])
def test_save_pretrained_round_trip_is_exact(tmp_path, family, method):
    model = _retrofitted(family, method)
    model.save_pretrained(tmp_path)
    rec = json.loads((tmp_path / "config.json").read_text())["diffattn_retrofit"]
    assert rec["method"] == method and rec["layer_names"] == [r["name"] for r in A.lambda_summary(model)]
    loaded = diffattn.from_pretrained_retrofit(tmp_path).eval()
    assert type(loaded) is type(model)
    assert (_logits(loaded) - _logits(model)).abs().max().item() <= 1e-6
    assert A.lambda_summary(loaded) == A.lambda_summary(model)  # schedule step, λ, λ_learn
    assert A.retrofit_config(loaded) == A.retrofit_config(model)
    want = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == want  # train mode and heads restored


def test_float64_round_trip_is_bitwise(tmp_path):
    model = _retrofitted("bert", "daa", torch.float64)
    model.save_pretrained(tmp_path)
    loaded = diffattn.from_pretrained_retrofit(tmp_path, dtype=torch.float64).eval()
    assert next(loaded.parameters()).dtype == torch.float64
    a, b = model.state_dict(), loaded.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    # same weights, bit for bit; the tensors transformers loads live in other storage, for which BLAS may take
    # another summation order: the logits agree to float64 rounding
    assert (_logits(loaded) - _logits(model)).abs().max().item() <= 1e-14


def test_plain_architecture_is_told_it_drops_the_retrofit(tmp_path):
    model = _retrofitted("bert")
    model.save_pretrained(tmp_path)
    with pytest.warns(A.RetrofitCheckpointWarning, match=r"DROPPED its diff_adapter weights.*"
                                                         r"diffattn.from_pretrained_retrofit\(path\)"):
        plain = T.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert not A.adapters(plain)
    assert (_logits(plain) - _logits(model)).abs().max().item() > 1e-4  # it really is a different model
    with warnings.catch_warnings():  # the retrofit-aware loader does not warn
        warnings.simplefilter("error", A.RetrofitCheckpointWarning)
        diffattn.from_pretrained_retrofit(tmp_path)


def test_from_pretrained_retrofit_refuses_what_it_cannot_restore(tmp_path):
    _build("bert").save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="not a transformers checkpoint of a retrofitted model"):
        diffattn.from_pretrained_retrofit(tmp_path / "plain")
    model = _retrofitted("bert")
    model.save_pretrained(tmp_path / "ret")
    with pytest.warns(A.RetrofitCheckpointWarning):
        plain = T.BertForSequenceClassification.from_pretrained(tmp_path / "ret")
    plain.save_pretrained(tmp_path / "stale")  # its config still has the record, its weights no adapter
    with pytest.raises(ValueError, match="lacks 6 adapter tensors"):
        diffattn.from_pretrained_retrofit(tmp_path / "stale")
    with pytest.raises(ValueError, match="recorded retrofit does not apply to BertModel: trainable names"):
        diffattn.from_pretrained_retrofit(tmp_path / "ret", model_class=T.BertModel)
    with pytest.raises(FileNotFoundError, match="missing' does not exist; it takes a checkpoint folder"):
        diffattn.from_pretrained_retrofit(tmp_path / "missing")
    with pytest.raises(TypeError, match="model_class must be a transformers model class"):
        diffattn.from_pretrained_retrofit(tmp_path / "ret", model_class="BertModel")
    cfg = json.loads((tmp_path / "ret" / "config.json").read_text())
    cfg["diffattn_retrofit"]["method"] = "nope"
    (tmp_path / "ret" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="record is invalid: method must be one of"):
        diffattn.from_pretrained_retrofit(tmp_path / "ret")


def test_round_trip_through_transformers_key_renaming_on_save(tmp_path):
    """transformers writes a PaliGemma's ``model.language_model.*`` as ``language_model.model.*`` (its checkpoint
    conversion mapping, undone on load); the adapter tensors are found under the renamed keys and restored exactly."""
    from safetensors import safe_open

    torch.manual_seed(0)
    cfg = T.PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8,
                           projection_dim=32),
        text_config=dict(model_type="gemma", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8, vocab_size=40),
        projection_dim=32, hidden_size=32, vocab_size=40, image_token_index=3)
    model = T.PaliGemmaForConditionalGeneration(cfg).eval()
    A.retrofit(model, "shared_qk", anneal_steps=10, layers=lambda i, name: "language_model" in name)
    A.step(model, 4)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "diff_adapter" in n:
                p.add_(0.1)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as fh:
        saved = set(fh.keys())
    own = {k for k in model.state_dict() if "diff_adapter" in k}
    renamed = A.hf.saved_names(own, saved)
    assert not own & saved and set(renamed) == own  # every adapter tensor was written under another name
    assert renamed["model.language_model.layers.1.self_attn.diff_adapter.step"] == \
        "language_model.model.layers.1.self_attn.diff_adapter.step"
    loaded = diffattn.from_pretrained_retrofit(tmp_path).eval()
    ids = torch.tensor([[3, 3, 3, 3, 5, 6, 7]])
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = model(input_ids=ids, pixel_values=x).logits
        got = loaded(input_ids=ids, pixel_values=x).logits
    assert (got - ref).abs().max().item() <= 1e-6
    assert A.lambda_summary(loaded) == A.lambda_summary(model)


def test_saved_names_refuses_ambiguous_or_shallow_matches():
    saved = {"a.layers.0.attn.diff_adapter.w", "b.layers.0.attn.diff_adapter.w", "c.layers.1.attn.diff_adapter.w",
             "x.diff_adapter.v"}
    got = A.hf.saved_names({"m.layers.0.attn.diff_adapter.w", "m.layers.1.attn.diff_adapter.w",
                            "m.y.diff_adapter.v"}, saved)
    # layer 0 matches two saved keys equally well; "…diff_adapter.v" shares no module path: both stay unmatched
    assert got == {"m.layers.1.attn.diff_adapter.w": "c.layers.1.attn.diff_adapter.w"}
