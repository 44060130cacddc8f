"""The user formats (webdataset shards, CSV, image folders, token memmaps), the exporter and `diffattn data`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from diffattn.cli import main
from diffattn.data import (
    DATASETS,
    SETUP_COMMAND,
    CsvPairs,
    TokenMemmap,
    default_root,
    export_webdataset,
    get_dataset,
    image_folder,
    read_token_meta,
    webdataset_pairs,
    write_token_memmap,
)

REPO = Path(__file__).resolve().parents[1]
ROOT = default_root()
wds = pytest.importorskip("webdataset")


def needs(name: str):
    return pytest.mark.skipif(not DATASETS[name].installed(ROOT),
                              reason=f"{name} not installed under {ROOT}: run `{SETUP_COMMAND}`")


def _fake_caption_set(root: Path, n: int = 12) -> None:
    from PIL import Image

    folder = root / "emoji"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    rows = []
    for i in range(n):
        Image.new("RGB", (8, 8), (10 * i, 255 - i, 7)).save(folder / "images" / f"{i:04d}.png")
        Image.new("L", (8, 8), 255).save(folder / "masks" / f"{i:04d}.png")
        rows.append({"key": f"K{i}", "image": f"images/{i:04d}.png", "mask": f"masks/{i:04d}.png",
                     "caption": f"emoji {i}", "category": "Objects", "group": f"emoji {i}"})
    (folder / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / ".prepared").write_text("fake\n")


def _pairs(ds) -> list[tuple[bytes, str]]:
    return [(np.asarray(ds.load_image(i)).tobytes(), ds.captions[i]) for i in range(len(ds))]


# ------------------------------------------------------------------------------------------------ webdataset
def test_export_webdataset_read_back_by_webdataset_directly(tmp_path):
    _fake_caption_set(tmp_path)
    m = export_webdataset("emoji", tmp_path / "shards", split="all", root=tmp_path, shard_size=5)
    assert (m["n_samples"], m["n_shards"]) == (12, 3) and m["keys"] == ["png", "txt", "mask.png", "json"]
    assert m["urls"].endswith("emoji-all-{000000..000002}.tar")
    got = [(np.asarray(im).tobytes(), txt) for im, txt in
           wds.WebDataset(m["urls"], shardshuffle=False).decode("pil").to_tuple("png", "txt")]
    assert got == _pairs(get_dataset("emoji", split="all", root=tmp_path))
    meta = [j for (j,) in wds.WebDataset(m["urls"], shardshuffle=False).decode().to_tuple("json")]
    assert meta[3] == {"key": "K3", "category": 0, "category_name": "Objects"}
    manifest = json.loads((tmp_path / "shards" / "emoji-all.json").read_text())
    assert manifest["n_samples"] == 12 and manifest["shards"][0] == "emoji-all-000000.tar"


def test_webdataset_pairs_reader_and_get_dataset(tmp_path):
    _fake_caption_set(tmp_path)
    m = export_webdataset("emoji", tmp_path / "s", split="all", root=tmp_path, shard_size=100)
    ds = webdataset_pairs(m["urls"], transform=lambda im: torch.tensor(np.asarray(im)).permute(2, 0, 1))
    items = list(ds)
    assert len(items) == 12 and items[4][1] == "emoji 4" and items[4][0].shape == (3, 8, 8)
    assert items[4][0][:, 0, 0].tolist() == [40, 251, 7]
    again = [c for _, c in get_dataset("webdataset", root=m["urls"])]
    assert again == [f"emoji {i}" for i in range(12)]
    shuffled = [c for _, c in webdataset_pairs(m["urls"], shuffle=8, seed=1)]
    assert sorted(shuffled) == sorted(again) and shuffled == [c for _, c in webdataset_pairs(m["urls"], shuffle=8,
                                                                                             seed=1)]
    with pytest.raises(FileNotFoundError, match="shard"):
        webdataset_pairs(str(tmp_path / "nope.tar"))
    with pytest.raises(ValueError, match="shuffle must be"):
        webdataset_pairs(m["urls"], shuffle=-1)


def test_export_rejects_bad_shard_size(tmp_path):
    _fake_caption_set(tmp_path)
    with pytest.raises(ValueError, match="shard_size must be a positive int, got 0"):
        export_webdataset("emoji", tmp_path / "s", root=tmp_path, shard_size=0)


@pytest.mark.data
@needs("tuxpaint_captions")
def test_tuxpaint_export_yields_the_same_pairs(tmp_path):
    m = export_webdataset("tuxpaint_captions", tmp_path, split="val", root=ROOT, shard_size=40)
    ds = get_dataset("tuxpaint_captions", split="val", root=ROOT)
    assert m["n_samples"] == len(ds) and m["n_shards"] == -(-len(ds) // 40)
    got = [(np.asarray(im).tobytes(), txt) for im, txt in
           wds.WebDataset(m["urls"], shardshuffle=False).decode("pil").to_tuple("jpg;png;jpeg;webp", "txt")]
    assert got == _pairs(ds)
    masks = [mk for (mk,) in wds.WebDataset(m["urls"], shardshuffle=False).decode("pill").to_tuple("mask.png")]
    assert np.array_equal(np.asarray(masks[0]) >= 128, ds[0]["mask"].numpy())


@pytest.mark.data
@needs("fashion_mnist")
def test_cli_export_fashion_mnist_shards(tmp_path, capsys):
    assert main(["data", "export", "fashion_mnist", "--format", "webdataset", "--out", str(tmp_path),
                 "--split", "val", "--shard-size", "2500", "--root", str(ROOT)]) == 0
    assert "5000 samples in 2 shard(s)" in capsys.readouterr().out
    urls = str(tmp_path / "fashion_mnist-val-{000000..000001}.tar")
    first = next(iter(wds.WebDataset(urls, shardshuffle=False).decode("pill").to_tuple("png", "cls", "txt")))
    val = get_dataset("fashion_mnist", split="val", root=ROOT)
    assert np.array_equal(np.asarray(first[0]), val.images[0]) and first[1] == val.labels[0]
    assert first[2] == val.classes[val.labels[0]]


# ------------------------------------------------------------------------------------------------ CSV
def _images(folder: Path, n: int) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        Image.new("RGB", (6, 4), (i, 2 * i, 3 * i)).save(folder / f"im{i}.png")
        names.append(f"im{i}.png")
    return names


def test_csv_pairs_open_clip_convention(tmp_path):
    names = _images(tmp_path / "imgs", 3)
    lines = ["filepath\ttitle"] + [f"imgs/{n}\ta caption, number {i}" for i, n in enumerate(names)]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    ds = get_dataset("csv", root=tmp_path / "train.csv")
    assert len(ds) == 3 and ds[2][1] == "a caption, number 2"
    assert np.asarray(ds[2][0])[0, 0].tolist() == [2, 4, 6] and ds[2][0].size == (6, 4)
    (tmp_path / "c.csv").write_text("image,text\n" + "".join(f"{tmp_path / 'imgs' / n},cap {n}\n" for n in names))
    ds = CsvPairs(tmp_path / "c.csv", img_key="image", caption_key="text", sep=",", transform=lambda im: im.size)
    assert ds[1] == ((6, 4), "cap im1.png")
    with pytest.raises(ValueError, match=r"img_key='filepath' is not a column .*\['image', 'text'\]"):
        CsvPairs(tmp_path / "c.csv", sep=",")
    with pytest.raises(FileNotFoundError, match="CSV file"):
        CsvPairs(tmp_path / "missing.csv")


def test_image_folder_classes_in_sorted_order(tmp_path):
    _images(tmp_path / "zebra", 2)
    _images(tmp_path / "ant", 3)
    ds = get_dataset("imagefolder", root=tmp_path)
    assert ds.classes == ["ant", "zebra"] and len(ds) == 5 and [y for _, y in ds] == [0, 0, 0, 1, 1]
    assert image_folder(tmp_path, transform=lambda im: im.size)[4] == ((6, 4), 1)
    with pytest.raises(FileNotFoundError, match="image folder"):
        image_folder(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------ token memmaps
def test_token_memmap_round_trip_and_windows(tmp_path):
    ids = np.random.default_rng(0).integers(0, 50257, size=1001)
    path = write_token_memmap(ids, tmp_path / "train.bin", vocab_size=50257, tokenizer="gpt2")
    assert path.stat().st_size == 2 * 1001  # uint16
    assert np.array_equal(np.fromfile(path, dtype="<u2"), ids)  # nanoGPT's reader sees the same ids
    assert read_token_meta(path) == {"dtype": "uint16", "n_tokens": 1001, "tokenizer": "gpt2", "vocab_size": 50257}
    ds = get_dataset("tokens", root=path, block_size=100)
    assert len(ds) == 10
    x, y = ds[3]
    assert x.dtype == torch.int64 and x.tolist() == ids[300:400].tolist() and y.tolist() == ids[301:401].tolist()
    assert ds[-1][0].tolist() == ids[900:1000].tolist()
    with pytest.raises(IndexError):
        ds[10]
    xb, yb = ds.get_batch(4, generator=torch.Generator().manual_seed(0))
    assert xb.shape == (4, 100) and torch.equal(xb[:, 1:], yb[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(ids, 101)  # every (x, y) window of the stream
    for x, y in zip(xb.numpy(), yb.numpy()):
        assert (np.all(windows[:, :100] == x, axis=1) & np.all(windows[:, 1:] == y, axis=1)).any()


def test_token_memmap_pickles_without_copying_tokens(tmp_path):
    import pickle

    ids = np.arange(5000) % 300
    ds = TokenMemmap(write_token_memmap(ids, tmp_path / "t.bin"), block_size=16)
    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # the path, not the 10 kB of tokens
    back = pickle.loads(blob)
    assert isinstance(back.tokens, np.memmap) and back[7][0].tolist() == ids[112:128].tolist()
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
    x, y = next(iter(loader))
    assert x.shape == (4, 16) and x[1].tolist() == ids[16:32].tolist() and torch.equal(x[:, 1:], y[:, :-1])


def test_token_memmap_uint32_and_raw_nanogpt_files(tmp_path):
    ids = np.array([0, 70000, 5, 65536, 1, 2, 3])
    path = write_token_memmap(ids, tmp_path / "big.bin", vocab_size=100_000)
    assert path.stat().st_size == 4 * 7 and read_token_meta(path)["dtype"] == "uint32"
    assert TokenMemmap(path, block_size=3)[0][0].tolist() == [0, 70000, 5]
    raw = tmp_path / "nanogpt.bin"
    np.array([7, 8, 9, 10, 11], dtype=np.uint16).tofile(raw)
    with pytest.raises(ValueError, match=r"dtype must be given .*no nanogpt.bin.json sidecar"):
        TokenMemmap(raw, block_size=2)
    assert TokenMemmap(raw, block_size=2, dtype="uint16")[1][1].tolist() == [10, 11]


def test_token_memmap_bad_input(tmp_path):
    with pytest.raises(ValueError, match="cannot hold token id 70000"):
        write_token_memmap([1, 70000], tmp_path / "a.bin", dtype="uint16")
    with pytest.raises(ValueError, match="must be < vocab_size=10, got an id 12"):
        write_token_memmap([1, 12], tmp_path / "a.bin", vocab_size=10)
    with pytest.raises(ValueError, match="non-negative"):
        write_token_memmap([-1, 2], tmp_path / "a.bin")
    with pytest.raises(ValueError, match="1-D integer"):
        write_token_memmap(np.zeros((2, 2), dtype=np.int64), tmp_path / "a.bin")
    with pytest.raises(ValueError, match="dtype must be one of"):
        write_token_memmap([1], tmp_path / "a.bin", dtype="int8")
    write_token_memmap([1, 2, 3], tmp_path / "s.bin")
    with pytest.raises(ValueError, match="block_size=3 needs at least 4 tokens"):
        TokenMemmap(tmp_path / "s.bin", block_size=3)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        TokenMemmap(tmp_path / "s.bin", block_size=0)
    with pytest.raises(FileNotFoundError, match="diffattn data tokenize"):
        TokenMemmap(tmp_path / "none.bin", block_size=2)
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match="not a multiple of 2"):
        TokenMemmap(tmp_path / "odd.bin", block_size=1, dtype="uint16")


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_data_list(capsys):
    assert main(["data", "list", "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"data directory: {ROOT} (from --root)"
    assert out[1].split()[:3] == ["name", "kind", "installed"]
    rows = {line.split()[0]: line for line in out[2:]}
    assert set(rows) == {*DATASETS, "gpt2"}
    assert "MIT" in rows["fashion_mnist"] and "GPL-2.0" in rows["tuxpaint_captions"]
    for name, d in DATASETS.items():
        assert (" yes " in rows[name]) == d.installed(ROOT)


def test_cli_data_list_marks_missing_sets(tmp_path, capsys):
    assert main(["data", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("no: diffattn data prepare ") == len(DATASETS)  # digits ships with scikit-learn; + gpt2 ranks
    assert "no: diffattn data prepare tuxpaint_captions" in out.splitlines()[5]  # tuxpaint_vqa is made from it
