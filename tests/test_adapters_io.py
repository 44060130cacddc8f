"""RetrofitConfig, and adapter saving/loading: strict validation before the model is touched, clear errors,
atomic saves (a process killed mid-save leaves the previous or the new adapter, never a mix)."""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

import diffattn
import diffattn.adapters as A
from diffattn.adapters import RetrofitConfig
from diffattn.adapters.methods import MAX_STEP
from diffattn.adapters.saving import CONFIG_FILE, WEIGHTS_FILE
from diffattn.formats import FORMAT


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()


IDS = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(0))


def trained(model, seed=1, t=5):
    g = torch.Generator().manual_seed(seed)
    for _, a in A.adapters(model):
        for p in a.parameters():
            p.data.add_(0.3 * torch.randn(p.shape, generator=g))
        a.advance(t)
    return model


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


# -------------------------------------------------------------------------------------------- config


def test_config_and_keyword_forms_are_the_same_retrofit():
    a = A.retrofit(tiny_gpt2(), RetrofitConfig("daa", lambda_init=0.5, anneal_steps=10, layers=[1], train="all"))
    b = A.retrofit(tiny_gpt2(), "daa", lambda_init=0.5, anneal_steps=10, layers=[1], train="all")
    assert A.retrofit_config(a) == A.retrofit_config(b) == RetrofitConfig("daa", 0.5, 10, [1], "all")
    import numpy as np

    assert RetrofitConfig("daa", lambda_init=np.float32(0.5)).lambda_init == 0.5  # any real number, as a float
    assert A.lambda_summary(a) == A.lambda_summary(b)
    assert torch.equal(logits(trained(a)), logits(trained(b)))
    with pytest.raises(ValueError, match=r"takes its settings from the config; got \['anneal_steps'\]"):
        A.retrofit(tiny_gpt2(), RetrofitConfig("daa"), anneal_steps=5)


@pytest.mark.parametrize("kw,err,match", [
    ({"method": "diff"}, ValueError, "method must be one of"),
    ({"lambda_init": float("nan")}, ValueError, "lambda_init must be a finite float"),
    ({"lambda_init": float("inf")}, ValueError, "lambda_init must be a finite float"),
    ({"lambda_init": "big"}, ValueError, "lambda_init must be a finite float or 'ye', got 'big'"),
    ({"lambda_init": True}, TypeError, "lambda_init must be a finite float"),
    ({"anneal_steps": 0}, ValueError, "anneal_steps must be a positive int"),
    ({"anneal_steps": True}, ValueError, "anneal_steps must be a positive int"),
    ({"anneal_steps": 2.5}, ValueError, "anneal_steps must be a positive int"),
    ({"layers": [True]}, TypeError, r"bools are not indices\), got True"),
    ({"layers": [0, False]}, TypeError, "bools are not indices"),
    ({"layers": []}, ValueError, "at least one attention layer"),
    ({"layers": [1, 1]}, ValueError, "must not repeat"),
    ({"layers": "01"}, TypeError, "layers must be None, a sequence"),
    ({"layers": 1}, TypeError, "layers must be None, a sequence"),
    ({"train": "lora"}, ValueError, "train must be one of"),
])
def test_config_rejects_bad_values(kw, err, match):
    """Bools are not layer indices, an empty selection is an error, λ_init must be finite (a NaN/inf λ_init used
    to give an all-NaN model at step 0)."""
    args = {"method": "daa", **kw}
    with pytest.raises(err, match=match):
        RetrofitConfig(**args)
    model = tiny_gpt2()
    with pytest.raises(err, match=match):
        A.retrofit(model, **args)
    assert not A.adapters(model)  # nothing converted


def test_layer_selection_errors():
    with pytest.raises(ValueError, match="name the same attention layer twice"):
        A.retrofit(tiny_gpt2(), "daa", layers=[0, -2])
    with pytest.raises(ValueError, match="selected none of the 2 attention layers"):
        A.retrofit(tiny_gpt2(), "daa", layers=lambda i, name: False)
    m = A.retrofit(tiny_gpt2(), "daa", layers=[-1])
    assert A.retrofit_config(m).layers == [1]


