"""Pretrained tags: the table, downloads through huggingface_hub (monkeypatched: no network), local files, and
SHA-256 verification (known, recorded on first use, mismatches)."""

import hashlib
import json
import re

import pytest
import torch

import diffattn.models.pretrained as P
from diffattn import convert
from diffattn.models import create_model, is_model, list_pretrained
from tests.test_convert_checkpoints import _diffclip_state_dict, _inputs


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def release(tmp_path):
    """A DiffCLIP-format ``checkpoint_best.pt`` (SLIP layout, toy sizes) standing in for the hub file."""
    torch.manual_seed(0)
    path = tmp_path / "hub" / "checkpoint_best.pt"
    path.parent.mkdir()
    torch.save({"state_dict": {"module." + k: v for k, v in _diffclip_state_dict().items()}, "epoch": 1}, path)
    return path


@pytest.fixture
def hub(monkeypatch, release):
    """hf_hub_download replaced by a function that records its calls and returns ``release``."""
    calls = []

    def fake(repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(release)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake)
    return calls


def test_table_is_consistent():
    assert ("diffclip_vit_b16", "cc12m") in P.PRETRAINED and ("clip_vit_b16", "openai") in P.PRETRAINED
    for (name, tag), e in P.PRETRAINED.items():
        assert is_model(name) and (e.model, e.tag) == (name, tag)
        assert e.loader in ("diffclip", "diffclip_image_tower", "openai_clip", "timm_vit") and (e.hf_hub or e.url)
        assert e.source
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256)
    openai = P.PRETRAINED[("clip_vit_b16", "openai")]
    assert openai.sha256 == openai.url.split("/")[-2]  # OpenAI publishes the hash in the URL
    assert P.PRETRAINED[("diffclip_vit_b16", "cc12m")].hf_hub == "hammh0a/DiffCLIP_ViTB16_CC12M"
    assert list_pretrained("diffclip_vit_b16") == [("diffclip_vit_b16", "cc12m"), ("diffclip_vit_b16", "cc3m")]


def test_tag_downloads_records_the_hash_and_loads_exactly(tmp_path, hub, release):
    cache = tmp_path / "cache"
    model = create_model("diffclip_vit_b16", pretrained="cc12m", cache_dir=cache).eval()
    assert hub == [("hammh0a/DiffCLIP_ViTB16_CC12M", "checkpoint_best.pt")]
    assert model.model_name == "diffclip_vit_b16" and model.pretrained_tag == "diffclip_vit_b16.cc12m"
    assert json.loads((cache / P.HASH_RECORD).read_text()) == {"diffclip_vit_b16.cc12m": _sha(release)}
    direct = convert.load_diffclip(release).eval()
    images, tokens = _inputs()
    with torch.no_grad():
        assert torch.equal(model.encode_image(images), direct.encode_image(images))
        assert torch.equal(model.encode_text(tokens), direct.encode_text(tokens))
    # the same tag again, but the hub now serves other bytes: refused, naming both hashes
    old = _sha(release)
    sd = torch.load(release, weights_only=True)
    sd["epoch"] = 2
    torch.save(sd, release)
    new = _sha(release)
    with pytest.raises(ValueError, match=rf"SHA-256 {new}, but diffclip_vit_b16.cc12m must have {old} \(recorded"):
        create_model("diffclip_vit_b16", pretrained="cc12m", cache_dir=cache)


def test_cache_dir_file_is_used_without_a_download(tmp_path, monkeypatch, release):
    def offline(*a, **k):
        raise AssertionError("no download expected")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", offline)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "checkpoint_best.pt").write_bytes(release.read_bytes())
    model = create_model("diffclip_vit_b16", pretrained="cc3m", cache_dir=cache)
    assert model.pretrained_tag == "diffclip_vit_b16.cc3m"


