"""Checkpoint loaders: each source is generated locally in its exact key format; loading is exact and the
outputs match.

The DiffCLIP reference below is written from the DiffCLIP code's published semantics (SLIP-style keys, timm
ViT with DiffCLIP's attention names, QuickGELU text tower, λ_init 0.8, sub-norm eps 1e-5, block LayerNorm
eps 1e-5) as plain tensor algebra on the raw state dict, independent of diffattn's modules.
"""

import argparse
import json

import pytest
import torch
import torch.nn.functional as F

from diffattn import convert

# ---------------------------------------------------------------------------- DiffCLIP release format

W, HEADS, DEPTH, PATCH, IMG, CTX, VOCAB, EMBED = 32, 4, 2, 8, 16, 8, 100, 16
D = W // HEADS  # head width


def _diffclip_state_dict(text_diff: bool = True) -> dict:
    g = torch.Generator().manual_seed(1)

    def r(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    sd = {"visual.cls_token": r(1, 1, W), "visual.pos_embed": r(1, (IMG // PATCH) ** 2 + 1, W),
          "visual.patch_embed.proj.weight": r(W, 3, PATCH, PATCH), "visual.patch_embed.proj.bias": r(W),
          "visual.norm.weight": 1 + r(W), "visual.norm.bias": r(W),
          "token_embedding.weight": r(VOCAB, W), "positional_embedding": r(CTX, W),
          "ln_final.weight": 1 + r(W), "ln_final.bias": r(W),
          "image_projection": r(W, EMBED), "text_projection": r(W, EMBED), "logit_scale": torch.tensor(2.659)}

    def block(prefix, norms, mlp, diff):
        n1, n2 = norms
        fc1, fc2 = mlp
        for n in (n1, n2):
            sd[f"{prefix}{n}.weight"], sd[f"{prefix}{n}.bias"] = 1 + r(W), r(W)
        sd[f"{prefix}{fc1}.weight"], sd[f"{prefix}{fc1}.bias"] = r(4 * W, W), r(4 * W)
        sd[f"{prefix}{fc2}.weight"], sd[f"{prefix}{fc2}.bias"] = r(W, 4 * W), r(W)
        if diff:
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                sd[f"{prefix}attn.{p}.weight"], sd[f"{prefix}attn.{p}.bias"] = r(W, W), r(W)
            for p in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                sd[f"{prefix}attn.{p}"] = r(D, std=0.3)
            sd[f"{prefix}attn.diff_norm.weight"] = 1 + r(2 * D)
        else:  # nn.MultiheadAttention (SLIP's text tower)
            sd[f"{prefix}attn.in_proj_weight"], sd[f"{prefix}attn.in_proj_bias"] = r(3 * W, W), r(3 * W)
            sd[f"{prefix}attn.out_proj.weight"], sd[f"{prefix}attn.out_proj.bias"] = r(W, W), r(W)

    for i in range(DEPTH):
        block(f"visual.blocks.{i}.", ("norm1", "norm2"), ("mlp.fc1", "mlp.fc2"), True)
        block(f"transformer.resblocks.{i}.", ("ln_1", "ln_2"), ("mlp.c_fc", "mlp.c_proj"), text_diff)
    return sd


def _ref_attn(sd, p, x, causal, diff):
    B, N, _ = x.shape
    mask = torch.full((N, N), float("-inf")).triu(1) if causal else torch.zeros(N, N)
    if not diff:
        qkv = F.linear(x, sd[p + "in_proj_weight"], sd[p + "in_proj_bias"])
        q, k, v = (t.view(B, N, HEADS, D).transpose(1, 2) for t in qkv.chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) * D**-0.5 + mask, -1)
        o = (a @ v).transpose(1, 2).reshape(B, N, W)
        return F.linear(o, sd[p + "out_proj.weight"], sd[p + "out_proj.bias"])
    q, k, v = (F.linear(x, sd[f"{p}{n}.weight"], sd[f"{p}{n}.bias"]) for n in ("q_proj", "k_proj", "v_proj"))
    q = q.view(B, N, HEADS, D).transpose(1, 2) * D**-0.5
    k = k.view(B, N, HEADS, D).transpose(1, 2)
    v = v.view(B, N, HEADS // 2, 2 * D).transpose(1, 2)
    a = torch.softmax(q @ k.transpose(-1, -2) + mask, -1).view(B, HEADS // 2, 2, N, N)
    lam = (torch.exp((sd[p + "lambda_q1"] * sd[p + "lambda_k1"]).sum())
           - torch.exp((sd[p + "lambda_q2"] * sd[p + "lambda_k2"]).sum()) + 0.8)
    o = (a[:, :, 0] - lam * a[:, :, 1]) @ v
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * sd[p + "diff_norm.weight"] * (1 - 0.8)
    return F.linear(o.transpose(1, 2).reshape(B, N, W), sd[p + "out_proj.weight"], sd[p + "out_proj.bias"])


def _ref_block(sd, p, x, names, act, causal, diff):
    n1, n2, fc1, fc2 = names
    ln = lambda t, n: F.layer_norm(t, (W,), sd[f"{p}{n}.weight"], sd[f"{p}{n}.bias"], 1e-5)  # noqa: E731
    x = x + _ref_attn(sd, p + "attn.", ln(x, n1), causal, diff)
    return x + F.linear(act(F.linear(ln(x, n2), sd[f"{p}{fc1}.weight"], sd[f"{p}{fc1}.bias"])),
                        sd[f"{p}{fc2}.weight"], sd[f"{p}{fc2}.bias"])


def _ref_diffclip(sd, images, tokens, text_diff=True):
    x = F.conv2d(images, sd["visual.patch_embed.proj.weight"], sd["visual.patch_embed.proj.bias"],
                 stride=PATCH)
    x = torch.cat([sd["visual.cls_token"].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], 1)
    x = x + sd["visual.pos_embed"]
    for i in range(DEPTH):
        x = _ref_block(sd, f"visual.blocks.{i}.", x, ("norm1", "norm2", "mlp.fc1", "mlp.fc2"), F.gelu,
                       False, True)
    x = F.layer_norm(x, (W,), sd["visual.norm.weight"], sd["visual.norm.bias"], 1e-5)
    img = x[:, 0] @ sd["image_projection"]
    t = sd["token_embedding.weight"][tokens] + sd["positional_embedding"]
    quick = lambda u: u * torch.sigmoid(1.702 * u)  # noqa: E731
    for i in range(DEPTH):
        t = _ref_block(sd, f"transformer.resblocks.{i}.", t, ("ln_1", "ln_2", "mlp.c_fc", "mlp.c_proj"),
                       quick, True, text_diff)
    t = F.layer_norm(t, (W,), sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    return img, t[torch.arange(len(t)), tokens.argmax(-1)] @ sd["text_projection"]


def _inputs():
    images = torch.randn(2, 3, IMG, IMG)
    tokens = torch.randint(1, VOCAB - 1, (2, CTX))
    tokens[0, 5], tokens[1, 3] = VOCAB - 1, VOCAB - 1  # EOT = the largest id
    tokens[1, 4:] = 0
    return images, tokens


@pytest.mark.parametrize("text_diff", [True, False], ids=["diffclip", "diffclip_dagger"])
def test_diffclip_release_checkpoint_loads_exactly(tmp_path, text_diff):
    sd = _diffclip_state_dict(text_diff)
    ckpt = {"state_dict": {"module." + k: v for k, v in sd.items()}, "epoch": 39, "best_acc1": 14.4,
            "args": argparse.Namespace(model="DiffCLIP_VITB16", lr=5e-4), "optimizer": {"state": {}}}
    path = tmp_path / "checkpoint_best.pt"
    torch.save(ckpt, path)
    # a standard text tower does not reveal its heads (default width / 64): a DiffCLIP† file at this toy size
    # needs them, the real one (512 wide, 8 heads) does not
    model = convert.load_diffclip(path, **({} if text_diff else {"text_num_heads": HEADS})).eval()
    assert model.model_name == "diffclip_vit_b16"
    assert model.text.blocks[0].attn.__class__.__name__ == ("DiffAttention" if text_diff else "Attention")
    assert model.visual.blocks[0].attn.num_heads == HEADS and model.text.embed_dim == W
    ours = model.state_dict()
    converted = convert.convert_diffclip_state_dict(sd)
    assert set(ours) == set(converted)
    assert all(torch.equal(ours[k], converted[k]) for k in ours)
    images, tokens = _inputs()
    ref_img, ref_txt = _ref_diffclip(sd, images, tokens, text_diff)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), ref_img, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(model.encode_text(tokens), ref_txt, atol=2e-5, rtol=1e-5)


def test_read_checkpoint_rejects_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("unpickled",))

    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Evil()}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        convert.read_checkpoint(path)
    with pytest.raises(ValueError, match="path must be an existing checkpoint file"):
        convert.read_checkpoint(tmp_path / "missing.pt")


def test_unknown_keys_raise():
    sd = _diffclip_state_dict()
    sd["visual.blocks.0.ls1.gamma"] = torch.ones(W)
    with pytest.raises(ValueError, match="ls1.gamma"):
        convert.convert_diffclip_state_dict(sd)


# ------------------------------------------------------------------------------ OpenAI / open_clip


@pytest.fixture(scope="module")
def open_clip_tiny(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    d = tmp_path_factory.mktemp("oc_cfg")
    cfg = {"embed_dim": EMBED,
           "vision_cfg": {"image_size": IMG, "layers": 2, "width": W, "patch_size": PATCH, "head_width": 16},
           "text_cfg": {"context_length": CTX, "vocab_size": VOCAB, "width": W, "heads": 2, "layers": 2}}
    (d / "diffattn-test-tiny.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(d)
    return open_clip


@pytest.mark.parametrize("quick_gelu", [False, True], ids=["open_clip", "openai"])
def test_openai_and_open_clip_state_dicts_load_exactly(open_clip_tiny, quick_gelu):
    ref = open_clip_tiny.create_model("diffattn-test-tiny", pretrained=None, force_quick_gelu=quick_gelu)
    ref.eval()
    sd = ref.state_dict()
    assert "visual.conv1.weight" in sd and "transformer.resblocks.0.attn.in_proj_weight" in sd
    if quick_gelu:  # OpenAI's format from a plain state dict (head counts given, as for non-64-wide heads)
        model = convert.load_openai_clip(dict(sd), vision_num_heads=2, text_num_heads=2)
    else:  # open_clip from the model object: activation and head counts read from it
        model = convert.load_open_clip(ref)
    model.eval()
    assert model.visual.blocks[0].mlp.act.__class__.__name__ == ("QuickGELU" if quick_gelu else "GELU")
    images, tokens = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), ref.encode_image(images), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(model.encode_text(tokens), ref.encode_text(tokens), atol=2e-5, rtol=1e-5)
        assert torch.equal(model.logit_scale, ref.logit_scale)
    n_ref = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in model.parameters()) == n_ref


# ------------------------------------------------------------------------------------------- timm


def test_timm_vit_loads_exactly():
    timm = pytest.importorskip("timm")
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7, img_size=64).eval()
    model = convert.load_timm_vit(ref.state_dict(), name="vit_tiny_patch16_224").eval()
    assert (model.num_classes, model.patch_embed.img_size, len(model.blocks)) == (7, 64, 12)
    assert model.blocks[0].attn.num_heads == 3  # width 192 / 64
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())


