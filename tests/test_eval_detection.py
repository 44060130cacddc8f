"""diffattn.eval.detection: object attention of YOLO detectors, checked on hand-made datasets and against maps
computed independently (diffattn.detect.attention_maps and a float64 reduction written here)."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("YOLO_OFFLINE", "1")  # before ultralytics is imported: no online probe
pytest.importorskip("ultralytics", reason="the detector tests need the optional extra diffattn[detect]")

from diffattn.cli import main  # noqa: E402
from diffattn.detect import attention_maps, yolo  # noqa: E402
from diffattn.eval.detection import (  # noqa: E402
    detection_images,
    object_attention,
    object_attention_table,
)


def _write_dataset(root, boxes_per_image, size=32):
    """A YOLO dataset with one val image per entry of ``boxes_per_image`` (pixel boxes x0, y0, x1, y1)."""
    from PIL import Image

    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    for i, boxes in enumerate(boxes_per_image):
        Image.new("RGB", (size, size), (10 * i, 100, 200)).save(root / "images" / "val" / f"{i:03d}.png")
        rows = [f"0 {(x0 + x1) / 2 / size} {(y0 + y1) / 2 / size} {(x1 - x0) / size} {(y1 - y0) / size}"
                for x0, y0, x1, y1 in boxes]
        (root / "labels" / "val" / f"{i:03d}.txt").write_text("\n".join(rows) + "\n")
    (root / "data.yaml").write_text(f'path: "{root}"\ntrain: images/val\nval: images/val\nnames:\n  0: thing\n')
    return root / "data.yaml"


def test_detection_images_give_the_union_of_the_boxes_as_a_mask(tmp_path):
    data = _write_dataset(tmp_path, [[(0, 0, 8, 16)], [(4, 4, 12, 12), (20, 16, 32, 32)], []])
    x, m = detection_images(data, "val", imgsz=32)
    assert x.shape == (3, 3, 32, 32) and m.shape == (3, 32, 32) and m.dtype == torch.bool
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert x[1, 0, 0, 0].item() == pytest.approx(10 / 255)  # the second image's red channel
    assert int(m[0].sum()) == 8 * 16 and bool(m[0, :16, :8].all())
    assert int(m[1].sum()) == 8 * 8 + 12 * 16 and bool(m[1, 16:, 20:].all()) and not bool(m[1, 0, 0])
    assert int(m[2].sum()) == 0  # no label rows: no object
    x2, m2 = detection_images(data, "val", imgsz=64, limit=2)  # resized: the boxes scale with the image
    assert x2.shape == (2, 3, 64, 64) and int(m2[0].sum()) == 16 * 32
    with pytest.raises(ValueError, match="split must be a split of"):
        detection_images(data, "test")
    with pytest.raises(FileNotFoundError, match="data_yaml must be a YOLO dataset YAML"):
        detection_images(tmp_path / "missing.yaml")


def _density_ratio(a, fg, mode):
    """Independent float64 reduction: mean over images and heads of (mass on object keys / #object keys) over
    (mass on background keys / #background keys), each the mean over the object query rows."""
    a = a.double()
    a = a.clamp_min(0) if mode == "relu" else a
    d_in, d_out = [], []
    for b in range(a.shape[0]):
        q = fg[b].nonzero().flatten()
        rows = a[b][:, q]  # (heads, |q|, N)
        d_in.append((rows[..., fg[b]].sum(-1).mean(-1) / fg[b].sum()).mean())
        d_out.append((rows[..., ~fg[b]].sum(-1).mean(-1) / (~fg[b]).sum()).mean())
    return (torch.stack(d_in).mean() / torch.stack(d_out).mean()).item()


@pytest.mark.parametrize("name", ["yolo26n.yaml", "yolo26n-diffpsa"])
def test_object_attention_matches_an_independent_reduction_of_the_maps(name):
    from diffattn.diagnostics import patch_mask

    torch.manual_seed(0)
    net = yolo(name).model.eval()
    x = torch.rand(3, 3, 64, 64)
    masks = torch.zeros(3, 64, 64, dtype=torch.bool)
    masks[0, :32, :32] = True  # one quadrant
    masks[1, 16:64, 0:16] = True  # 2×2 grid of 32-px cells: bottom-left half covered (object), top-left a quarter
    masks[2] = True  # all object: no background token, so this image does not count
    res = object_attention(net, x, masks)
    maps = {n: a for n, a, _ in attention_maps(net, x)}
    assert list(res) == list(maps)
    for layer, r in res.items():
        h, w = r["grid"]
        assert (h, w) == (2, 2) and r["images"] == 2
        fg = patch_mask(masks[:2], (h, w))
        assert r["object_share"] == pytest.approx(fg.float().mean().item())
        for mode in ("signed", "relu"):
            assert r[mode]["density_ratio"] == pytest.approx(_density_ratio(maps[layer][:2], fg, mode), rel=1e-5)
    with pytest.raises(ValueError, match="images must be"):
        object_attention(net, x, masks[:2])
    net.train()
    object_attention(net, x, masks)
    assert net.training  # the caller's mode is restored


def test_object_attention_table_pairs_each_model_with_the_first_by_seed_and_layer():
    def row(model, seed, layer, ratio):
        r = {"inside": 0, "outside": 0, "density_inside": 0, "density_outside": 0, "density_ratio": ratio}
        return {"model": model, "seed": seed, "layer": layer, "grid": [4, 4], "images": 10, "object_share": 0.25,
                "signed": r, "relu": r}

    rows = [row("yolo26n.yaml", 0, "model.10.m.0.attn", 1.0), row("d", 0, "model.10.attn", 1.5),
            row("yolo26n.yaml", 1, "model.10.m.0.attn", 2.0), row("d", 1, "model.10.attn", 1.5)]
    lines = object_attention_table(rows).splitlines()
    assert lines[0].startswith("| model | layer | object / background density (signed) | Δ vs yolo26n (paired) | p ")
    assert lines[2] == "| yolo26n | model.10 | 1.50 ± 0.71 | – | – | 25 % | 2 |"
    # per-seed differences +0.5 and −0.5: mean 0, sample std 0.71, higher on 1 of 2, t = 0 so p = 1
    assert lines[3] == "| d | model.10 | 1.50 ± 0.00 | +0.00 ± 0.71 (higher on 1 of 2) | 1.00 | 25 % | 2 |"
    rows += [row("yolo26n.yaml", 2, "model.10.m.0.attn", 1.0), row("d", 2, "model.10.attn", 2.0)]
    # differences +0.5, −0.5, +1.0: mean 1/3, sample std 0.764, t = 0.756 with 2 degrees of freedom, p = 0.529
    assert "| +0.33 ± 0.76 (higher on 2 of 3) | 0.53 |" in object_attention_table(rows).splitlines()[3]
    # two attention modules inside one YOLO layer of a run stay two rows (a repeated block), never merged
    rows = [row("a", 0, "model.10.m.0.attn", 1.0), row("a", 0, "model.10.m.1.attn", 3.0)]
    lines = object_attention_table(rows).splitlines()
    assert lines[2].startswith("| a | model.10 | 1.00 ± 0.00 |") and lines[3].startswith("| a | model.10#1 | 3.00")


def test_command_reads_the_compare_runs_and_writes_the_tables(tmp_path, capsys):
    data = _write_dataset(tmp_path / "data", [[(0, 0, 32, 32)], [(32, 32, 64, 64)]], size=64)
    runs = []
    for model in ("yolo26n.yaml", "yolo26n-diffpsa"):
        torch.manual_seed(0)
        weights = tmp_path / f"{model}.pt"
        torch.save({"model": yolo(model).model}, weights)  # an Ultralytics checkpoint, as best.pt holds it
        runs.append({"model": model, "seed": 0, "weights": str(weights)})
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"budget": {"data": str(data), "imgsz": 64}, "runs": runs}))
    out = tmp_path / "object_attention.md"
    assert main(["object-attention", "--results", str(results), "--out", str(out)]) == 0
    table = out.read_text()
    assert "| yolo26n | model.10 |" in table and "| yolo26n-diffpsa | model.22 |" in table
    assert "(relu)" in table and table in capsys.readouterr().out
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["model"], r["layer"]) for r in rows] == [
        ("yolo26n.yaml", "model.10.m.0.attn"), ("yolo26n.yaml", "model.22.m.0.1.attn"),
        ("yolo26n-diffpsa", "model.10.m.0.attn"), ("yolo26n-diffpsa", "model.22.m.0.1.attn")]
    assert all(r["images"] == 2 and r["grid"] == [2, 2] for r in rows)
    with pytest.raises(SystemExit) as e:
        main(["object-attention", "--results", str(tmp_path / "none.json"), "--out", str(out)])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"diffattn: error: object-attention: --results {tmp_path / 'none.json'}: no "
                                       f"such file (see diffattn object-attention --help)\n")
