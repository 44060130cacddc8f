"""What importing diffattn imports, and the hooks that replace import-time side effects.

``import diffattn`` imports neither torch nor an optional library; ``diffattn --version`` imports no torch; the
library with torch (every subpackage ``import diffattn`` used to load) imports no optional library either. Every
public name still resolves (lazily), and what diffattn adds to timm and transformers is there once they are
imported, in either order, without diffattn importing them. Each check runs in a fresh interpreter, since this
test process has imported most of these libraries already. Timing is measured by benchmarks/import_time.py, never
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import diffattn
from diffattn import _hooks

SRC = Path(__file__).resolve().parents[1] / "src"

#: optional (or heavy, needed only by some features) libraries that ``import diffattn`` and the library must leave
#: unimported; PIL and torchvision are only needed for images, triton only for the fused kernel
OPTIONAL = ("transformers", "timm", "open_clip", "ultralytics", "matplotlib", "peft", "sklearn", "scipy",
            "tensorboard", "lm_eval", "webdataset", "tiktoken", "PIL", "torchvision", "triton", "onnx",
            "onnxruntime", "skimage", "imagecorruptions", "torchdata", "rich", "safetensors")


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it ends with ``print(json.dumps(...))``, whose value is returned."""
    return json.loads(_python("-c", textwrap.dedent(code)).stdout.strip().splitlines()[-1])


def _top_level_modules(code: str) -> set[str]:
    tail = "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    return set(_run(textwrap.dedent(code) + tail))


def test_import_diffattn_imports_no_torch_and_no_optional_library():
    loaded = _top_level_modules("import diffattn")
    assert "torch" not in loaded and "numpy" not in loaded
    assert not loaded & set(OPTIONAL), sorted(loaded & set(OPTIONAL))


def test_import_diffattn_touches_no_other_library():
    """No environment variable is set, no logger of transformers is created (nor a filter put on it), nothing is
    registered with timm: what ``import diffattn`` leaves behind is one finder on sys.meta_path, waiting for timm
    and transformers."""
    out = _run("""
        import json, logging, os, sys
        env = dict(os.environ)
        import diffattn
        print(json.dumps({"env_changed": sorted(set(os.environ.items()) ^ set(env.items())),
                          "loggers": sorted(n for n in logging.Logger.manager.loggerDict if "transformers" in n),
                          "finders": [type(f).__name__ for f in sys.meta_path],
                          "pending": diffattn._hooks.pending()}))
    """)
    assert out["env_changed"] == []
    assert out["loggers"] == []
    assert out["finders"].count("_PostImportFinder") == 1
    assert out["pending"] == ["timm", "transformers.modeling_utils"]


def test_version_imports_no_torch():
    """``python -m diffattn --version`` (what the ``diffattn`` script runs: diffattn.cli.main) answers without
    importing torch; ``-X importtime`` lists every module the command imported."""
    res = _python("-X", "importtime", "-m", "diffattn", "--version")
    assert res.stdout.strip() == f"diffattn {diffattn.__version__}"
    imported = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "diffattn.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", *OPTIONAL)}


@pytest.mark.slow
def test_the_library_imports_no_optional_library():
    """With torch: every name of ``diffattn.__all__`` and every library subpackage ``import diffattn`` used to
    load (adapters with every binding, convert, data, models with their registry) imports no optional library."""
    loaded = _top_level_modules("""
        import diffattn
        import diffattn.adapters, diffattn.convert, diffattn.data, diffattn.io, diffattn.losses, diffattn.models
        for name in diffattn.__all__:
            getattr(diffattn, name)
    """)
    assert "torch" in loaded
    assert not loaded & set(OPTIONAL), sorted(loaded & set(OPTIONAL))


def test_public_names_resolve_lazily():
    """Every name of ``__all__`` resolves to what its subpackage defines, ``dir`` lists them, and a name that is
    not there is an AttributeError (so ``hasattr`` works)."""
    import diffattn.adapters
    import diffattn.data
    import diffattn.functional
    import diffattn.layers
    import diffattn.models

    for name in diffattn.__all__:
        assert getattr(diffattn, name) is not None, name
    assert set(diffattn.__all__) <= set(dir(diffattn))
    assert diffattn.create_model is diffattn.models.create_model
    assert diffattn.retrofit is diffattn.adapters.retrofit
    assert diffattn.DiffAttention is diffattn.layers.DiffAttention
    assert diffattn.diff_attention is diffattn.functional.diff_attention
    assert diffattn.get_dataset is diffattn.data.get_dataset
    assert diffattn.register_timm is diffattn.models.register_timm is diffattn.factory.register_timm
    assert diffattn.from_pretrained is diffattn.models.from_pretrained is diffattn.factory.from_pretrained
    assert diffattn.models.load_diffclip is diffattn.convert.load_diffclip
    assert not hasattr(diffattn, "no_such_name")
    namespace: dict = {}
    exec("from diffattn import *", namespace)
    assert set(diffattn.__all__) <= set(namespace)


