"""The offline detection set: boxes equal the alpha footprints of the pasted stamps, YOLO label arithmetic,
determinism, argument checks, and the ``diffattn data export tuxpaint_detect`` wiring."""

from __future__ import annotations

import numpy as np
import pytest

from diffattn.data import DATASETS
from diffattn.data.detection import Placement, Stamp, _yolo_lines, compose_image, export_detection, load_stamps

needs_tuxpaint = pytest.mark.skipif(not DATASETS["tuxpaint_captions"].installed(),
                                    reason="tuxpaint_captions is not prepared (run `make data`)")


def _disc(r: int, color) -> Stamp:
    yy, xx = np.mgrid[:2 * r, :2 * r]
    alpha = (yy - r + 0.5) ** 2 + (xx - r + 0.5) ** 2 <= r * r
    rgb = np.zeros((2 * r, 2 * r, 3), np.uint8)
    rgb[alpha] = color
    return Stamp(rgb, alpha, "test", f"disc{r}")


def _ell(n: int, color) -> Stamp:
    alpha = np.zeros((n, n), bool)
    alpha[:, : n // 3] = True
    alpha[-(n // 3):, :] = True
    rgb = np.zeros((n, n, 3), np.uint8)
    rgb[alpha] = color
    return Stamp(rgb, alpha, "test", f"ell{n}")


def _check_placements(image: np.ndarray, placed: list[Placement]) -> None:
    for p in placed:
        ys, xs = np.nonzero(p.mask)
        assert p.box == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)  # the tight box of the footprint
    for i, a in enumerate(placed):  # no two boxes meet, so no stamp hides part of another
        for b in placed[i + 1:]:
            assert a.box[2] <= b.box[0] or b.box[2] <= a.box[0] or a.box[3] <= b.box[1] or b.box[3] <= a.box[1]


def test_boxes_are_the_alpha_footprints_of_known_stamps():
    rng = np.random.default_rng(0)
    bg = np.full((96, 96, 3), 255, np.uint8)
    objs = [(_disc(20, (255, 0, 0)), 0), (_ell(30, (0, 0, 255)), 1)]
    image, placed = compose_image(rng, bg, objs, [_disc(10, (0, 255, 0))], scale=(0.3, 0.3))
    assert [p.cls for p in placed] == [0, 1, -1]
    _check_placements(image, placed)
    for p, color in zip(placed, [(255, 0, 0), (0, 0, 255), (0, 255, 0)]):
        assert np.abs(image[p.mask].astype(int) - color).max() <= 1  # pasted through the mask, no edge bleed
        side = round(0.3 * 96)
        assert max(p.box[2] - p.box[0], p.box[3] - p.box[1]) <= side
    untouched = ~np.any([p.mask for p in placed], axis=0)
    assert (image[untouched] == 255).all()
    disc = placed[0]  # a disc of diameter 29 px: its footprint's box is square within a pixel
    w, h = disc.box[2] - disc.box[0], disc.box[3] - disc.box[1]
    assert abs(w - h) <= 1 and abs(disc.mask.sum() - np.pi * (w / 2) ** 2) / disc.mask.sum() < 0.1


def test_compose_is_deterministic_and_drops_what_does_not_fit():
    objs = [(_disc(20, (255, 0, 0)), 0)] * 12
    a = compose_image(np.random.default_rng(3), np.zeros((64, 64, 3)), objs, [], scale=(0.5, 0.5))
    b = compose_image(np.random.default_rng(3), np.zeros((64, 64, 3)), objs, [], scale=(0.5, 0.5))
    assert np.array_equal(a[0], b[0]) and [p.box for p in a[1]] == [p.box for p in b[1]]
    assert 1 <= len(a[1]) <= 4  # 32-px stamps on 64 px: at most four fit without touching
    _check_placements(*a)


def test_yolo_lines_normalise_boxes_and_skip_distractors():
    m = np.zeros((100, 100), bool)
    lines = _yolo_lines([Placement(2, (10, 20, 30, 60), m), Placement(-1, (0, 0, 5, 5), m)], 100)
    assert lines == ["2 0.200000 0.400000 0.200000 0.400000"]


@pytest.mark.parametrize("kwargs,match", [({"background": np.zeros((8, 9, 3))}, r"square RGB array.*\(8, 9, 3\)"),
                                          ({"scale": (0.5, 0.2)}, r"scale must be \(lo, hi\).*\(0.5, 0.2\)")])
def test_compose_rejects_bad_arguments(kwargs, match):
    args = {"background": np.zeros((8, 8, 3)), "scale": (0.1, 0.2)} | kwargs
    with pytest.raises(ValueError, match=match):
        compose_image(np.random.default_rng(0), args["background"], [], [], scale=args["scale"])


@pytest.mark.parametrize("kwargs,match", [({"n_train": 0}, "n_train must be an int >= 1, got 0"),
                                          ({"imgsz": 16}, "imgsz must be an int >= 32, got 16"),
                                          ({"max_objects": True}, "max_objects must be an int >= 1, got True")])
def test_export_rejects_bad_sizes(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        export_detection(tmp_path / "d", **kwargs)


@needs_tuxpaint
def test_real_stamps_paste_with_exact_boxes():
    stamps = load_stamps(per_category=1)
    assert len({s.category for s in stamps}) == len(stamps) >= 4
    for s in stamps:  # cropped to the mask: every border row and column holds foreground
        assert s.alpha[0].any() and s.alpha[-1].any() and s.alpha[:, 0].any() and s.alpha[:, -1].any()
    image, placed = compose_image(np.random.default_rng(1), np.zeros((128, 128, 3)), [(stamps[0], 0),
                                  (stamps[1], 1)], [stamps[2]], scale=(0.3, 0.4))
    assert len(placed) == 3
    _check_placements(image, placed)


@needs_tuxpaint
def test_export_writes_a_deterministic_yolo_dataset(tmp_path):
    m1 = export_detection(tmp_path / "a", n_train=6, n_val=3, imgsz=64, seed=5, stamps_per_category=2)
    export_detection(tmp_path / "b", n_train=6, n_val=3, imgsz=64, seed=5, stamps_per_category=2)
    assert m1["counts"]["train"]["images"] == 6 and m1["classes"] == ["animals", "food", "vehicles", "household"]
    for split, n in (("train", 6), ("val", 3)):
        imgs = sorted((tmp_path / "a" / "images" / split).glob("*.png"))
        assert len(imgs) == n
        for img in imgs:
            other = tmp_path / "b" / "images" / split / img.name
            assert img.read_bytes() == other.read_bytes()
            label = tmp_path / "a" / "labels" / split / (img.stem + ".txt")
            rows = [list(map(float, r.split())) for r in label.read_text().splitlines()]
            assert rows and all(int(r[0]) in range(4) and all(0 < v <= 1 for v in r[1:]) for r in rows)
    text = (tmp_path / "a" / "data.yaml").read_text()
    assert f'path: "{tmp_path / "a"}"' in text and "\ndownload:" not in text and "  3: household" in text
    m3 = export_detection(tmp_path / "c", n_train=6, n_val=3, imgsz=64, seed=6, stamps_per_category=2)
    assert m3["counts"] != m1["counts"] or (tmp_path / "c" / "images" / "train" / "00000.png").read_bytes() != (
        tmp_path / "a" / "images" / "train" / "00000.png").read_bytes()


@needs_tuxpaint
def test_export_rejects_unknown_classes(tmp_path):
    with pytest.raises(ValueError, match=r"classes must be Tux Paint categories .*\['dragons'\]"):
        export_detection(tmp_path / "d", classes=("dragons",), stamps_per_category=1)


def test_cli_export_routes_tuxpaint_detect(monkeypatch, tmp_path, capsys):
    from diffattn import cli
    from diffattn.data import detection

    calls = []
    monkeypatch.setattr(detection, "export_detection", lambda out, **kw: calls.append((out, kw)) or {
        "counts": {"train": {"images": 1}}, "classes": ["animals"]})
    assert cli.main(["data", "export", "tuxpaint_detect", "--out", str(tmp_path / "d"), "--seed", "3"]) == 0
    assert calls == [(str(tmp_path / "d"), {"root": None, "seed": 3})]
    assert "data.yaml" in capsys.readouterr().out
