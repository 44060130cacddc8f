"""Differential attention inside Ultralytics YOLO: the modules against float64 references of their equations, the
shipped YAMLs through ``YOLO(...)``, the retrofit of Ultralytics' ``Attention`` (step-0 identity, exactly those
modules, adapter round trip), and offline validation / training on the generated detection set."""

from __future__ import annotations

import copy
import functools
import math
import os
import tempfile

import pytest
import torch

os.environ.setdefault("YOLO_OFFLINE", "1")  # before ultralytics is imported: no online probe
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="diffattn-yolo-"))  # never the user's settings
pytest.importorskip("ultralytics", reason="the detector tests need the optional extra diffattn[detect]")

from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.nn.modules.block import Attention  # noqa: E402

import diffattn  # noqa: E402
from diffattn.adapters import load_adapter, save_adapter, step  # noqa: E402
from diffattn.adapters.methods import METHODS  # noqa: E402
from diffattn.detect import (  # noqa: E402
    MODEL_YAMLS,
    DiffAttention2d,
    DiffPSAAttention,
    attention_maps,
    model_yaml,
    yolo,
)

BASE_PARAMS = 2_572_280  # yolo26n.yaml, as Ultralytics' own summary reports it


def _loss(model, x):
    """Ultralytics' detection loss of ``model`` (train mode) on ``x`` with two boxes."""
    model.args = get_cfg()
    batch = {"img": x, "batch_idx": torch.tensor([0.0, 1.0]), "cls": torch.tensor([[1.0], [2.0]]),
             "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.4], [0.3, 0.3, 0.2, 0.2]])}
    loss, _ = model.loss(batch)
    return loss.sum()


# ------------------------------------------------------------------------------------------ references


def _rms(x, w, eps=1e-5):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _lam(m):
    m = {k: getattr(m, k).detach().double() for k in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")} | {
        "lambda_init": m.lambda_init}
    return (math.exp(float(torch.dot(m["lambda_q1"], m["lambda_k1"])))
            - math.exp(float(torch.dot(m["lambda_q2"], m["lambda_k2"]))) + m["lambda_init"])


def _psa_reference(m: DiffPSAAttention, x: torch.Tensor) -> torch.Tensor:
    """Ye et al. 2024 eq. 1–3 on Ultralytics' QKV layout, one differential head at a time, float64."""
    B, C, H, W = x.shape
    N, h, dk, dv = H * W, m.num_heads, m.key_dim, m.head_dim
    qkv = m.qkv(x).reshape(B, h, 2 * dk + dv, N)
    lam = _lam(m)
    outs = []
    for i in range(h // 2):
        a = []
        for j in (2 * i, 2 * i + 1):
            q, k = qkv[:, j, :dk], qkv[:, j, dk:2 * dk]  # (B, d_k, N)
            a.append(torch.softmax(torch.einsum("bcn,bcm->bnm", q, k) / math.sqrt(dk), dim=-1))
        v = torch.cat([qkv[:, 2 * i, 2 * dk:], qkv[:, 2 * i + 1, 2 * dk:]], dim=1)  # (B, 2 d_v, N)
        o = torch.einsum("bnm,bcm->bnc", a[0] - lam * a[1], v)  # (B, N, 2 d_v)
        outs.append(_rms(o, m.diff_norm.weight) * (1 - m.lambda_init))
    o = torch.cat(outs, dim=-1).transpose(1, 2).reshape(B, C, H, W)
    v_all = qkv[:, :, 2 * dk:].reshape(B, C, H, W)
    return m.proj(o + m.pe(v_all))


def _diff_attention_reference(attn, t: torch.Tensor) -> torch.Tensor:
    """DiffCLIP's multi-head differential attention (Hammoud & Ghanem 2025 §3.1) on tokens t (B, N, D), float64."""
    B, N, D = t.shape
    h, d = attn.num_heads, D // attn.num_heads
    q, k, v = attn.q_proj(t), attn.k_proj(t), attn.v_proj(t)
    lam = _lam(attn)
    outs = []
    for i in range(h // 2):
        a = [torch.softmax(q[..., j * d:(j + 1) * d] @ k[..., j * d:(j + 1) * d].transpose(1, 2) / math.sqrt(d), -1)
             for j in (2 * i, 2 * i + 1)]
        o = (a[0] - lam * a[1]) @ v[..., 2 * i * d:(2 * i + 2) * d]
        outs.append(_rms(o, attn.diff_norm.weight) * (1 - attn.lambda_init))
    return attn.out_proj(torch.cat(outs, dim=-1))


def _randomize(m):
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lambda" in name or "diff_norm" in name or "bn" in name:
                p.copy_(torch.randn_like(p) * (0.3 if "lambda" in name else 0.2) + (1.0 if "weight" in name and
                                                                                      "bn" in name else 0.0))
    return m


# ------------------------------------------------------------------------------------------ modules


@pytest.mark.parametrize("dim,heads", [(64, 2), (96, 4)])
def test_diff_psa_attention_matches_float64_reference(dim, heads):
    torch.manual_seed(0)
    m = _randomize(DiffPSAAttention(dim, heads)).double().eval()
    x = torch.randn(2, dim, 5, 3, dtype=torch.float64)
    assert torch.allclose(m(x), _psa_reference(m, x), atol=1e-10, rtol=1e-9)
    assert abs(float(m.lambda_value().detach()) - _lam(m)) < 1e-12


def test_diff_psa_attention_keeps_ultralytics_layout_and_adds_lambda_and_norm():
    std, diff = Attention(128, num_heads=2), DiffPSAAttention(128, num_heads=2)
    s_std, s_diff = std.state_dict(), diff.state_dict()
    assert {k: v.shape for k, v in s_std.items()} == {k: s_diff[k].shape for k in s_std}
    extra = set(s_diff) - set(s_std)
    assert extra == {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "diff_norm.weight"}
    added = sum(p.numel() for p in diff.parameters()) - sum(p.numel() for p in std.parameters())
    assert added == 4 * std.key_dim + 2 * std.head_dim  # 4 d_k λ values + the 2 d_v norm weight
    assert diff.lambda_q1.dtype == torch.float32
    diff.load_state_dict(s_std, strict=False)  # a standard checkpoint's convolutions load as they are
    assert torch.equal(diff.qkv.conv.weight, std.qkv.conv.weight)


def test_diff_attention2d_matches_float64_reference_and_residual():
    torch.manual_seed(1)
    m = DiffAttention2d(32, 32, num_heads=4).double().eval()
    _randomize(m.attn)
    x = torch.randn(2, 32, 3, 4, dtype=torch.float64)
    t = x.flatten(2).transpose(1, 2)
    ref = _diff_attention_reference(m.attn, t).transpose(1, 2).reshape(x.shape)
    assert torch.allclose(m(x), x + ref, atol=1e-10)
    m.residual = False
    assert torch.allclose(m(x), ref, atol=1e-10)
    maps = m.attention_maps(x)
    assert maps.shape == (2, 2, 12, 12)
    assert torch.allclose(maps.sum(-1), torch.full((2, 2, 12), 1 - _lam(m.attn), dtype=maps.dtype), atol=1e-6)


def test_diff_attention2d_projects_channels():
    m = DiffAttention2d(16, 32, num_heads=4)
    assert m(torch.randn(1, 16, 4, 4)).shape == (1, 32, 4, 4)


@pytest.mark.parametrize("kwargs,match", [({"dim": 64, "num_heads": 3}, "num_heads must be even"),
                                          ({"dim": 64, "num_heads": 0}, "num_heads must be a positive int")])
def test_diff_psa_attention_rejects_bad_heads(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiffPSAAttention(**kwargs)


def test_modules_reject_wrong_input():
    with pytest.raises(ValueError, match=r"x must be a feature map of shape \(B, C=64, H, W\), got \(1, 32, 4, 4\)"):
        DiffPSAAttention(64, 2)(torch.randn(1, 32, 4, 4))
    with pytest.raises(ValueError, match=r"C=16.*\(2, 16, 16\)"):
        DiffAttention2d(16, 16, num_heads=2)(torch.randn(2, 16, 16))
    with pytest.raises(ValueError, match="residual must be a bool"):
        DiffAttention2d(16, 16, 2, 0.8, "yes")


# ------------------------------------------------------------------------------------------ YAMLs


@pytest.mark.parametrize("name", MODEL_YAMLS)
def test_shipped_yaml_builds_runs_and_trains(name):
    torch.manual_seed(0)
    model = yolo(name)
    assert type(model).__name__ == "YOLO" and model.task == "detect"
    net = model.model
    kinds = [type(m).__name__ for m in net.modules()]
    if "diffpsa" in name:
        assert kinds.count("DiffPSAAttention") == 2 and "Attention" not in kinds
        assert type(net.model[10]).__name__ == "DiffC2PSA" and type(net.model[22]).__name__ == "DiffC3k2"
    else:
        assert kinds.count("DiffAttention2d") == 1 and isinstance(net.model[10], DiffAttention2d)
        assert kinds.count("Attention") == 1  # the head's C3k2 attention stays standard
    if name == "yolo26n-diffpsa":  # 2 layers × (4 d_k + 2 d_v), d_k = 32, d_v = 64
        assert sum(p.numel() for p in net.parameters()) == BASE_PARAMS + 2 * (4 * 32 + 2 * 64)
    if name == "yolo26n-diffattn":
        assert net.model[10].attn.dim == 256 and net.model[10].attn.num_heads == 8  # width 0.25 × 1024
    x = torch.rand(2, 3, 64, 64)
    net.eval()
    with torch.no_grad():
        y = net(x)
    assert y[0].shape == (2, 84, 84) and torch.isfinite(y[0]).all()  # 4 box + 80 class rows, 8² + 4² + 2² anchors
    net.train()
    loss = _loss(net, x)
    loss.backward()
    lam = [p for n, p in net.named_parameters() if n.endswith("lambda_q1")]
    assert lam and all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in lam)


def test_yaml_scale_follows_file_name():
    n, s = yolo("yolo26n-diffattn").model, yolo("yolo26s-diffattn.yaml").model
    assert n.model[10].c2 == 256 and s.model[10].c2 == 512


def test_model_yaml_rejects_unknown_names():
    with pytest.raises(ValueError, match="name must be one of"):
        model_yaml("yolo26n-nothing")
    with pytest.raises(TypeError, match="name must be a str"):
        model_yaml(3)
    assert model_yaml("yolo26n-diffpsa.yaml").is_file()


def test_attention_maps_cover_every_attention_layer():
    torch.manual_seed(0)
    for name, kinds in (("yolo26n.yaml", 2), ("yolo26n-diffpsa", 2), ("yolo26n-diffattn", 2)):
        net = yolo(name).model.eval()
        maps = attention_maps(net, torch.rand(1, 3, 64, 64))
        assert len(maps) == kinds
        for _, a, (h, w) in maps:
            assert a.shape[-2:] == (h * w, h * w) and torch.isfinite(a).all()
        if name == "yolo26n.yaml":  # standard softmax rows sum to 1
            assert torch.allclose(maps[0][1].sum(-1), torch.ones(()), atol=1e-5)


def test_diagnostics_capture_the_differential_detectors_attention():
    """capture_attention records DiffPSAAttention (through attention_weights) and DiffAttention2d's inner
    DiffAttention, with the maps attention_maps gives and the model's output untouched."""
    from diffattn.diagnostics import capture_attention

    torch.manual_seed(0)
    x = torch.rand(1, 3, 64, 64)
    for name, layers in (("yolo26n-diffpsa", ["model.10.m.0.attn", "model.22.m.0.1.attn"]),
                         ("yolo26n-diffattn", ["model.10.attn"])):
        net = yolo(name).model.eval()
        with torch.no_grad():
            ref = net(x)[0]
            with capture_attention(net) as cap:
                got = net(x)[0]
        assert torch.equal(got, ref)
        assert [m.name for m in cap.layers if m.name in layers] == layers
        maps = {n: a for n, a, _ in attention_maps(net, x)}
        for m in cap.layers:
            if type(net.get_submodule(m.name)) is Attention:  # yolo26n-diffattn keeps its C2PSA attention standard
                assert name == "yolo26n-diffattn" and m.kind == "standard"
                continue
            assert m.kind == "diff" and m.second is not None and m.lambda_ is not None
            if m.name in maps:  # the PSA layers: the same combined map as attention_maps
                torch.testing.assert_close(m.combined, maps[m.name], atol=1e-6, rtol=1e-5)
            lam = m.lambda_.reshape(1, -1, 1, 1)
            torch.testing.assert_close(m.combined, m.first - lam * m.second, atol=1e-5, rtol=1e-5)


def test_diagnostics_capture_ultralytics_standard_attention():
    """capture_attention records Ultralytics' own Attention of yolo26n (standard softmax maps, rows summing to 1,
    equal to attention_maps and to an independent float64 softmax(q kᵀ s)), output untouched; after a retrofit the
    same modules are captured as retrofits instead."""
    from diffattn.diagnostics import attention_modules, capture_attention

    torch.manual_seed(0)
    x = torch.rand(2, 3, 64, 64)
    net = copy.deepcopy(_base_model())
    assert [(n, how) for n, _, how in attention_modules(net)] == [("model.10.m.0.attn", "maps"),
                                                                  ("model.22.m.0.1.attn", "maps")]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: inputs.__setitem__(n, a[0].double()))
             for n, m, _ in attention_modules(net)]
    with torch.no_grad():
        ref = net(x)[0]
        with capture_attention(net) as cap:
            got = net(x)[0]
    for h in hooks:
        h.remove()
    assert torch.equal(got, ref)
    maps = {n: a for n, a, _ in attention_maps(net, x)}
    assert [m.name for m in cap.layers] == list(maps)
    for m in cap.layers:
        assert m.kind == "standard" and m.second is None and m.lambda_ is None
        assert torch.equal(m.first, m.combined)
        torch.testing.assert_close(m.combined, maps[m.name])
        torch.testing.assert_close(m.combined.sum(-1), torch.ones(m.combined.shape[:-1]), atol=1e-5, rtol=0)
        mod = net.get_submodule(m.name).double()  # float64 reference of A = softmax(q kᵀ / √d_k)
        inp = inputs[m.name]
        B, _, H, W = inp.shape
        q, k, _ = mod.qkv(inp).view(B, mod.num_heads, -1, H * W).split([mod.key_dim, mod.key_dim, mod.head_dim], 2)
        a = torch.softmax(q.transpose(-2, -1) @ k / mod.key_dim**0.5, dim=-1)
        mod.float()
        torch.testing.assert_close(m.combined.double(), a, atol=1e-5, rtol=1e-4)
    diffattn.retrofit(net, "daa")
    assert {how for _, _, how in attention_modules(net)} == {"retrofit"}


# ------------------------------------------------------------------------------------------ retrofit


@functools.cache
def _base_model():
    torch.manual_seed(0)
    net = yolo("yolo26n.yaml").model.eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so Q, K and V are not near zero
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net


def _base():
    """A fresh copy of one randomly initialised yolo26n (built once)."""
    return copy.deepcopy(_base_model())


def _run(net, x, names):
    """(model output, {attention module name: its output}) for x."""
    seen = {}
    hooks = [net.get_submodule(n).register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, o)) for n in names]
    with torch.no_grad():
        y = net(x)[0]
    for h in hooks:
        h.remove()
    return y, seen


