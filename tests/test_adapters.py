"""Retrofit math, schedule, parameter counts, save/load and LoRA, on tiny GPT-2 / Llama."""

import codecs
import copy
import inspect
import math
import this

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import diffattn.adapters as A
from diffattn.adapters.methods import split_channels

METHODS = A.METHODS


def tiny_gpt2(impl="eager", dtype=torch.float32):
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0,
                     eos_token_id=0, attn_implementation=impl)
    return GPT2LMHeadModel(cfg).to(dtype).eval()


def tiny_llama(impl="eager"):
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      attn_implementation=impl)
    return LlamaForCausalLM(cfg).eval()


def real_text_ids(n=64):
    """Real English text from the standard library (the Zen of Python), as byte ids."""
    text = codecs.decode(this.s, "rot13")
    return torch.tensor(list(text.encode()[: n * 4]), dtype=torch.long).view(4, n)


def perturb(model, t=None):
    """Random new weights and a mid-schedule step, so that every branch matters."""
    g = torch.Generator().manual_seed(1)
    for _, a in A.adapters(model):
        for p in a.parameters():
            with torch.no_grad():
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
        a.advance(a.anneal_steps // 2 if t is None else t)
    return model


# ------------------------------------------------------------------------------ math vs float64 reference


def _ref_gpt2_attention(attn, x, method):
    """Independent float64 reference (DAA (2025) App. D listings; Li et al. 2025 §3.2–3.3) for one GPT-2 attention."""
    ad = attn.diff_adapter
    W, b = attn.c_attn.weight.double(), attn.c_attn.bias.double()  # Conv1D: x @ W + b, W (D, 3D)
    D = W.shape[0]
    h, d = attn.num_heads, attn.head_dim
    B, N, _ = x.shape
    causal = torch.ones(N, N, dtype=torch.bool).tril()

    def proj(inp, i):
        return (inp @ W[:, i * D:(i + 1) * D] + b[i * D:(i + 1) * D]).view(B, N, h, d).transpose(1, 2)

    def softmax_attn(q, k, s):
        sc = (q @ k.transpose(-1, -2)) * s
        return torch.softmax(sc.masked_fill(~causal, float("-inf")), -1)

    s = 1 / math.sqrt(d)
    Q, K, V = proj(x, 0), proj(x, 1), proj(x, 2)
    t, T = float(ad.step_buffer), ad.anneal_steps
    alpha = min(1.0, t / T)
    if method in A.ANNEALED_METHODS:
        lam = (1 - alpha) * (t / T) * ad.lambda_init + alpha * float(ad.lam.lambda_learn.detach())  # DAA (2025) eq. 3
    else:
        lq1, lk1, lq2, lk2 = (getattr(ad.lam, n).detach().double() for n in ("lambda_q1", "lambda_k1", "lambda_q2",
                                                                     "lambda_k2"))
        lam = float(torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + ad.lambda_init)
    A1 = softmax_attn(Q, K, s)
    if method == "daa":
        O = (A1 - lam * softmax_attn(Q @ ad.W_daa.double(), K, s)) @ V
    elif method == "dex":
        O = (A1 @ V) @ (torch.eye(d, dtype=torch.float64) - lam * ad.W_dex.double())
    elif method == "diffq":
        O = (A1 - lam * softmax_attn(proj(x @ ad.W_dq.double(), 0), K, s)) @ V
    elif method == "diffk":
        O = (A1 - lam * softmax_attn(Q, proj(x @ ad.W_dk.double(), 1), s)) @ V
    elif method == "diffv":
        O = A1 @ (V - lam * proj(x @ ad.W_dv.double(), 2))
    else:
        if method == "shared_qk":
            Od = (A1 - lam * A1) @ V
        else:
            g1, g2 = split_channels(d)
            s2 = 1 / math.sqrt(d // 2)
            Od = (softmax_attn(Q[..., g1], K[..., g1], s2) - lam * softmax_attn(Q[..., g2], K[..., g2], s2)) @ V
        w = ad.diff_norm.weight.double()
        Od = Od / torch.sqrt((Od**2).mean(-1, keepdim=True) + 1e-5) * w * (1 - ad.lambda_init)
        beta = min(1.0, t / T)
        O = (1 - beta) * (A1 @ V) + beta * Od
    O = O.transpose(1, 2).reshape(B, N, D)
    return O @ attn.c_proj.weight.double() + attn.c_proj.bias.double()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_float64_reference(method, impl):
    model = A.retrofit(tiny_gpt2(impl, torch.float64), method, anneal_steps=10)
    perturb(model, t=3)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    got, _ = attn(x)
    ref = _ref_gpt2_attention(attn, x, method)
    assert (got - ref).abs().max().item() < 1e-12  # float64 end to end, λ included


# -------------------------------------------------------------------------------------------- identity


@pytest.mark.parametrize("method", METHODS)
def test_identity_at_step0_and_generate(method):
    base = tiny_llama("sdpa")
    ids = real_text_ids(12)[:2]
    with torch.no_grad():
        ref = base(input_ids=ids).logits
        gen_ref = base.generate(ids, max_new_tokens=4, do_sample=False)
    model = A.retrofit(copy.deepcopy(base), method)
    with torch.no_grad():
        out = model(input_ids=ids).logits
    assert (out - ref).abs().max().item() <= 1e-5
    gen = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
    assert torch.equal(gen, gen_ref)
    perturb(model)  # away from identity: the cache must carry the second branch
    g1 = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
    g2 = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(g1, g2)
    with torch.no_grad():
        l_full = model(input_ids=ids).logits[:, -1]
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        # transformers 5.24 renamed past_key_values to cache (in the forward and its output): test both ends
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        l_step = model(input_ids=ids[:, -1:], use_cache=True, **{name: getattr(prefix, name)}).logits[:, -1]
    assert (l_full - l_step).abs().max().item() < 1e-5


def test_output_attentions_returns_combined_maps():
    model = perturb(A.retrofit(tiny_gpt2("eager"), "daa", anneal_steps=10), t=10)  # past T: λ = λ_learn
    ids = real_text_ids(8)[:1]
    out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 4, 8, 8)
    lam = A.lambda_summary(model)[0]["lambda"]
    rows = out.attentions[0].sum(-1)  # rows of A1 − λ A2 sum to 1 − λ (DAA (2025) App. F.2)
    assert torch.allclose(rows, torch.full_like(rows, 1 - lam), atol=1e-5)


# -------------------------------------------------------------------------------------------- schedule


def test_schedule_matches_eq3():
    T, lam_init, lam_learn = 100, 0.8, 0.37
    model = A.retrofit(tiny_gpt2(), "daa", lambda_init=lam_init, anneal_steps=T)
    for _, a in A.adapters(model):
        a.lam.lambda_learn.data.fill_(lam_learn)
    expected = {0: 0.0, T // 2: 0.5 * 0.5 * lam_init + 0.5 * lam_learn, T: lam_learn, 2 * T: lam_learn}
    t = 0
    for target, want in expected.items():
        A.step(model, target - t)
        t = target
        for row in A.lambda_summary(model):
            assert row["step"] == target
            assert row["lambda"] == pytest.approx(want, abs=1e-7)


def test_step_hooks_and_callback_and_resume():
    model = A.retrofit(tiny_gpt2(), "dex", anneal_steps=8)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    handle = A.attach_to_optimizer(model, opt)
    ids = real_text_ids(16)
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    handle.remove()
    assert [r["step"] for r in A.lambda_summary(model)] == [3, 3]
    cb = A.DiffAttnCallback()
    cb.on_step_end(None, None, None, model=model)
    assert A.lambda_summary(model)[0]["step"] == 4
    # resume: a fresh retrofit + state dict continues the schedule where it stopped
    fresh = A.retrofit(tiny_gpt2(), "dex", anneal_steps=8)
    fresh.load_state_dict(model.state_dict())
    assert A.lambda_summary(fresh) == A.lambda_summary(model)
    A.step(fresh)
    assert A.lambda_summary(fresh)[0]["step"] == 5
    assert A.lambda_summary(fresh)[0]["lambda"] == pytest.approx((1 - 5 / 8) * 5 / 8 * 0.8 + 5 / 8 * float(
        A.adapters(fresh)[0][1].lam.lambda_learn.detach()), abs=1e-6)


@pytest.mark.parametrize("method", ["daa", "dex", "diffk"])
def test_few_steps_on_real_text_move_off_pretrained(method):
    """λ(0) = 0 with identity weights is not a stationary point: the (t/T)·λ_init ramp moves the model."""
    torch.manual_seed(0)
    base = tiny_gpt2()
    model = A.retrofit(copy.deepcopy(base), method, anneal_steps=4, train="adapters")
    ids = real_text_ids(32)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    A.attach_to_optimizer(model, opt)
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - base(input_ids=ids).logits).abs().max().item()
    assert diff > 1e-3
    name = {"daa": "W_daa", "dex": "W_dex", "diffk": "W_dk"}[method]
    w = getattr(A.adapters(model)[0][1], name)
    eye = torch.eye(w.shape[-1]).expand_as(w)
    assert (w - eye).abs().max().item() > 1e-4  # the new matrix itself received gradient and moved
    assert all(r["lambda"] > 0 for r in A.lambda_summary(model))


# ------------------------------------------------------------------------------------------ parameters


@pytest.mark.parametrize("method", METHODS)
def test_count_parameters_formulas(method):
    model = A.retrofit(tiny_gpt2(), method)
    D, h = 32, 4
    d = D // h
    expected = {"daa": D * D // h + 1, "dex": D * D // h + 1, "diffq": D * D + 1, "diffk": D * D + 1,
                "diffv": D * D + 1, "shared_qk": 4 * d + d, "split_heads": 4 * (d // 2) + d}[method]
    c = A.count_parameters(model)
    assert [row["new"] for row in c["layers"]] == [expected, expected]
    attn = 4 * D * D + 4 * D  # c_attn + c_proj with biases
    assert [row["trainable"] for row in c["layers"]] == [attn + expected] * 2
    assert c["trainable"] == 2 * (attn + expected) and c["new"] == 2 * expected


def test_gpt2_small_counts_match_daa_paper():
    """DAA (2025) App. E.1: 28.3M (plain), 28.9M (DAA, DEX), 35.4M (DiffQ/K/V) trainable attention parameters."""
    with torch.device("meta"):
        base = GPT2LMHeadModel(GPT2Config())
    plain = sum(p.numel() for blk in base.transformer.h for p in blk.attn.parameters())
    assert round(plain / 1e6, 1) == 28.3
    got = {}
    for method in ("daa", "dex", "diffq", "diffk", "diffv"):
        with torch.device("meta"):
            m = GPT2LMHeadModel(GPT2Config())
        got[method] = A.count_parameters(A.retrofit(m, method))["trainable"]
    assert got["daa"] == got["dex"] == plain + 12 * (768 * 768 // 12 + 1)
    assert got["diffq"] == got["diffk"] == got["diffv"] == plain + 12 * (768 * 768 + 1)
    assert round(got["daa"] / 1e6, 1) == 28.9 and round(got["diffq"] / 1e6, 1) == 35.4


def test_train_modes_and_layer_selection():
    m = A.retrofit(tiny_gpt2(), "daa", layers=[1], train="adapters")
    assert len(A.adapters(m)) == 1 and A.adapters(m)[0][0] == "transformer.h.1.attn.diff_adapter"
    assert {n for n, p in m.named_parameters() if p.requires_grad} == {
        "transformer.h.1.attn.diff_adapter.W_daa", "transformer.h.1.attn.diff_adapter.lam.lambda_learn"}
    m = A.retrofit(tiny_gpt2(), "daa", layers=lambda i, name: i == 0, train="all")
    assert len(A.adapters(m)) == 1 and all(p.requires_grad for p in m.parameters())
    m = A.retrofit(tiny_gpt2(), "daa", lambda_init="ye")
    assert [r["lambda_init"] for r in A.lambda_summary(m)] == pytest.approx([0.2, 0.8 - 0.6 * math.exp(-0.3)])


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="method must be one of"):
        A.retrofit(tiny_gpt2(), "diff")
    with pytest.raises(ValueError, match="train must be one of"):
        A.retrofit(tiny_gpt2(), "daa", train="lora")
    with pytest.raises(ValueError, match="anneal_steps"):
        A.retrofit(tiny_gpt2(), "daa", anneal_steps=0)
    with pytest.raises(ValueError, match=r"layers must hold .* \[-2, 2\)"):
        A.retrofit(tiny_gpt2(), "daa", layers=[5])
    with pytest.raises(ValueError, match="lambda_init"):
        A.retrofit(tiny_gpt2(), "daa", lambda_init="big")
    with pytest.raises(ValueError, match="supported families: .*GPT-2.*Llama.*timm.*open_clip"):
        A.retrofit(torch.nn.Sequential(torch.nn.Linear(4, 4)), "daa")
    m = A.retrofit(tiny_gpt2(), "daa")
    with pytest.raises(ValueError, match="already retrofitted"):
        A.retrofit(m, "dex")


# -------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("method", ["daa", "diffv", "split_heads"])
def test_save_and_load_adapter(tmp_path, method):
    torch.manual_seed(0)
    base = tiny_llama("sdpa")
    pristine = copy.deepcopy(base)
    model = perturb(A.retrofit(base, method, anneal_steps=10, layers=[1], train="adapters"))
    A.save_adapter(model, tmp_path)
    from safetensors.torch import load_file

    keys = set(load_file(tmp_path / "diffattn_adapter.safetensors"))
    assert keys and all(".diff_adapter." in k for k in keys)  # only the new weights (and step buffers)
    loaded = A.load_adapter(pristine, tmp_path)
    ids = real_text_ids(10)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert A.lambda_summary(loaded) == A.lambda_summary(model)
    with pytest.raises(ValueError, match="diffattn_adapter.json"):
        A.load_adapter(tiny_llama(), tmp_path / "nowhere")


def test_peft_lora_composes_saves_and_merges(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(0)
    base = tiny_llama("sdpa")
    pristine = copy.deepcopy(base)
    model = A.retrofit(base, "daa", anneal_steps=4)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"], modules_to_save=["diff_adapter"])
    pm = get_peft_model(model, cfg)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable)
    assert any(n.endswith("diff_adapter.modules_to_save.default.W_daa") for n in trainable)
    opt = torch.optim.Adam([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    A.attach_to_optimizer(pm, opt)
    ids = real_text_ids(16)
    for _ in range(3):
        pm(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    pm.eval()
    with torch.no_grad():
        out = pm(input_ids=ids).logits
    trained_w = [a.W_daa.detach().clone() for n, a in A.adapters(pm) if "modules_to_save" in n]
    assert all((w - torch.eye(8)).abs().max() > 1e-4 for w in trained_w)
    pm.save_pretrained(tmp_path)
    fresh = A.retrofit(pristine, "daa", anneal_steps=4)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path).eval()
    with torch.no_grad():
        assert (reloaded(input_ids=ids).logits - out).abs().max().item() < 1e-6
    merged = reloaded.merge_and_unload()
    with torch.no_grad():
        assert (merged(input_ids=ids).logits - out).abs().max().item() < 1e-5


def test_sdpa_and_eager_paths_agree_off_identity():
    torch.manual_seed(0)
    e = perturb(A.retrofit(tiny_gpt2("eager"), "diffq"))
    s = tiny_gpt2("sdpa")
    s = A.retrofit(s, "diffq")
    s.load_state_dict(e.state_dict())
    am = torch.ones(2, 10, dtype=torch.long)
    am[0, :3] = 0  # left padding: bool mask under sdpa, additive float under eager
    ids = real_text_ids(10)[:2]
    with torch.no_grad():
        ye, ys = e(input_ids=ids, attention_mask=am).logits, s(input_ids=ids, attention_mask=am).logits
    assert (ye[0, 3:] - ys[0, 3:]).abs().max().item() < 1e-5 and (ye[1] - ys[1]).abs().max().item() < 1e-5
    assert not F.softmax(ye, -1).isnan().any()


def test_freezing_a_task_head_is_announced():
    """train="attention" freezes everything but attention; a (possibly new) classification head is named in a
    warning with the call that unfreezes it, and train="all" keeps it trainable without a warning."""
    import warnings

    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    model = BertForSequenceClassification(cfg)
    with pytest.warns(UserWarning, match=r"froze the task head\(s\) \['classifier'\].*model.classifier.requires_grad_"):
        A.retrofit(model, "daa")
    assert not any(p.requires_grad for p in model.classifier.parameters())
    model = BertForSequenceClassification(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.retrofit(model, "daa", train="all")
    assert all(p.requires_grad for p in model.classifier.parameters())
