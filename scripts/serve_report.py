"""Runs the serving exactness tests (tests/test_serve_vllm.py, greedy and logprob cases) in the serving environment
and writes what they measured into docs/serving.md's "serve-exact" section: per architecture, whether the greedy
tokens were equal (the tests assert it) and the largest prompt-logprob difference against diffattn.

    .venv-serve/bin/python scripts/serve_report.py        # after `make test-serving` built .venv-serve
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    import torch
    import vllm

    from diffattn.utils import cpu_name, write_markdown_section

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**os.environ, "DIFFATTN_SERVE_REPORT": str(report), "DIFFATTN_REQUIRE_VLLM": "1"}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "greedy",
                        str(ROOT / "tests" / "test_serve_vllm.py")], check=True, env=env, cwd=ROOT)
        rows = [json.loads(line) for line in report.read_text().splitlines()]
    lines = [f"Measured by `.venv-serve/bin/python scripts/serve_report.py` (vLLM {vllm.__version__}, torch "
             f"{torch.__version__}, {cpu_name() or platform.machine()}, float32):", "",
             "| architecture (test case) | greedy tokens compared | equal | prompt logprobs, largest difference | "
             "prefix-cache hits (tokens) |", "|---|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['case']}` | {r['tokens']} | yes | {r['prompt_logprob_max_diff']:.1e} | "
                     f"{r['prefix_cache_hits']:.0f} |")
    write_markdown_section(ROOT / "docs" / "serving.md", "serve-exact", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