@pytest.mark.parametrize("method", METHODS)
def test_retrofit_keeps_outputs_at_step_zero_and_replaces_only_attention(method):
    net = _base()
    names = [n for n, m in net.named_modules() if type(m) is Attention]
    assert names == ["model.10.m.0.attn", "model.22.m.0.1.attn"]
    x = torch.rand(2, 3, 64, 64)
    y0, a0 = _run(net, x, names)
    before = {n: type(m) for n, m in net.named_modules()}
    diffattn.retrofit(net, method, anneal_steps=4)
    changed = [n for n, m in net.named_modules() if n in before and type(m) is not before[n]]
    assert changed == names
    assert all(type(net.get_submodule(n)).__name__ == "UltralyticsDiffAttention" for n in names)
    y1, a1 = _run(net, x, names)
    assert torch.allclose(y1, y0, atol=1e-5, rtol=1e-5)
    for n in names:
        assert torch.allclose(a1[n], a0[n], atol=1e-5, rtol=1e-5)
    step(net, 2)  # t = T/2: λ(t) = 0.2 (DAA (2025) eq. 3), blend β = 0.5 (Li et al.): the attention output moves
    _, a2 = _run(net, x, names)
    rel = (a2[names[0]] - a0[names[0]]).norm() / a0[names[0]].norm()
    assert rel > 1e-3