def test_timm_vit_unsupported_keys_raise():
    timm = pytest.importorskip("timm")
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, init_values=1e-5)
    with pytest.raises(ValueError, match="ls1"):
        convert.load_timm_vit(ref)


def test_timm_vit_depth_is_bounded_before_building():
    """A small file whose one block key claims index 100000 must not make the loader build 100,001 blocks."""
    timm = pytest.importorskip("timm")
    sd = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32).state_dict()
    sd["blocks.100000.norm1.weight"] = torch.ones(192)
    with pytest.raises(ValueError, match=r"depth = 100001; depth must be an integer in \[1, 1024\]"):
        convert.load_timm_vit(sd)
    sd.pop("blocks.100000.norm1.weight")
    sd["blocks.3.norm1.weight"] = torch.ones(192)  # a hole: blocks 1 and 2 are absent
    with pytest.raises(ValueError, match=r"none for indices \[1, 2\]"):
        convert.load_timm_vit(sd)


def _timm_sd():
    timm = pytest.importorskip("timm")
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32).state_dict()


@pytest.mark.parametrize("case", ["empty", "no_patch_embed", "empty_pos_embed", "no_fc1", "no_blocks"])
def test_timm_vit_missing_or_empty_keys_are_clear_errors(case):
    """The 0.1.0 loaders raised KeyError (missing key) or ZeroDivisionError (empty tensor) here."""
    sd = _timm_sd()
    if case == "empty":
        sd, match = {}, "holds an empty state dict"
    elif case == "no_patch_embed":
        del sd["patch_embed.proj.weight"]
        match = r"timm ViT state dict has no 'patch_embed.proj.weight'"
    elif case == "empty_pos_embed":
        sd["pos_embed"] = torch.zeros(1, 0, 192)
        match = r"entry 'pos_embed' is empty"
    elif case == "no_fc1":
        del sd["blocks.0.mlp.fc1.weight"]
        match = r"has no 'blocks.0.mlp.fc1.weight'"
    else:
        sd = {k: v for k, v in sd.items() if not k.startswith("blocks.")}
        match = r"has no blocks under 'blocks.'"
    with pytest.raises(ValueError, match=match):
        convert.load_timm_vit(sd)