def test_config_json_roundtrip(tmp_path):
    model = trained(A.retrofit(tiny_gpt2(), "split_heads", lambda_init="ye", anneal_steps=7, layers=[0]))
    A.save_adapter(model, tmp_path / "ad")
    meta = json.loads((tmp_path / "ad" / CONFIG_FILE).read_text())
    assert meta == {"method": "split_heads", "lambda_init": "ye", "anneal_steps": 7, "layers": [0],
                    "train": "attention", "trainable": [], "layer_names": ["transformer.h.0.attn"],
                    "num_attention_layers": 2,
                    "format_version": 1, "diffattn_format": FORMAT,
                    "diffattn_version": diffattn.__version__, "base_model": "GPT2LMHeadModel"}
    config, _, _ = A.read_adapter(tmp_path / "ad")
    assert config == A.retrofit_config(model)
    assert RetrofitConfig.from_dict(config.to_dict()) == config
    del meta["trainable"]  # a file written before trainable existed reads as trainable=()
    (tmp_path / "ad" / CONFIG_FILE).write_text(json.dumps(meta))
    assert A.read_adapter(tmp_path / "ad")[0].trainable == ()
    with pytest.raises(ValueError, match=r"unknown RetrofitConfig fields \['rank'\]"):
        RetrofitConfig.from_dict({"method": "daa", "rank": 4})
    with pytest.raises(ValueError, match="predicate cannot be saved"):
        RetrofitConfig("daa", layers=lambda i, n: True).to_dict()


# -------------------------------------------------------------------------------------- schedule step


def test_step_overflow_is_a_clear_error():
    model = A.retrofit(tiny_gpt2(), "daa")
    with pytest.raises(ValueError, match=r"n=10+ would take the schedule step from 0 past 9223372036854775807"):
        A.step(model, 10**30)
    assert [r["step"] for r in A.lambda_summary(model)] == [0, 0]  # no layer advanced
    assert A.step(model, MAX_STEP) == MAX_STEP  # the largest step is reachable, and λ(t) = λ_learn there
    assert [r["lambda"] for r in A.lambda_summary(model)] == [0.0, 0.0]
    with pytest.raises(ValueError, match="past 9223372036854775807"):
        A.step(model, 1)
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError, match="n must be a non-negative int"):
            A.step(model, bad)


# ------------------------------------------------------------------------------------------ loading


def _snapshot(model):
    return {"types": [type(m) for m in model.modules()], "grad": [p.requires_grad for p in model.parameters()],
            "state": {k: v.clone() for k, v in model.state_dict().items()}, "logits": logits(model),
            "attrs": sorted(model.__dict__)}


def _assert_unchanged(model, snap):
    assert [type(m) for m in model.modules()] == snap["types"]
    assert [p.requires_grad for p in model.parameters()] == snap["grad"]
    state = model.state_dict()
    assert state.keys() == snap["state"].keys()
    assert all(torch.equal(state[k], v) for k, v in snap["state"].items())
    assert torch.equal(logits(model), snap["logits"])
    assert sorted(model.__dict__) == snap["attrs"] and not A.adapters(model)


@pytest.fixture
def saved(tmp_path):
    """A trained DAA adapter on layers [0, 1] (train="attention"), its directory and its logits."""
    model = trained(A.retrofit(tiny_gpt2(), "daa", anneal_steps=10))
    A.save_adapter(model, tmp_path / "good")
    return tmp_path / "good", logits(model)


def _corrupt(src: Path, dst: Path, *, tensors=None, meta=None, raw_json=None) -> Path:
    dst.mkdir()
    t = load_file(str(src / WEIGHTS_FILE))
    m = json.loads((src / CONFIG_FILE).read_text())
    if tensors:
        tensors(t)
    if meta:
        meta(m)
    save_file(t, str(dst / WEIGHTS_FILE))
    (dst / CONFIG_FILE).write_text(json.dumps(m) if raw_json is None else raw_json)
    return dst


def _drop(*keys):
    def f(t):
        for k in keys:
            del t[k]
    return f