def test_retrofit_adapter_sizes_follow_key_and_value_widths():
    net = diffattn.retrofit(_base(), "daa")
    a = net.get_submodule("model.10.m.0.attn").diff_adapter
    assert a.W_daa.shape == (2, 32, 32)  # key width d_k
    net = diffattn.retrofit(_base(), "dex")
    assert net.get_submodule("model.10.m.0.attn").diff_adapter.W_dex.shape == (2, 64, 64)  # value width d_v
    net = diffattn.retrofit(_base(), "split_heads")
    a = net.get_submodule("model.22.m.0.1.attn").diff_adapter
    assert a.diff_norm.weight.shape == (64,) and a.lam.lambda_q1.shape == (16,)


def test_retrofit_adapter_round_trip(tmp_path):
    base = _base()
    fresh = copy.deepcopy(base)
    net = diffattn.retrofit(base, "daa", anneal_steps=10)
    step(net, 3)
    with torch.no_grad():
        for _, a in diffattn.adapters.adapters(net):
            a.W_daa.add_(0.05 * torch.randn_like(a.W_daa))
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        want = net(x)[0]
    save_adapter(net, tmp_path / "adapter")
    loaded = load_adapter(fresh, tmp_path / "adapter")
    with torch.no_grad():
        got = loaded(x)[0]
    assert torch.equal(got, want)
    assert not torch.allclose(_base()(x)[0], want, atol=1e-4)