@pytest.mark.parametrize("case", ["no_projection", "empty_lambda", "lambda_width"])
def test_diffclip_missing_or_empty_keys_are_clear_errors(case):
    sd = _diffclip_state_dict()
    if case == "no_projection":
        del sd["image_projection"]
        match = r"has no 'image_projection'"
    elif case == "empty_lambda":
        sd["visual.blocks.0.attn.lambda_q1"] = torch.zeros(0)
        match = r"'visual.blocks.0.attn.lambda_q1' is empty"
    else:
        sd["visual.blocks.0.attn.lambda_q1"] = torch.zeros(5)
        match = r"lambda_q1 has 5 values, which does not divide the width 32"
    with pytest.raises(ValueError, match=match):
        convert.load_diffclip(sd)


def test_layer_converters_missing_keys_are_clear_errors():
    with pytest.raises(ValueError, match=r"timm state dict has no 'qkv.weight'"):
        convert.timm_to_diffattn_state_dict({"proj.weight": torch.zeros(4, 4)})
    with pytest.raises(ValueError, match=r"DiffAttention state dict has no 'q_proj.weight'"):
        convert.diffattn_to_timm_state_dict({})
    with pytest.raises(ValueError, match=r"DiffAttention state dict has no 'out_proj.weight'"):
        convert.diffattn_to_diffllama_state_dict({"q_proj.weight": torch.zeros(8, 8)}, num_heads=2, num_kv_heads=2,
                                                 head_dim=4)


