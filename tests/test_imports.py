"""What importing diffattn imports, and the explicit calls that replace import-time side effects.

``import diffattn`` imports neither torch nor an optional library; ``diffattn --version`` imports no torch; the
library with torch (every subpackage ``import diffattn`` used to load) imports no optional library either. Every
public name still resolves (lazily). What diffattn adds to timm and transformers is added by explicit calls
(``diffattn.register_timm()``, the transformers loading-log filter installed by the calls that retrofit or load a
transformers model), never by an import (tests/test_structure.py checks every module). Each check runs in a fresh
interpreter, since this test process has imported most of these libraries already. Timing is measured by
benchmarks/import_time.py, never here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import diffattn

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
    registered with timm, and nothing waits on sys.meta_path for a later import."""
    out = _run("""
        import json, logging, os, sys
        env, finders = dict(os.environ), list(sys.meta_path)
        import diffattn
        print(json.dumps({"env_changed": sorted(set(os.environ.items()) ^ set(env.items())),
                          "loggers": sorted(n for n in logging.Logger.manager.loggerDict if "transformers" in n),
                          "finders_added": [type(f).__name__ for f in sys.meta_path if f not in finders]}))
    """)
    assert out["env_changed"] == []
    assert out["loggers"] == []
    assert out["finders_added"] == []


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
def test_timm_and_transformers_get_diffattn_only_through_explicit_calls():
    """With diffattn, timm and transformers all imported, timm knows no diffattn model and transformers' loading
    logger carries no filter; ``diffattn.register_timm()`` and ``install_load_warning()`` add them (timm keeps
    its own loader and its own names)."""
    out = _run("""
        import json, logging
        import diffattn, timm, transformers.modeling_utils
        from diffattn.adapters.load_warning import _DroppedAdapterFilter, install_load_warning
        logger = logging.getLogger("transformers.modeling_utils")
        names = ("diff_vit_nano", "dg_vit_nano", "diffattn_vit_nano")
        before = {"timm": [timm.is_model(n) for n in names],
                  "filters": sum(isinstance(f, _DroppedAdapterFilter) for f in logger.filters)}
        diffattn.register_timm()
        install_load_warning()
        install_load_warning()
        print(json.dumps({"before": before, "timm": [timm.is_model(n) for n in names],
                          "vit_base_is_timms": timm.models.model_entrypoint("vit_base_patch16_224").__module__,
                          "built": type(timm.create_model("diff_vit_nano", num_classes=3)).__module__,
                          "loader": type(timm.__spec__.loader).__name__,
                          "filters": sum(isinstance(f, _DroppedAdapterFilter) for f in logger.filters)}))
    """)
    assert out["before"] == {"timm": [False, False, False], "filters": 0}
    assert out["timm"] == [True, True, True]
    assert out["vit_base_is_timms"] == "timm.models.vision_transformer"  # timm's own names are never overridden
    assert out["built"] == "diffattn.models.vit"
    assert out["loader"] == "SourceFileLoader"
    assert out["filters"] == 1  # idempotent


def test_retrofit_of_a_transformers_model_installs_the_load_warning():
    """The one call that makes retrofitted transformers checkpoints (diffattn.retrofit) puts the filter on
    transformers' loading logger, so that a plain reload of them in the same process is reported."""
    out = _run("""
        import json, logging
        import torch, transformers as T
        import diffattn
        from diffattn.adapters.load_warning import _DroppedAdapterFilter
        logger = logging.getLogger("transformers.modeling_utils")
        count = lambda: sum(isinstance(f, _DroppedAdapterFilter) for f in logger.filters)
        before = count()
        torch.manual_seed(0)
        model = T.BertModel(T.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32))
        diffattn.retrofit(model, "daa")
        print(json.dumps({"before": before, "after": count()}))
    """)
    assert out == {"before": 0, "after": 1}


def test_register_timm_is_idempotent():
    pytest.importorskip("timm")
    import timm

    names = diffattn.register_timm()
    again = diffattn.register_timm()
    assert again == names and len(set(names)) == len(names)
    assert "diff_vit_nano" in names and "diffattn_diff_vit_nano" in names
    assert timm.is_model("diff_vit_nano")