BAD = {
    "missing adapter tensor": (dict(tensors=_drop("transformer.h.1.attn.diff_adapter.W_daa")),
                               r"missing tensors \['transformer.h.1.attn.diff_adapter.W_daa'\]"),
    "missing step buffer": (dict(tensors=_drop("transformer.h.0.attn.diff_adapter.lam.step")),
                            r"missing tensors \['transformer.h.0.attn.diff_adapter.lam.step'\]"),
    "missing trainable base weight": (dict(tensors=_drop("transformer.h.0.attn.c_attn.weight")),
                                      r"missing tensors \['transformer.h.0.attn.c_attn.weight'\]"),
    "unexpected tensor": (dict(tensors=lambda t: t.update({"transformer.h.0.attn.extra": torch.zeros(2)})),
                          r"unexpected tensors \['transformer.h.0.attn.extra'\]"),
    "wrong shape": (dict(tensors=lambda t: t.update({"transformer.h.1.attn.diff_adapter.W_daa": torch.zeros(4, 8, 9)})),
                    r"'transformer.h.1.attn.diff_adapter.W_daa' has shape \(4, 8, 9\), the model needs \(4, 8, 8\)"),
    "NaN tensor": (dict(tensors=lambda t: t["transformer.h.1.attn.diff_adapter.lam.lambda_learn"].fill_(float("nan"))),
                   "holds NaN or infinite values"),
    "negative step": (dict(tensors=lambda t: t["transformer.h.1.attn.diff_adapter.lam.step"].fill_(-3)),
                      "is negative"),
    "float step": (dict(tensors=lambda t: t.update({"transformer.h.1.attn.diff_adapter.lam.step": torch.tensor(1.0)})),
                   "has dtype torch.float32, the model needs torch.int64"),
    "truncated JSON": (dict(raw_json='{"method": "daa", "lambda_init"'), "is not valid JSON"),
    "JSON list": (dict(raw_json="[1, 2]"), "must hold a JSON object, got list"),
    "bad format_version": (dict(meta=lambda m: m.update(format_version=2)), "format_version 2"),
    "missing field": (dict(meta=lambda m: m.pop("train")), r"lacks the fields \['train'\]"),
    "unknown field": (dict(meta=lambda m: m.update(rank=4)), r"unknown fields \['rank'\]"),
    "mistyped field": (dict(meta=lambda m: m.update(anneal_steps="10")), "anneal_steps must be a positive int"),
    "bool layer": (dict(meta=lambda m: m.update(layers=[True, 1])), "bools are not indices"),
    "empty layers": (dict(meta=lambda m: m.update(layers=[], layer_names=[])), "at least one attention layer"),
    "layer out of range": (dict(meta=lambda m: m.update(layers=[0, 5])), r"sorted indices in \[0, 2\)"),
    "layer_names mismatch": (dict(meta=lambda m: m.update(layer_names=["h.0", "h.1"])),
                             "base_model does not match the saved adapter"),
    "other architecture": (dict(meta=lambda m: m.update(num_attention_layers=3)),
                           "base_model does not match the saved adapter"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter_is_rejected_and_model_untouched(saved, tmp_path, case):
    """Every corruption raises ValueError naming the problem (missing and unexpected tensors by name), before the
    base model is touched: it is exactly as before, and loading the good adapter into it afterwards works."""
    good, want = saved
    kw, match = BAD[case]
    bad = _corrupt(good, tmp_path / "bad", **kw)
    base = tiny_gpt2()
    snap = _snapshot(base)
    with pytest.raises(ValueError, match=match):
        A.load_adapter(base, bad)
    _assert_unchanged(base, snap)
    loaded = A.load_adapter(base, good)  # the retry works on the same object
    assert torch.equal(logits(loaded), want)


def test_unreadable_weights_and_missing_files(saved, tmp_path):
    good, _ = saved
    bad = _corrupt(good, tmp_path / "bad")
    (bad / WEIGHTS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    base = tiny_gpt2()
    snap = _snapshot(base)
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        A.load_adapter(base, bad)
    (bad / WEIGHTS_FILE).unlink()
    with pytest.raises(ValueError, match=f"lacks {WEIGHTS_FILE}"):
        A.load_adapter(base, bad)
    with pytest.raises(ValueError, match=CONFIG_FILE):
        A.load_adapter(base, tmp_path / "nowhere")
    _assert_unchanged(base, snap)
    with pytest.raises(ValueError, match="already retrofitted"):
        A.load_adapter(A.retrofit(tiny_gpt2(), "daa"), good)


def test_load_into_other_architecture_leaves_it_untouched(saved):
    from transformers import LlamaConfig, LlamaForCausalLM

    good, _ = saved
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, vocab_size=64)).eval()
    snap = _snapshot(llama)
    with pytest.raises(ValueError, match="base_model does not match the saved adapter"):
        A.load_adapter(llama, good)
    _assert_unchanged(llama, snap)


# ------------------------------------------------------------------------------------------- saving


def test_save_refuses_a_directory_with_other_files(tmp_path):
    model = A.retrofit(tiny_gpt2(), "dex")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"holds files other than an adapter \(\['notes.txt'\]\)"):
        A.save_adapter(model, tmp_path / "run")
    assert (tmp_path / "run" / "notes.txt").read_text() == "keep me"
    A.save_adapter(model, tmp_path / "ad")
    A.save_adapter(model, tmp_path / "ad")  # overwriting a previous adapter is fine
    assert sorted(p.name for p in (tmp_path / "ad").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]