def test_retrofit_maps_are_the_combined_map():
    net = diffattn.retrofit(_base(), "daa", anneal_steps=4)
    step(net, 2)  # λ(T/2) = (1 − 1/2)·(1/2)·0.8 + (1/2)·λ_learn, λ_learn = 0 at init
    maps = attention_maps(net, torch.rand(1, 3, 64, 64))
    lam = float(net.get_submodule("model.10.m.0.attn").diff_adapter.lambda_value().detach())
    assert len(maps) == 2 and abs(lam - 0.2) < 1e-6
    assert torch.allclose(maps[0][1].sum(-1), torch.full((), 1 - lam), atol=1e-5)  # rows of A1 − λ A2


# ------------------------------------------------------------------------------------------ offline data


@pytest.fixture(scope="module")
def detect_data(tmp_path_factory):
    from diffattn.data import DATASETS
    from diffattn.data.detection import export_detection

    if not DATASETS["tuxpaint_captions"].installed():
        pytest.skip("tuxpaint_captions is not prepared (run `make data`)")
    out = tmp_path_factory.mktemp("det") / "tuxpaint_detect"
    export_detection(out, n_train=8, n_val=4, imgsz=64, stamps_per_category=3)
    return out / "data.yaml"


def test_val_reads_the_generated_dataset(detect_data):
    from diffattn.detect import OFFLINE_VAL_ARGS

    metrics = yolo("yolo26n-diffpsa").val(data=str(detect_data), imgsz=64, batch=4, **OFFLINE_VAL_ARGS)
    assert 0.0 <= float(metrics.box.map50) <= 1.0 and 0.0 <= float(metrics.box.map) <= 1.0
    assert set(metrics.ap_class_index.tolist()) <= {0, 1, 2, 3}  # the generated labels were read: classes 0–3
    assert int(metrics.nt_per_class.sum()) > 0 and int(metrics.nt_per_class[4:].sum()) == 0