def test_local_file_with_known_hash(tmp_path, monkeypatch, release):
    digest = _sha(release)
    entry = P.PretrainedTag("diffclip_tiny", "unit", "diffclip", "checkpoint_best.pt", hf_hub="x/y", sha256=digest,
                            hash_source="a unit test", source="here")
    monkeypatch.setitem(P.PRETRAINED, ("diffclip_tiny", "unit"), entry)
    cache = tmp_path / "cache"
    model = create_model("diffclip_tiny", pretrained=str(release), cache_dir=cache)
    assert model.pretrained_tag == "diffclip_tiny.unit" and not (cache / P.HASH_RECORD).exists()
    bad = tmp_path / "other.pt"
    torch.save({"state_dict": _diffclip_state_dict(text_diff=False)}, bad)
    with pytest.raises(ValueError, match=rf"has SHA-256 {_sha(bad)}, which matches no checkpoint of 'diffclip_tiny' "
                                         rf"\(diffclip_tiny.unit: {digest}\)"):
        create_model("diffclip_tiny", pretrained=str(bad), cache_dir=cache)
    monkeypatch.setitem(P.PRETRAINED, ("diffclip_tiny", "unit"),
                        P.PretrainedTag(**{**entry.__dict__, "sha256": "0" * 64}))
    monkeypatch.setattr("huggingface_hub.hf_hub_download", lambda *a, **k: str(release))
    with pytest.raises(ValueError, match=rf"SHA-256 {digest}, but diffclip_tiny.unit must have {'0' * 64} \(a unit"):
        create_model("diffclip_tiny", pretrained="unit", cache_dir=cache)