def _saver(models, target, counter):  # child process: save the two adapters in turn, forever
    i = 0
    while True:
        A.save_adapter(models[i % 2], target)
        counter.value += 1  # the only writer: no lock, which a SIGKILL could leave held
        i += 1


def test_save_adapter_survives_sigkill(tmp_path):
    """A child process saves two different adapters (different configs and weights) in turn into one directory and
    is SIGKILLed at random moments; after every kill the directory loads as exactly one of the two."""
    models = [trained(A.retrofit(tiny_gpt2(), "daa", anneal_steps=10 + j), seed=j + 1, t=j + 2) for j in range(2)]
    want = [{k: v.clone() for k, v in load_state(m).items()} for m in models]
    want_logits = [logits(m) for m in models]
    target = tmp_path / "adapter"
    A.save_adapter(models[0], target)
    ctx = mp.get_context("fork")
    rng = random.Random(0)
    kills = saves = 0
    seen = set()
    deadline = time.monotonic() + 25
    while kills < 12 and time.monotonic() < deadline:
        counter = ctx.Value("i", 0, lock=False)  # a lock held by the killed child would hang the parent's read
        p = ctx.Process(target=_saver, args=(models, target, counter), daemon=True)
        p.start()
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        kills += 1
        saves += counter.value
        config, _, tensors = A.read_adapter(target)
        j = config.anneal_steps - 10
        assert j in (0, 1)
        assert tensors.keys() == want[j].keys() and all(torch.equal(tensors[k], want[j][k]) for k in tensors)
        seen.add(j)
    assert kills >= 5 and saves >= kills  # the kills landed while saves were running
    print(f"kills={kills} completed saves={saves} survivors={sorted(seen)}")
    loaded = A.load_adapter(tiny_gpt2(), target)
    j = A.retrofit_config(loaded).anneal_steps - 10
    assert torch.equal(logits(loaded), want_logits[j])


def load_state(model):
    from diffattn.adapters.core import _plan
    from diffattn.adapters.saving import _adapter_state

    return _adapter_state(model, _plan(model))


def test_save_load_roundtrip_every_train_mode(tmp_path):
    for train in ("attention", "adapters", "all"):
        model = trained(A.retrofit(tiny_gpt2(), "diffv", anneal_steps=6, train=train))
        if train == "all":
            with torch.no_grad():
                model.transformer.wte.weight.add_(0.1)  # a base weight changed by full fine-tuning
        A.save_adapter(model, tmp_path / train)
        loaded = A.load_adapter(tiny_gpt2(), tmp_path / train)
        assert torch.equal(logits(loaded), logits(model)), train
        assert A.lambda_summary(loaded) == A.lambda_summary(model)
        assert [p.requires_grad for p in loaded.parameters()] == [p.requires_grad for p in model.parameters()]
    copy.deepcopy(loaded)  # a loaded model stays an ordinary module