def test_one_epoch_offline_training(detect_data, tmp_path):
    from diffattn.detect import OFFLINE_TRAIN_ARGS

    model = yolo("yolo26n-diffattn")
    model.train(data=str(detect_data), epochs=1, imgsz=64, batch=4, project=str(tmp_path), name="run", val=False,
                **OFFLINE_TRAIN_ARGS)
    best = tmp_path / "run" / "weights" / "best.pt"
    assert best.is_file()
    reloaded = yolo(str(best)).model
    assert isinstance(reloaded.model[10], DiffAttention2d)


@pytest.mark.parametrize("name,method", [("yolo26n-diffpsa", None), ("yolo26n-diffattn", None),
                                         ("yolo26n.yaml", "daa"), ("yolo26n.yaml", "split_heads")])
def test_predict_and_torchscript_export_through_ultralytics(name, method, tmp_path, monkeypatch):
    """model.predict and model.export(format="torchscript") work on the differential models and on a retrofitted
    yolo26n; the exported program gives the eager model's output exactly."""
    import warnings

    import numpy as np

    monkeypatch.chdir(tmp_path)  # export writes beside the model's file name, in the working directory
    torch.manual_seed(0)
    model = yolo(name)
    if method:
        diffattn.retrofit(model.model, method)
    image = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype("uint8")
    (result,) = model.predict(image, imgsz=64, device="cpu", verbose=False)
    assert result.boxes.data.shape[-1] == 6 and result.orig_shape == (64, 64)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = model.model.eval()(x)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings and the torch.jit deprecation notice
        path = model.export(format="torchscript", imgsz=64, device="cpu", verbose=False)
        with torch.no_grad():
            got = torch.jit.load(path)(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert got.shape == ref.shape == (1, 84, 84)  # 8² + 4² + 2² anchors, 4 box + 80 class values
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,method", [("yolo26n-diffpsa", None), ("yolo26n-diffattn", None),
                                         ("yolo26n.yaml", "split_heads")])