def test_timm_vit_tag_matches_timm_and_sets_the_data_config(tmp_path, monkeypatch):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2,
                                                           num_heads=1, num_classes=5).eval()
    path = tmp_path / "model.safetensors"
    save_file(ref.state_dict(), path)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", lambda repo, fn, **k: str(path))
    model = create_model("vit_tiny_patch16_224", pretrained="augreg_in21k_ft_in1k", cache_dir=tmp_path / "c").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), ref(x), atol=1e-5)
    cfg = model.pretrained_cfg
    assert cfg["mean"] == (0.5, 0.5, 0.5) and cfg["hf_hub_id"] == "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def test_errors_name_the_tags_and_the_release(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"pretrained=True: name the checkpoint.*\['cc12m', 'cc3m'\]"):
        create_model("diffclip_vit_b16", pretrained=True)
    with pytest.raises(ValueError, match=r"pretrained='laion' is neither a tag of 'clip_vit_b16' \(its tags are "
                                         r"\['openai'\]\)"):
        create_model("clip_vit_b16", pretrained="laion")
    with pytest.raises(FileNotFoundError, match=r"missing.pt' does not exist; it takes a checkpoint file or a tag "
                                                r"of 'clip_vit_b16': \['openai'\]"):
        create_model("clip_vit_b16", pretrained=str(tmp_path / "missing.pt"))
    with pytest.raises(TypeError, match="pretrained must be a tag, a file path or False, got int"):
        create_model("clip_tiny", pretrained=3)
    with pytest.raises(ValueError, match="override 'width' is not an argument"):
        create_model("diffclip_vit_b16", pretrained="cc12m", width=3)

    def down(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", down)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # as online, the download itself fails
    monkeypatch.setattr("diffattn.io.hub_reachable", lambda timeout=3.0: True)
    with pytest.raises(FileNotFoundError, match=r"huggingface.co/hammh0a/DiffCLIP_ViTB16_CC12M .*network unreachable"
                                                r".*github.com/hammoudhasan/DiffCLIP"):
        create_model("diffclip_vit_b16", pretrained="cc12m", cache_dir=tmp_path)


def test_load_diffclip_errors_point_to_the_release(tmp_path):
    with pytest.raises(ValueError, match=r"hammh0a/DiffCLIP_ViTB16_CC12M.*github.com/hammoudhasan/DiffCLIP"):
        convert.load_diffclip(tmp_path / "checkpoint_best.pt")
    sd = _diffclip_state_dict()
    del sd["image_projection"]
    with pytest.raises(ValueError, match=r"has no 'image_projection'.*official DiffCLIP release"):
        convert.load_diffclip(sd)


# ------------------------------------------------------------------------------------ listing (timm / open_clip)


def test_list_models_pretrained_lists_every_tag_of_list_pretrained():
    import diffattn
    from diffattn.models.registry import model_info

    pairs = diffattn.list_pretrained()
    assert pairs == list_pretrained() and len(pairs) == len(P.PRETRAINED) == 8
    assert diffattn.list_models(pretrained=True) == sorted(f"{m}.{t}" for m, t in pairs)
    assert diffattn.list_pretrained(as_str=True) == [f"{m}:{t}" for m, t in pairs]  # open_clip's as_str
    assert diffattn.list_models("diff_vit*", pretrained=True) == ["diff_vit_base_patch16_224.diffclip_cc12m",
                                                                  "diff_vit_base_patch16_224.diffclip_cc3m"]
    assert diffattn.list_models("*.openai", pretrained=True) == ["clip_vit_b16.openai"]
    assert diffattn.list_models("diff_vit_nano", pretrained=True) == []
    assert model_info("diffclip_vit_b16")["pretrained"] == ["cc12m", "cc3m"]
    assert model_info("diff_vit_nano")["pretrained"] == []
    assert P.split_model_tag("clip_vit_b16.openai") == ("clip_vit_b16", "openai")
    assert P.split_model_tag("clip_vit_b16.nope") == ("clip_vit_b16.nope", None)
    with pytest.raises(TypeError, match="pretrained must be a bool"):
        diffattn.list_models(pretrained="openai")


def test_timm_lists_the_pretrained_tags_of_the_registered_vision_models():
    timm = pytest.importorskip("timm")
    import diffattn.factory as factory
    import diffattn.models.vit as vit

    factory.register_timm()
    want = set()
    for name, tag in list_pretrained():
        if name in vit.VIT_CONFIGS:
            want |= {f"{t}.{tag}" for t in (name, f"diffattn_{name}") if t in factory.TIMM_NAMES}
    assert len(want) == 7  # diff_vit_base (2 tags, 2 names) and the 3 timm-named ViTs under diffattn_<name>
    assert set(timm.list_models("diff*", pretrained=True)) == want
    assert timm.list_models("diff_vit*", pretrained=True) == ["diff_vit_base_patch16_224.diffclip_cc3m",
                                                              "diff_vit_base_patch16_224.diffclip_cc12m"]
    cfg = timm.models.get_pretrained_cfg("diff_vit_base_patch16_224.diffclip_cc12m")
    assert cfg.hf_hub_id == "hammh0a/DiffCLIP_ViTB16_CC12M" and cfg.hf_hub_filename == "checkpoint_best.pt"
    assert cfg.input_size == (3, 224, 224) and cfg.mean == (0.485, 0.456, 0.406)
    assert "diff_vit_nano" in timm.list_models("diff_vit_nano") and timm.list_models("diff_vit_nano",
                                                                                      pretrained=True) == []


def test_diffclip_image_tower_tag_through_timm_and_by_name(tmp_path, hub, release):
    """timm.create_model("<name>.<tag>", pretrained=True) and create_model("<name>.<tag>") load the DiffCLIP
    release's image tower (toy sizes here) whose head is the image projection: it equals clip.encode_image."""
    timm = pytest.importorskip("timm")
    from diffattn.models import register_timm

    register_timm()
    cache = tmp_path / "cache"
    model = timm.create_model("diff_vit_base_patch16_224.diffclip_cc12m", pretrained=True, cache_dir=cache).eval()
    assert hub == [("hammh0a/DiffCLIP_ViTB16_CC12M", "checkpoint_best.pt")]
    assert model.pretrained_tag == "diff_vit_base_patch16_224.diffclip_cc12m"
    assert model.pretrained_cfg["mean"] == (0.485, 0.456, 0.406)
    clip = convert.load_diffclip(release).eval()
    x = torch.randn(2, 3, clip.img_size, clip.img_size)
    with torch.no_grad():
        assert (model(x) - clip.encode_image(x)).abs().max().item() <= 1e-5  # addmm vs matmul rounding
    again = create_model("diff_vit_base_patch16_224.diffclip_cc12m", cache_dir=cache, num_classes=0).eval()
    assert again.num_classes == 0 and again.model_name == "diff_vit_base_patch16_224"
    with torch.no_grad():
        assert torch.equal(again(x), clip.visual(x))
    with pytest.raises(ValueError, match="names tag 'diffclip_cc12m', but pretrained='diffclip_cc3m'"):
        create_model("diff_vit_base_patch16_224.diffclip_cc12m", pretrained="diffclip_cc3m")
