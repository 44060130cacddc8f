"""diffattn.convert.motif: released Motif-2.6B (differential attention) and Motif-2-12.7B (grouped differential
attention) checkpoints ↔ MotifLM, against a float64 transcription of the public model code (tests/motif_reference.py),
offline: the tiny "released" folders are built here."""

import json
import math
import warnings

import pytest
import torch
from safetensors.torch import save_file

import diffattn
from diffattn import convert
from diffattn.layers import DiffAttention, GroupedDiffAttention
from diffattn.models.motif import MOTIF_ATTENTION, MotifLM

from .motif_reference import motif_logits

# tiny configs in the released config.json keys: Motif-2.6B-like (no num_noise_heads: half the heads are noise)
# and Motif-2-12.7B-like (GDA)
V1 = dict(architectures=["MotifForCausalLM"], model_type="motif", vocab_size=61, hidden_size=32,
          intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
          hidden_act="poly_norm", rms_norm_eps=1e-6, attn_rms_norm_eps=1e-5, rope_theta=500000.0,
          max_position_embeddings=128, tie_word_embeddings=False, attention_bias=False, use_bias=False,
          bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16")
V1_GQA_TIED = {**V1, "num_key_value_heads": 2, "tie_word_embeddings": True}
GDA = {**V1, "hidden_size": 40, "num_attention_heads": 10, "num_noise_heads": 2, "num_key_value_heads": 4,
       "head_dim": 8}  # 4:1
GDA_5_1_BIAS = {**V1, "hidden_size": 24, "num_attention_heads": 6, "num_noise_heads": 1, "num_key_value_heads": 2,
                "head_dim": 8, "attention_bias": True, "use_bias": True, "qkv_bias": True,
                "tie_word_embeddings": True}
CONFIGS = {"v1": V1, "v1_gqa_tied": V1_GQA_TIED, "gda_4_1": GDA, "gda_5_1_bias": GDA_5_1_BIAS}


def released_state_dict(cfg: dict, dtype=torch.float64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the released names, shaped as the public model code builds them."""
    g = torch.Generator().manual_seed(seed)
    hid, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hn = cfg.get("num_noise_heads", h // 2)
    d = cfg.get("head_dim") or hid // h
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    qkv_bias = cfg.get("qkv_bias", cfg["attention_bias"] or cfg["use_bias"])
    o_bias, mlp_bias = cfg["attention_bias"] or cfg["use_bias"], cfg["use_bias"]

    def rnd(*shape, std=0.2, mean=0.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std + mean).to(dtype)

    sd = {"model.embed_tokens.weight": rnd(vocab, hid, std=1.0), "model.norm.weight": rnd(hid, mean=1.0)}
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = rnd(vocab, hid)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows, cols, bias in (("self_attn.q_proj", h * d, hid, qkv_bias),
                                       ("self_attn.k_proj", hkv * d, hid, qkv_bias),
                                       ("self_attn.v_proj", hkv * d, hid, qkv_bias),
                                       ("self_attn.o_proj", hid, 2 * (h - hn) * d, o_bias),
                                       ("mlp.gate_proj", inter, hid, mlp_bias), ("mlp.up_proj", inter, hid, mlp_bias),
                                       ("mlp.down_proj", hid, inter, mlp_bias)):
            sd[p + name + ".weight"] = rnd(rows, cols)
            if bias:
                sd[p + name + ".bias"] = rnd(rows, std=0.05)
        for lam in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            sd[p + "self_attn." + lam] = rnd(d, std=0.3)
        sd[p + "self_attn.subln.weight"] = rnd(2 * d, mean=1.0)
        sd[p + "mlp.act_fn.weight"] = rnd(3, std=0.1, mean=0.33)
        sd[p + "mlp.act_fn.bias"] = rnd(1, std=0.05)
        sd[p + "input_layernorm.weight"] = rnd(hid, mean=1.0)
        sd[p + "post_attention_layernorm.weight"] = rnd(hid, mean=1.0)
    return sd


def write_released(path, cfg, sd):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_the_float64_reference_and_the_round_trip_is_bit_identical(name, tmp_path):
    cfg = CONFIGS[name]
    sd = released_state_dict(cfg)
    folder = write_released(tmp_path / "released", cfg, sd)
    model = convert.from_motif(folder)
    grouped = "num_noise_heads" in cfg and 2 * cfg["num_noise_heads"] != cfg["num_attention_heads"]
    assert isinstance(model, MotifLM)
    assert all(type(b.attn) is (GroupedDiffAttention if grouped else DiffAttention) for b in model.blocks)
    assert model.tok_embed.weight.dtype == torch.float64
    # the released λ_init schedule, layers counted from −1
    assert model.blocks[0].attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(0.3))
    assert model.blocks[0].attn.lambda_init < 0 and model.blocks[1].attn.lambda_init == pytest.approx(0.2)
    ids = torch.randint(0, cfg["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids)
        for backend in ("math", "sdpa"):
            for b in model.blocks:
                b.attn.backend = backend
            assert torch.allclose(model(ids), ours, atol=1e-12, rtol=0)
    for b in range(2):
        ref = motif_logits(cfg, sd, ids[b])
        assert (ours[b] - ref).abs().max().item() <= 1e-10

    back_cfg, back = convert.to_motif(model, tmp_path / "written", base_config=cfg)
    assert back.keys() == sd.keys()
    assert all(back[k].dtype == sd[k].dtype and torch.equal(back[k], sd[k]) for k in sd)
    assert {k: back_cfg[k] for k in cfg} == cfg  # every released entry written back as it was
    assert convert.motif_kwargs(back_cfg) == convert.motif_kwargs(cfg)
    again = convert.from_motif(tmp_path / "written")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_bf16_checkpoint_round_trips_bit_identically_and_loads_through_from_pretrained(tmp_path):
    sd = released_state_dict(GDA, dtype=torch.bfloat16)
    folder = write_released(tmp_path / "motif", GDA, sd)
    model = diffattn.from_pretrained(folder)  # a released Motif folder loads through the converter
    assert isinstance(model, MotifLM) and model.attention == "grouped"
    assert model.blocks[0].attn.q_proj.weight.dtype == torch.bfloat16
    _, back = convert.to_motif(model)
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], sd[k]) for k in sd)


def test_decoding_with_the_static_cache_gives_the_tokens_of_the_full_forward(tmp_path):
    model = convert.from_motif(write_released(tmp_path / "m", GDA, released_state_dict(GDA)))
    ids = torch.randint(0, GDA["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(2))
    cached = model.generate(ids, 6, cache="static")
    assert torch.equal(cached, model.generate(ids, 6, use_cache=False))
    with torch.no_grad():  # the cached logits equal the full forward's
        caches = model.new_kv_caches(11)
        steps = [model(cached[:, :5], kv_caches=caches)]
        steps += [model(cached[:, t:t + 1], kv_caches=caches) for t in range(5, 11)]
        assert (torch.cat(steps, 1) - model(cached)).abs().max().item() <= 1e-10


def test_save_pretrained_round_trip_of_a_converted_model(tmp_path):
    model = convert.from_motif(write_released(tmp_path / "m", GDA_5_1_BIAS, released_state_dict(GDA_5_1_BIAS)))
    model = model.float()  # from_pretrained builds float32 models
    model.save_pretrained(tmp_path / "saved")
    loaded = diffattn.from_pretrained(tmp_path / "saved")
    assert type(loaded) is MotifLM and loaded.attention == "grouped"
    assert loaded.attention_spec.num_noise_heads == 1 and loaded.attention_spec.head_dim == 8  # built by the spec
    assert "attention layers: `GroupedDiffAttention`" in model.generate_model_card().content  # the card names it
    ids = torch.randint(0, GDA_5_1_BIAS["vocab_size"], (1, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_from_pretrained_of_a_diffllama_folder_without_weights_is_one_line(tmp_path):
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "config.json").write_text(json.dumps({"architectures": ["DiffLlamaForCausalLM"],
                                                            "model_type": "diffllama"}))
    with pytest.raises(ValueError) as e:  # converted like every released folder: here it has no weights
        diffattn.from_pretrained(tmp_path / "dl")
    msg = str(e.value)
    assert "\n" not in msg and "DiffLlama checkpoint" in msg and "no file named model.safetensors" in msg


@pytest.mark.parametrize("change,match", [
    ({"hidden_act": "silu"}, "hidden_act must be 'poly_norm'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"attn_rms_norm_eps": None}, "attn_rms_norm_eps"),
])
def test_settings_that_do_not_convert_exactly_are_refused(change, match, tmp_path):
    cfg = {**V1, **change}
    with pytest.raises(ValueError, match=match):
        convert.from_motif(released_state_dict(V1), config=cfg)


def test_unknown_or_missing_tensors_are_named(tmp_path):
    sd = released_state_dict(V1)
    with pytest.raises(ValueError, match="model.layers.0.self_attn.extra"):
        convert.from_motif({**sd, "model.layers.0.self_attn.extra": torch.zeros(1)}, config=V1)
    sd.pop("model.layers.2.mlp.act_fn.bias")
    with pytest.raises(ValueError, match="missing 1 key.*blocks.2.mlp.act_fn.bias"):
        convert.from_motif(sd, config=V1)


def test_to_motif_refuses_what_the_release_cannot_express():
    model = MotifLM(61, 32, 2, 4, mlp_hidden=48, attention={"kind": "diff", **MOTIF_ATTENTION, "lambda_init": "ye"})
    with pytest.raises(ValueError, match="MOTIF_ATTENTION: 'lambda_init': 'motif'"):
        convert.to_motif(model)
    model = MotifLM(61, 32, 2, 4, mlp_hidden=48, mlp_bias=True)
    with pytest.raises(ValueError, match="use_bias"):
        convert.to_motif(model)
    cfg, sd = convert.to_motif(MotifLM(61, 32, 2, 4, mlp_hidden=48))
    assert cfg["model_type"] == "motif" and "num_noise_heads" not in cfg and "lm_head.weight" in sd


@pytest.mark.parametrize("name", ["v1", "gda_4_1"])
def test_motif_takes_a_spec_and_the_released_keys_of_before_warn_and_build_the_same_model(name, tmp_path):
    """MotifLM's attention is one ``attention`` spec (what :func:`motif_kwargs` gives); the released config's keys as
    arguments, its spelling before the spec, warn once and build the identical model, and a ``config.json`` saved
    with them flat loads silently to it."""
    cfg = CONFIGS[name]
    kwargs = convert.motif_kwargs(cfg)
    attention = kwargs.pop("attention")
    flat = dict(lambda_init="motif", num_kv_heads=attention["num_kv_heads"], qkv_bias=attention["qkv_bias"],
                out_bias=attention["out_bias"], attn_norm_eps=attention["sub_norm_eps"],
                rope_theta=attention["rope_theta"], num_noise_heads=cfg.get("num_noise_heads", 2),
                head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]))
    torch.manual_seed(0)
    spec_model = MotifLM(**kwargs, attention=attention).eval()
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match="loose spelling") as caught:
        loose_model = MotifLM(**kwargs, **flat).eval()
    assert len(caught) == 1 and loose_model.attention_spec.kind == attention["kind"]
    assert loose_model.attention_spec == spec_model.attention_spec.__class__.from_dict(attention)
    ids = torch.randint(0, cfg["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(spec_model(ids), loose_model(ids))
    spec_model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["attention"]["kind"] == attention["kind"] and "lambda_init" not in saved
    old = {k: v for k, v in saved.items() if k != "attention"} | flat  # a config.json written before the spec
    (tmp_path / "m" / "config.json").write_text(json.dumps(old))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = diffattn.from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is MotifLM and loaded.attention_spec == spec_model.attention_spec
    with torch.no_grad():
        assert torch.equal(loaded(ids), spec_model(ids))


#: what vLLM's Motif model code reads from config.json (``MotifDecoderLayer`` / ``MotifAttention`` / ``MotifMLP`` in
#: vllm/model_executor/models/motif.py, vLLM ≤ 0.10.2) and the checkpoint names its loader maps (q/k/v_proj stacked
#: into qkv_proj, gate/up_proj into gate_up_proj, as LlamaForCausalLM.load_weights does)
VLLM_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "hidden_act",
                    "rms_norm_eps", "attn_rms_norm_eps", "rope_theta", "max_position_embeddings", "attention_bias",
                    "use_bias", "qkv_bias", "vocab_size", "num_hidden_layers", "tie_word_embeddings")
VLLM_LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                      "self_attn.o_proj.weight", "self_attn.lambda_q1", "self_attn.lambda_k1", "self_attn.lambda_q2",
                      "self_attn.lambda_k2", "self_attn.subln.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                      "mlp.down_proj.weight", "mlp.act_fn.weight", "mlp.act_fn.bias", "input_layernorm.weight",
                      "post_attention_layernorm.weight")


@pytest.mark.parametrize("name", ["v1", "gda_4_1"])
def test_a_model_written_by_to_motif_has_what_the_serving_code_reads(name, tmp_path):
    """The serving hand-off of docs/released-models.md: a MotifLM built in diffattn (not converted) written by
    to_motif is a folder with every config entry and tensor name vLLM's Motif code reads, shaped as it builds them
    (head_dim and num_noise_heads for GDA), and that from_motif loads back bit-identically."""
    cfg = CONFIGS[name]
    model = convert.from_motif(released_state_dict(cfg), config=cfg)
    kwargs = convert.motif_kwargs(cfg)
    fresh = MotifLM(**kwargs).double()  # a model of its own, e.g. after fine-tuning in diffattn
    written, sd = convert.to_motif(fresh, tmp_path / "out")
    on_disk = json.loads((tmp_path / "out" / "config.json").read_text())
    assert on_disk == written and all(k in on_disk for k in VLLM_CONFIG_KEYS)
    assert on_disk["architectures"] == ["MotifForCausalLM"] and on_disk["model_type"] == "motif"
    ref = released_state_dict(cfg)
    assert sd.keys() == ref.keys() and all(sd[k].shape == ref[k].shape for k in ref)
    for i in range(cfg["num_hidden_layers"]):
        assert all(f"model.layers.{i}.{t}" in sd for t in VLLM_LAYER_TENSORS)
    if name == "gda_4_1":
        assert on_disk["num_noise_heads"] == 2 and on_disk["head_dim"] == 8
    back = convert.from_motif(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), fresh.state_dict().values()))
    assert type(model) is type(back)


def test_the_released_spelling_motif_round_trips_and_model_type_alone_identifies_a_folder(tmp_path):
    """The released folders say ``model_type: "Motif"``: to_motif writes back the spelling it was given (a round
    trip keeps every entry), and a folder with that model_type and no ``architectures`` loads as Motif (from_motif,
    from_pretrained and the path-kind check alike)."""
    from diffattn.formats import saved_kind

    cfg = {**GDA, "model_type": "Motif"}
    sd = released_state_dict(cfg)
    model = convert.from_motif(write_released(tmp_path / "released", cfg, sd))
    back_cfg, _ = convert.to_motif(model, tmp_path / "written", base_config=cfg)
    assert back_cfg["model_type"] == "Motif" and {k: back_cfg[k] for k in cfg} == cfg
    assert json.loads((tmp_path / "written" / "config.json").read_text())["model_type"] == "Motif"
    assert convert.motif_config(model)["model_type"] == "motif"  # no source spelling: the lower-case one

    bare = {k: v for k, v in cfg.items() if k != "architectures"}
    folder = write_released(tmp_path / "bare", bare, sd)
    assert saved_kind(folder) is not None and "from_motif" in saved_kind(folder)[1]
    ids = torch.randint(0, cfg["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for loaded in (convert.from_motif(folder), diffattn.from_pretrained(folder)):
            assert type(loaded) is MotifLM and loaded.attention == "grouped"
            assert torch.equal(loaded(ids), model(ids))


@pytest.mark.parametrize("k_ratio", [1, 2, 0.5])
def test_k_ratio_is_said_not_read_and_the_model_is_what_vllm_computes(k_ratio, tmp_path):
    """The public Motif model code has no k_ratio (its key heads are signal/noise pairs, num_noise_heads sets the
    grouping) and serves a folder that has one as if it had none: diffattn builds the same model, and says so with a
    warning naming the key; null (or no key) is silent."""
    cfg = {**GDA, "k_ratio": k_ratio}
    sd = released_state_dict(GDA)
    folder = write_released(tmp_path / "m", cfg, sd)
    with pytest.warns(UserWarning, match=rf"config\.k_ratio={k_ratio!r} is not read"):
        assert convert.motif_kwargs(cfg) == convert.motif_kwargs(GDA)
    with pytest.warns(UserWarning, match="k_ratio"):
        model = convert.from_motif(folder)
    ids = torch.randint(0, GDA["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(ids)[0] - motif_logits(GDA, sd, ids[0])).abs().max().item() <= 1e-10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert convert.motif_kwargs({**GDA, "k_ratio": None}) == convert.motif_kwargs(GDA)


def test_a_null_qkv_bias_means_no_qkv_bias_as_vllm_reads_it(tmp_path):
    """vLLM's MotifDecoderLayer takes ``config.qkv_bias`` whenever the key exists (``hasattr``): null is no q/k/v
    bias even with attention_bias set (o_proj keeps its bias); an absent key follows attention_bias / use_bias."""
    from diffattn.serve.checkpoints import reference_model

    cfg = {**GDA, "attention_bias": True, "qkv_bias": None}
    sd = released_state_dict(cfg)
    assert "model.layers.0.self_attn.o_proj.bias" in sd and "model.layers.0.self_attn.q_proj.bias" not in sd
    model = convert.from_motif(write_released(tmp_path / "m", cfg, sd))
    attn = model.blocks[0].attn
    assert attn.q_proj.bias is None and attn.k_proj.bias is None and attn.out_proj.bias is not None
    ids = torch.randint(0, cfg["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids)[0] - motif_logits(cfg, sd, ids[0])).abs().max().item() <= 1e-10
    ref = reference_model("motif", cfg)  # what a server builds: the same rule
    assert ref.blocks[0].attn.q_proj.bias is None and ref.blocks[0].attn.out_proj.bias is not None
    back_cfg, back = convert.to_motif(model, base_config=cfg)
    assert back_cfg["qkv_bias"] is None and back.keys() == sd.keys()
    absent = {k: v for k, v in cfg.items() if k != "qkv_bias"}
    assert convert.motif_kwargs(absent)["attention"]["qkv_bias"] is True
    assert convert.motif_kwargs({**cfg, "qkv_bias": False}) == convert.motif_kwargs(cfg)