def test_onnx_export_through_ultralytics_runs_in_onnxruntime(name, method, tmp_path, monkeypatch):
    """model.export(format="onnx") (Ultralytics' defaults: TorchScript-based exporter, onnxslim) works on the
    differential models and a retrofit, and onnxruntime gives the eager model's output."""
    import warnings

    ort = pytest.importorskip("onnxruntime", reason="ONNX export needs the extra diffattn[export]")
    pytest.importorskip("onnxslim", reason="Ultralytics simplifies ONNX with onnxslim (diffattn[export])")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = yolo(name)
    if method:
        diffattn.retrofit(model.model, method)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = model.model.eval()(x)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = model.export(format="onnx", imgsz=64, device="cpu", verbose=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    assert got.shape == ref.shape == (1, 84, 84)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_retrofitted_yolo_fine_tunes_through_ultralytics(detect_data, tmp_path):
    from diffattn.detect import OFFLINE_TRAIN_ARGS, retrofit_trainer

    model = yolo("yolo26n.yaml")
    diffattn.retrofit(model.model, "daa", anneal_steps=100)
    model.train(data=str(detect_data), epochs=1, imgsz=64, batch=4, project=str(tmp_path), name="ft", val=False,
                trainer=retrofit_trainer(model.model), **OFFLINE_TRAIN_ARGS)
    assert model.model.nc == 4  # the dataset's classes, as Ultralytics' own fine-tuning gives
    names = [n for n, a in diffattn.adapters.adapters(model.model)]
    assert names == ["model.10.m.0.attn.diff_adapter", "model.22.m.0.1.attn.diff_adapter"]
    steps = [int(a.step_buffer) for _, a in diffattn.adapters.adapters(model.model)]
    assert steps[0] == steps[1] >= 1  # λ(t) advanced per optimizer step and kept in the saved EMA model (best.pt)
    with pytest.raises(ValueError, match="not retrofitted"):
        retrofit_trainer(yolo("yolo26n.yaml").model)


@pytest.mark.slow
def test_compare_trains_validates_and_reports_with_the_optimizer_asked(detect_data, tmp_path):
    import json

    import yaml

    from diffattn.studies.detection import run_compare

    run_compare(["yolo26n-diffpsa"], [0], tmp_path, data=detect_data, epochs=1, imgsz=64, batch=4, optimizer="SGD",
                lr0=0.02)
    res = json.loads((tmp_path / "detection.json").read_text())
    assert res["budget"]["optimizer"] == "SGD" and res["budget"]["lr0"] == 0.02
    (run,) = res["runs"]
    assert run["model"] == "yolo26n-diffpsa" and 0.0 <= run["mAP50"] <= 1.0 and run["params"] == 2_572_792
    args = yaml.safe_load((tmp_path / "runs" / "yolo26n-diffpsa-s0" / "args.yaml").read_text())
    assert args["optimizer"] == "SGD" and args["lr0"] == 0.02 and args["epochs"] == 1
    assert "| yolo26n-diffpsa |" in (tmp_path / "detection.md").read_text()
    assert (tmp_path / "attention_maps.png").stat().st_size > 0


def test_detection_study_rejects_a_bad_budget():
    from diffattn.studies import load_study

    with pytest.raises(ValueError, match="epochs in .* must be >= 1, got 0; lr0 in .* must be null or a number > 0"):
        load_study("detection", {"lr0": 0, "epochs": 0})
    cfg = load_study("detection", {"seeds": [0, 1]})
    assert cfg["variants"] == ["yolo26n", "yolo26n_diffpsa", "yolo26n_diffattn"] and cfg["epochs"] == 3


def test_the_detection_comparison_lives_in_studies_only():
    """The detection comparison is a study: the library package ``detect`` holds no copy or alias of it (an alias
    would make library code import an application layer)."""
    import importlib.util

    from diffattn.studies import detection

    assert importlib.util.find_spec("diffattn.detect.compare") is None
    assert callable(detection.run_compare) and callable(detection.summarize)


def test_compare_summary_pairs_each_model_with_the_first_by_seed():
    from diffattn.studies.detection import summarize

    def row(model, seed, m50):
        return {"model": model, "seed": seed, "mAP50": m50, "mAP50-95": m50 / 2, "params": 10, "gflops_640": 1.0,
                "train_s": 5.0}

    lines = summarize([row("yolo26n.yaml", 0, 0.10), row("x", 0, 0.15), row("yolo26n.yaml", 1, 0.20),
                       row("x", 1, 0.15), row("yolo26n.yaml", 2, 0.30), row("x", 2, 0.40)]).splitlines()
    assert lines[0].startswith("| model | mAP50 | mAP50-95 | Δ mAP50 vs yolo26n (paired) |")
    assert lines[2] == "| yolo26n | 20.0 ± 10.0 | 10.0 ± 5.0 | – | 10 | 1.0 | 5 | 3 |"
    # per-seed differences +5, −5, +10 points: mean 3.3, sample std 7.6, higher on 2 of 3
    assert lines[3] == "| x | 23.3 ± 14.4 | 11.7 ± 7.2 | +3.3 ± 7.6 (higher on 2 of 3) | 10 | 1.0 | 5 | 3 |"


def test_detection_report_states_the_smallest_detectable_difference():
    from diffattn.studies.detection import detectable_differences

    per_seed = {s: {"yolo26n": {"mAP50": b}, "x": {"mAP50": x}} for s, (b, x) in
                enumerate([(0.10, 0.15), (0.20, 0.15), (0.30, 0.40)])}
    lines = detectable_differences(per_seed).splitlines()
    assert lines[0] == "## Smallest detectable Δ mAP50" and "With 3 seeds" in lines[2] and "80%" in lines[2]
    # differences +5, −5, +10 points: sd √58.33 = 7.64; (z_0.975 + z_0.8) · sd / √3 = 2.80158 · 7.6376 / 1.7321
    assert lines[-3] == "| variant | mean Δ mAP50 vs yolo26n | sd of the per-seed Δ | smallest detectable Δ |"
    assert lines[-1] == "| x | +3.3 | 7.6 | 12.4 |"