@pytest.mark.slow
@pytest.mark.parametrize("diffattn_first", [True, False], ids=["diffattn-first", "libraries-first"])
def test_timm_and_transformers_hooks_in_either_order(diffattn_first):
    """diffattn's vision models are in timm's registry and transformers' loading logger carries the
    RetrofitCheckpointWarning filter, whichever of diffattn and the library is imported first; timm keeps its own
    loader, and the finder leaves sys.meta_path once both have fired."""
    first, second = "import diffattn", "import timm, transformers.modeling_utils"
    out = _run(f"""
        import json, logging, sys
        {first if diffattn_first else second}
        {second if diffattn_first else first}
        from diffattn.adapters.hf import _DroppedAdapterFilter
        import timm
        logger = logging.getLogger("transformers.modeling_utils")
        print(json.dumps({{
            "timm": [timm.is_model(n) for n in ("diff_vit_nano", "dg_vit_nano", "diffattn_vit_nano")],
            "vit_base_is_timms": timm.models.model_entrypoint("vit_base_patch16_224").__module__,
            "built": type(timm.create_model("diff_vit_nano", num_classes=3)).__module__,
            "loader": type(timm.__spec__.loader).__name__, "same_loader": timm.__loader__ is timm.__spec__.loader,
            "filters": sum(isinstance(f, _DroppedAdapterFilter) for f in logger.filters),
            "finders": [type(f).__name__ for f in sys.meta_path], "pending": diffattn._hooks.pending()}}))
    """)
    assert out["timm"] == [True, True, True]
    assert out["vit_base_is_timms"] == "timm.models.vision_transformer"  # timm's own names are never overridden
    assert out["built"] == "diffattn.models.vit"
    assert out["loader"] == "SourceFileLoader" and out["same_loader"]
    assert out["filters"] == 1
    assert "_PostImportFinder" not in out["finders"] and out["pending"] == []


def test_register_timm_is_idempotent():
    pytest.importorskip("timm")
    import timm

    names = diffattn.register_timm()
    again = diffattn.register_timm()
    assert again == names and len(set(names)) == len(names)
    assert "diff_vit_nano" in names and "diffattn_diff_vit_nano" in names
    assert timm.is_model("diff_vit_nano")


# ------------------------------------------------------------------------ diffattn._hooks on a made-up module


@pytest.fixture
def fake_library(tmp_path, monkeypatch):
    """A package ``fakelib_<test>`` on sys.path whose import records the order of events in ``fakelib.EVENTS``."""
    name = "fakelib_" + os.urandom(4).hex()
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("EVENTS = ['executed']\nfrom . import sub\n")
    (pkg / "sub.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    with _hooks._finder._lock:
        _hooks._finder.hooks.pop(name, None)
        _hooks._finder.hooks.pop(name + ".sub", None)
        if not _hooks._finder.hooks and _hooks._finder in sys.meta_path:
            sys.meta_path.remove(_hooks._finder)


def test_hook_runs_once_after_the_import_finishes(fake_library):
    import importlib

    seen = []
    _hooks.when_imported(fake_library, lambda m: seen.append(list(m.EVENTS) + [m.sub.VALUE]))
    _hooks.when_imported(fake_library + ".sub", lambda m: seen.append(m.VALUE))
    assert seen == [] and fake_library in _hooks.pending()
    module = importlib.import_module(fake_library)
    assert seen == [42, ["executed", 42]]  # the submodule finishes first; each hook saw its module complete
    assert fake_library not in _hooks.pending()
    importlib.reload(module)
    assert len(seen) == 2  # once
    _hooks.when_imported(fake_library, lambda m: seen.append("now"))  # already imported: runs at once
    assert seen[-1] == "now"


def test_a_failing_hook_warns_and_the_import_succeeds(fake_library):
    import importlib

    def broken(module):
        raise RuntimeError("boom")

    _hooks.when_imported(fake_library, broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(fake_library)
    assert module.sub.VALUE == 42
    assert [w.category for w in caught] == [_hooks.DiffattnHookWarning]
    assert "boom" in str(caught[0].message) and fake_library in str(caught[0].message)