def test_read_checkpoint_empty_files(tmp_path):
    from safetensors.torch import save_file

    save_file({}, str(tmp_path / "empty.safetensors"))
    with pytest.raises(ValueError, match="holds an empty state dict"):
        convert.read_checkpoint(tmp_path / "empty.safetensors")
    (tmp_path / "zero.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        convert.read_checkpoint(tmp_path / "zero.safetensors")


# ------------------------------------------------------------------------- TorchScript (OpenAI's .pt)


def test_openai_torchscript_archive_loads_without_executing_code(open_clip_tiny, tmp_path, monkeypatch):
    """OpenAI's released CLIP files are TorchScript archives. A tiny open_clip CLIP in OpenAI's format is scripted
    and saved with torch.jit.save; the loader reads its tensors with a restricted unpickler (torch.jit.load, which
    would compile and run the archive's code, is made to fail) and the model computes what the original does."""
    import warnings

    ref = open_clip_tiny.create_model("diffattn-test-tiny", pretrained=None, force_quick_gelu=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated upstream; OpenAI's files were made with it
        torch.jit.save(torch.jit.script(ref), str(tmp_path / "ViT-tiny.pt"))

    def no_jit(*a, **k):
        raise AssertionError("torch.jit.load must not be used")

    monkeypatch.setattr(torch.jit, "load", no_jit)
    sd = convert.read_checkpoint(tmp_path / "ViT-tiny.pt")
    ref_sd = ref.state_dict()
    assert set(sd) == set(ref_sd) | {"attn_mask"}  # open_clip's non-persistent causal mask is an attribute too
    assert all(torch.equal(sd[k], ref_sd[k]) for k in ref_sd)
    model = convert.load_openai_clip(tmp_path / "ViT-tiny.pt", vision_num_heads=2, text_num_heads=2).eval()
    images, tokens = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), ref.encode_image(images), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(model.encode_text(tokens), ref.encode_text(tokens), atol=2e-5, rtol=1e-5)


class _Shout:
    def __reduce__(self):
        return (print, ("archive code ran",))


def test_torchscript_reader_refuses_foreign_globals(tmp_path, capsys):
    """An archive shaped like TorchScript whose data.pkl calls a function: refused, and the function never runs."""
    import pickle
    import zipfile

    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": _Shout()}, protocol=2))
        z.writestr("archive/constants.pkl", pickle.dumps((), protocol=2))
        z.writestr("archive/version", "3\n")
    with pytest.raises(ValueError, match=r"refers to __builtin__.print, which is not a tensor or container"):
        convert.read_checkpoint(path)
    assert "archive code ran" not in capsys.readouterr().out
