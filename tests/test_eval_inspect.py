"""``diffattn inspect`` (diffattn.eval.inspection) on tiny random released folders built here, offline: Motif 1:1
(Motif-2.6B-like), Motif 4:1 (grouped differential attention, Motif-2-12.7B-like) and a transformers DiffLlama."""

import json

import pytest
import torch
from safetensors.torch import load_file

from diffattn import convert
from diffattn.cli import main
from diffattn.eval.inspection import build_needle_input
from diffattn.layers import ATTENTION_TYPES
from diffattn.models import CausalLM

from .test_convert_motif import GDA, V1, released_state_dict, write_released

IDS = "5,9,11,3,7,2,8,13,21,4,6,10"
NEEDLE = "33,34,35"


def _diffllama_folder(path):
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    torch.manual_seed(0)
    cfg = DiffLlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    DiffLlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _folder(kind, tmp_path):
    if kind == "diffllama":
        return _diffllama_folder(tmp_path / "dl")
    cfg = {"motif_1_1": V1, "motif_4_1": GDA}[kind]
    return write_released(tmp_path / kind, cfg, released_state_dict(cfg))


def _load(kind, folder):
    if kind == "diffllama":
        return convert.from_diffllama(str(folder))
    return convert.from_motif(folder)


@pytest.mark.parametrize("kind", ["motif_1_1", "motif_4_1", "diffllama"])
def test_inspect_writes_the_summary_figures_and_maps_of_every_layer(kind, tmp_path, capsys):
    folder, out = _folder(kind, tmp_path), tmp_path / "out"
    assert main(["inspect", str(folder), "--ids", IDS, "--needle-ids", NEEDLE, "--question-ids", "40,41",
                 "--depth", "0.25", "--out", str(out), "--save-maps"]) == 0
    assert "needle mass (signed)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    model = _load(kind, folder)
    blocks = model.blocks
    assert len(summary["layers"]) == len(blocks)
    # the needle at a quarter of the 12 context tokens: tokens 3..5; the query is the last of 17 tokens
    assert summary["needle"] == {"start": 3, "end": 6, "query": 16} and summary["num_tokens"] == 17
    assert summary["ids"][3:6] == [33, 34, 35] and summary["ids"][-2:] == [40, 41]
    x = torch.zeros(1, 1, model.dim, dtype=next(model.parameters()).dtype)
    maps = load_file(str(out / "maps.safetensors"))
    for blk, row in zip(blocks, summary["layers"]):
        attn = blk.attn
        hs = getattr(attn, "num_signal_heads", attn.num_heads // 2)
        hn = getattr(attn, "num_noise_heads", attn.num_heads // 2)
        assert row["signal_heads"] == hs and row["noise_heads"] == hn and row["group_ratio"] == hs // hn
        lam = float(attn.lambda_weights(x)[1].detach())  # the model's own λ of this layer (one per layer: reparam)
        assert row["lambda"] == pytest.approx([lam] * hs, abs=1e-6) and row["lambda_mean"] == pytest.approx(lam,
                                                                                                            abs=1e-6)
        assert len(row["entropy"]["A1"]) == hs and len(row["entropy"]["A2"]) == hn
        assert all(0 <= h <= row["entropy"]["uniform_causal"] + 1e-6 for h in row["entropy"]["A1"])
        # A1 and A2 rows sum to 1; A1 − λA2 rows to 1 − λ, so needle + rest of the context = 1 − λ per head
        a1, a2, c = (maps[f"{row['name']}.{k}"].double() for k in ("A1", "A2", "combined"))
        assert a1.shape == (1, hs, 17, 17) and a2.shape == (1, hn, 17, 17) and c.shape == (1, hs, 17, 17)
        assert (a1.sum(-1) - 1).abs().max() < 1e-5 and (a2.sum(-1) - 1).abs().max() < 1e-5
        assert (c.sum(-1) - (1 - lam)).abs().max() < 1e-5
        assert max(row["checks"].values()) < 1e-5
        for h in range(hs):
            total = row["needle_mass"]["signed"][h] + row["context_mass"]["signed"][h]
            assert total == pytest.approx(1 - lam, abs=1e-5)
            assert row["needle_mass"]["signed"][h] == pytest.approx(float(c[0, h, -1, 3:6].sum()), abs=1e-6)
            assert row["needle_mass"]["A1"][h] == pytest.approx(float(a1[0, h, -1, 3:6].sum()), abs=1e-6)
        assert row["needle_mass"]["A2"] == pytest.approx(a2[0, :, -1, 3:6].sum(-1).tolist(), abs=1e-6)
    assert summary["overall"]["lambda_mean"] == pytest.approx(
        sum(r["lambda_mean"] for r in summary["layers"]) / len(blocks))
    for name in ["lambda.png", "needle_mass.png", "entropy.png"] + [f"maps/layer_{i:02d}.png"
                                                                      for i in range(len(blocks))]:
        assert (out / name).stat().st_size > 1000, name
    # the maps are of the model's forward: its next token is the argmax of its own logits
    with torch.no_grad():
        logits = model(torch.tensor([summary["ids"]]))
    assert summary["next_token"] == int(logits[0, -1].argmax())


#: (signal heads, noise heads) of a CausalLM of 4 heads of each registered kind, as ``diffattn inspect`` reports
#: them; grouped: 1 noise head of width 8 shared by 3 signal heads (Motif Technologies 2025, arXiv 2510.06949);
#: gdla (Motif-3's grouped differential latent attention): 1 noise head shared by 3 signal heads
KIND_HEADS = {"standard": (4, None), "diff": (2, 2), "gated": (2, 2), "diff_v2": (4, 4), "grouped": (3, 1),
              "stable_audio": (4, 4), "gdla": (3, 1)}
#: the settings a kind needs beyond a CausalLM of width 32 and 4 heads
KIND_SETTINGS = {"grouped": {"num_noise_heads": 1, "head_dim": 8}, "gdla": {"num_noise_heads": 1}}


def test_the_kinds_inspected_are_the_registry():
    assert set(KIND_HEADS) == set(ATTENTION_TYPES)


@pytest.mark.parametrize("kind", list(KIND_HEADS))
def test_inspect_every_attention_kind_of_a_diffattn_save(kind, tmp_path):
    """``diffattn inspect`` on a saved CausalLM of each kind: the heads, λ and maps it reports are the model's. The
    combined map equals w1 ⊙ A1 − λ ⊙ A2 with w1, λ from the layer on its own input (a grouped signal head i with
    noise head i // r), λ per head is the layer's (mean over the tokens for a per-token λ), the signed needle mass is
    the combined map's, and the next token is the model's."""
    torch.manual_seed(0)
    attention = {"kind": kind, **KIND_SETTINGS.get(kind, {})}
    model = CausalLM(vocab_size=61, dim=32, depth=2, num_heads=4, attention=attention).eval()
    folder, out = tmp_path / "m", tmp_path / "out"
    model.save_pretrained(folder)
    assert main(["inspect", str(folder), "--ids", IDS, "--needle-ids", NEEDLE, "--out", str(out), "--save-maps"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    maps = load_file(str(out / "maps.safetensors"))
    inputs = []
    hooks = [blk.attn.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for blk in model.blocks]
    with torch.no_grad():
        logits = model(torch.tensor([summary["ids"]]))
    for h in hooks:
        h.remove()
    assert summary["next_token"] == int(logits[0, -1].argmax()) and summary["needle"]["query"] == 14
    hs, hn = KIND_HEADS[kind]
    assert len(summary["layers"]) == 2
    for blk, x, row in zip(model.blocks, inputs, summary["layers"]):
        assert row["kind"] == kind and (row["signal_heads"], row["noise_heads"]) == (hs, hn)
        a1, c = maps[f"{row['name']}.A1"].double(), maps[f"{row['name']}.combined"].double()
        assert a1.shape == c.shape == (1, hs, 15, 15) and (a1.sum(-1) - 1).abs().max() < 1e-5
        assert row["needle_mass"]["signed"] == pytest.approx(c[0, :, -1, 6:9].sum(-1).tolist(), abs=1e-6)
        assert max(row["checks"].values()) < 1e-5
        if kind == "standard":
            assert f"{row['name']}.A2" not in maps and "lambda" not in row and torch.equal(a1, c)
            continue
        a2 = maps[f"{row['name']}.A2"].double()
        assert a2.shape == (1, hn, 15, 15) and (a2.sum(-1) - 1).abs().max() < 1e-5
        with torch.no_grad():
            w1, lam = (torch.as_tensor(t, dtype=torch.float64) for t in blk.attn.lambda_weights(x))
        lam = lam.expand(1, hs, 15, 1) if lam.dim() == 0 else lam.expand(1, hs, -1, 1)  # (1, H_s, 1 | N, 1)
        want = w1 * a1 - lam * a2.repeat_interleave(hs // hn, dim=1)
        assert (c - want).abs().max() < 1e-5
        assert row["lambda"] == pytest.approx(lam[0, :, :, 0].mean(-1).tolist(), abs=1e-6)
        if kind in ("gated", "diff_v2", "gdla"):  # λ per token: the query row's as well
            assert row["lambda_query"] == pytest.approx(lam[0, :, -1, 0].tolist(), abs=1e-6)
    expected = {"summary.json", "needle_mass.png", "entropy.png", "maps.safetensors"} | (
        set() if kind == "standard" else {"lambda.png"})
    assert expected <= {p.name for p in out.iterdir()} and (out / "maps" / "layer_01.png").stat().st_size > 1000


def test_inspect_takes_text_through_the_folders_tokenizer_and_one_head(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>"] + "the code is 4711 a cat sat on mat and then went home".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = write_released(tmp_path / "m", GDA, released_state_dict(GDA))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    out = tmp_path / "o"
    assert main(["inspect", str(folder), "--prompt", "a cat sat on the mat and then went home", "--needle",
                 "the code is 4711", "--question", "the code is", "--depth", "0.5", "--head", "3", "--out", str(out),
                 "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["tokens"][s["needle"]["start"]:s["needle"]["end"]] == ["the", "code", "is", "4711"]
    assert s["tokens"][-3:] == ["the", "code", "is"] and s["family"] == "motif" and s["dtype"] == "float64"
    assert not (out / "lambda.png").exists() and s["files"] == {"summary": "summary.json"}


def test_build_needle_input():
    assert build_needle_input([1, 2, 3, 4], [9], [7], depth=0.5) == ([1, 2, 9, 3, 4, 7], (2, 3))
    assert build_needle_input([0, 2, 3], [9, 9], depth=0.0, keep_prefix=1) == ([0, 9, 9, 2, 3], (1, 3))
    assert build_needle_input([1, 2], [9], depth=1.0) == ([1, 2, 9], (2, 3))
    with pytest.raises(ValueError, match="depth must be in"):
        build_needle_input([1], [2], depth=1.5)


@pytest.mark.parametrize("argv,match", [
    (["--ids", IDS], "--ids needs --needle-ids"),
    (["--prompt", "a cat"], "--prompt needs --needle"),
    (["--prompt", "a", "--needle", "b"], "has no tokenizer"),
    (["--ids", "1,2", "--needle-ids", "3", "--depth", "1"], "the needle must come before the last token"),
    (["--ids", "1,2,900", "--needle-ids", "3"], "token id 900 is outside the model's vocabulary"),
])
def test_inspect_errors_are_one_line_usage_errors(argv, match, tmp_path, capsys):
    folder = write_released(tmp_path / "m", V1, released_state_dict(V1))
    assert main(["inspect", str(folder), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffattn: error:") and err.count("\n") == 1
    assert pytest.importorskip("re").search(match, err), err


def test_inspect_entropy_and_needle_axes_have_no_offset_and_reach_their_baseline(tmp_path, monkeypatch):
    """The per-layer figures: ticks are the values (no offset above the axis), the y range reaches 0 and the
    uniform value drawn as a reference, so a 0.0002-nat spread is drawn at its true size."""
    import diffattn.diagnostics.plots as plots

    seen = {}
    save = plots.save_figure

    def keep(fig, path):
        fig.canvas.draw()
        seen[path.name] = fig.axes[0]
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    out = tmp_path / "out"
    assert main(["inspect", str(_folder("motif_1_1", tmp_path)), "--ids", IDS, "--needle-ids", NEEDLE,
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    uniform = summary["layers"][0]["entropy"]["uniform_causal"]
    for name, ref in (("entropy.png", uniform), ("needle_mass.png", 3 / 15)):
        ax = seen[name]
        assert ax.yaxis.get_offset_text().get_text() == "", name
        lo, hi = ax.get_ylim()
        assert lo <= 0.0 <= hi and lo <= ref <= hi, (name, lo, hi, ref)
        assert any(abs(line.get_ydata()[0] - ref) < 1e-9 for line in ax.get_lines() if line.get_linestyle() == "--")
