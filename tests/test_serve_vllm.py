"""Serving through stock vLLM with diffattn's plugin, on the CPU in float32: for every architecture the plugin
registers, greedy tokens of ``vllm.LLM.generate`` equal diffattn's cached ``generate`` (and transformers' for
DiffLlama) for a batch of prompts of different lengths submitted together, one longer than a KV block, two sharing a
prefix (prefix caching on, chunked prefill forced by a small token budget); prompt logprobs within 1e-4 of diffattn's.
Tensor parallelism over the CPU's two cores and the compiled decoder (vLLM's default) give the same tokens. Then
vLLM's OpenAI server on 127.0.0.1 answers ``/v1/completions`` for a Motif-2-12.7B-layout folder.

These tests need vLLM, which pins its own torch: ``make test-serving`` builds ``.venv-serve`` and runs them there
(``DIFFATTN_REQUIRE_VLLM=1``, so a missing vLLM fails instead of skipping). In the main environment they skip.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

if os.environ.get("DIFFATTN_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (the serving lane: an ImportError here fails the lane with its reason)
vllm = pytest.importorskip("vllm", reason="vLLM is not installed in this environment; `make test-serving` runs these "
                                          "tests in .venv-serve")

pytestmark = pytest.mark.serving

VOCAB, DIM, BLOCK = 256, 128, 32
NEW = 8
_g = torch.Generator().manual_seed(1234)
PREFIX = torch.randint(0, VOCAB, (40,), generator=_g).tolist()
PROMPTS = [torch.randint(0, VOCAB, (5,), generator=_g).tolist(),
           torch.randint(0, VOCAB, (50,), generator=_g).tolist(),  # longer than one KV block (32 tokens)
           PREFIX + [3, 1, 4],
           PREFIX + [2, 7, 1, 8, 2, 8, 1, 8, 2]]
LATER = PREFIX + [9, 9, 9, 5]  # submitted after the batch: its first block comes from the prefix cache


def _lm(kind: str, **extra):
    from diffattn.models import CausalLM

    attention = dict(kind=kind, lambda_init="ye", qkv_bias=False, out_bias=False) | extra
    return CausalLM(VOCAB, DIM, 2, 10 if kind == "grouped" else 4, attention=attention, max_seq_len=256)


def _motif(grouped: bool):
    from diffattn.models.motif import MotifLM

    attention = dict(kind="grouped", num_noise_heads=2, head_dim=32, num_kv_heads=4, lambda_init="motif",
                     qkv_bias=False, out_bias=False) if grouped else dict(kind="diff", lambda_init="motif",
                                                                          qkv_bias=False, out_bias=False)
    return MotifLM(VOCAB, DIM, 2, 10 if grouped else 4, attention=attention, mlp_hidden=256, max_seq_len=256)


def _perturb(model) -> None:
    """Random λ, sub-norm and PolyNorm parameters (they start at constants), so every part of a layer counts."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("lambda", "diff_norm", "act_fn", "gate_proj", "norm")) and p.dim() <= 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


# name → (builder of the diffattn model, how the folder is written: "diffattn", "diffllama" or "motif")
CASES = {
    "standard": (lambda: _lm("standard", num_kv_heads=2), "diffattn"),
    "diff": (lambda: _lm("diff", num_kv_heads=2), "diffattn"),
    "gated": (lambda: _lm("gated"), "diffattn"),
    "diff_v2": (lambda: _lm("diff_v2", num_kv_heads=2), "diffattn"),
    "grouped_4to1": (lambda: _lm("grouped", num_noise_heads=2, head_dim=32, num_kv_heads=4), "diffattn"),
    "motif_lm_grouped": (lambda: _motif(True), "diffattn"),
    "diffllama": (lambda: _lm("diff", num_kv_heads=2, sub_norm_affine=False, sub_norm_eps=1e-5), "diffllama"),
    "motif_2.6b_layout": (lambda: _motif(False), "motif"),
    "motif_2_12.7b_layout": (lambda: _motif(True), "motif"),
}


def _write(name: str, tmp_path):
    """(diffattn model, folder in the case's layout, transformers model or None)."""
    build, layout = CASES[name]
    torch.manual_seed(list(CASES).index(name))
    model = build().eval()
    _perturb(model)
    folder = tmp_path / name
    hf = None
    if layout == "diffattn":
        model.save_pretrained(folder)
    elif layout == "diffllama":
        from diffattn.convert import to_diffllama

        hf = to_diffllama(model).eval()
        hf.save_pretrained(folder)
    else:
        from diffattn.convert.motif import to_motif

        to_motif(model, folder)
    return model, folder, hf


def _reference(model, hf):
    tokens = [model.generate(torch.tensor([p]), NEW)[0, len(p):].tolist() for p in PROMPTS + [LATER]]
    if hf is not None:
        hf_tokens = [hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                 pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
        assert hf_tokens == tokens[:len(PROMPTS)]
    logprobs = []
    with torch.no_grad():
        for p in PROMPTS:
            lp = torch.log_softmax(model(torch.tensor([p]))[0].double(), dim=-1)  # (N, V)
            logprobs.append([lp[t - 1, p[t]].item() for t in range(1, len(p))])
    return tokens, logprobs


def _engine(folder):
    return vllm.LLM(model=str(folder), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                    gpu_memory_utilization=0.1, max_model_len=256, block_size=BLOCK, enable_prefix_caching=True,
                    max_num_batched_tokens=64, max_num_seqs=8, disable_log_stats=False, seed=0)


def _shutdown(llm) -> None:
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_tokens_and_prompt_logprobs_equal_diffattn(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    model, folder, hf = _write(name, tmp_path)
    want, want_lp = _reference(model, hf)
    llm = _engine(folder)
    try:
        params = vllm.SamplingParams(max_tokens=NEW, min_tokens=NEW, temperature=0.0, detokenize=False,
                                     prompt_logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        # without prompt logprobs (a request that asks for them recomputes its whole prompt)
        greedy = vllm.SamplingParams(max_tokens=NEW, min_tokens=NEW, temperature=0.0, detokenize=False)
        later = llm.generate([{"prompt_token_ids": LATER}], greedy, use_tqdm=False)[0]
        metrics = {m.name: m for m in llm.get_metrics()}
    finally:
        _shutdown(llm)
    got = [list(o.outputs[0].token_ids) for o in outs] + [list(later.outputs[0].token_ids)]
    assert got == want
    worst = 0.0
    for o, p, lp in zip(outs, PROMPTS, want_lp):
        served = [o.prompt_logprobs[t][p[t]].logprob for t in range(1, len(p))]
        worst = max(worst, max(abs(a - b) for a, b in zip(served, lp)))
    hits = metrics.get("vllm:prefix_cache_hits")
    report = os.environ.get("DIFFATTN_SERVE_REPORT")  # scripts/serve_report.py renders docs/serving.md's table
    if report:
        with open(report, "a", encoding="utf-8") as f:
            f.write(json.dumps({"case": name, "tokens": sum(map(len, got)), "prompt_logprob_max_diff": worst,
                                "prefix_cache_hits": hits.value if hits is not None else None}) + "\n")
    assert worst <= 1e-4, f"prompt logprobs differ by {worst:.3g}"
    assert hits is not None and hits.value >= BLOCK, "the later prompt did not reuse the cached prefix"


def _greedy(folder, **engine) -> list[list[int]]:
    """The greedy tokens vLLM gives for :data:`PROMPTS`, from an engine with ``engine``'s settings."""
    llm = vllm.LLM(model=str(folder), skip_tokenizer_init=True, dtype="float32", gpu_memory_utilization=0.1,
                   max_model_len=256, seed=0, **engine)
    try:
        params = vllm.SamplingParams(max_tokens=NEW, min_tokens=NEW, temperature=0.0, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    finally:
        _shutdown(llm)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("name", ["gated", "grouped_4to1"])
def test_the_compiled_decoder_gives_the_same_tokens(name, tmp_path, monkeypatch):
    """vLLM's default path (no ``enforce_eager``): the decoder traced by ``torch.compile`` (inductor on the CPU);
    a λ read from the tokens (gated) and grouped attention at 4:1."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    model, folder, _ = _write(name, tmp_path)
    want = [model.generate(torch.tensor([p]), NEW)[0, len(p):].tolist() for p in PROMPTS]
    assert _greedy(folder) == want


# tensor-parallel cases: grouped differential attention at 4:1 with 2 key/value groups (one per rank), a λ per noise
# head and PolyNorm (its sums of squares all-reduced); V2 and M-DGSA, whose λ logits are fused into qkv_proj and
# shard with their heads (V2 with a q/k/v bias and a λ without, M-DGSA the other way round)
TP_CASES = {
    "motif_lm_grouped": lambda: _motif_tp(),
    "diff_v2_qkv_bias": lambda: _lm("diff_v2", num_kv_heads=2, qkv_bias=True),
    "gated": lambda: _lm("gated"),
}


def _motif_tp():
    from diffattn.models.motif import MotifLM

    attention = dict(kind="grouped", num_noise_heads=2, head_dim=32, num_kv_heads=4, lambda_init="motif",
                     qkv_bias=False, out_bias=False, lambda_options={"per_head": True})
    return MotifLM(VOCAB, DIM, 2, 10, attention=attention, mlp_hidden=256, max_seq_len=256)


@pytest.mark.parametrize("name", list(TP_CASES))
def test_tensor_parallel_2_shards_the_groups_and_gives_the_same_tokens(name, tmp_path, monkeypatch):
    """Two ranks on the CPU's two cores give the tokens of the diffattn model (:data:`TP_CASES`)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank
    torch.manual_seed(11)
    model = TP_CASES[name]().eval()
    _perturb(model)
    model.save_pretrained(tmp_path / "tp")
    want = [model.generate(torch.tensor([p]), NEW)[0, len(p):].tolist() for p in PROMPTS]
    assert _greedy(tmp_path / "tp", enforce_eager=True, tensor_parallel_size=2) == want


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(folder) -> list[str]:
    """``vllm serve FOLDER``. vllm-cpu's ``vllm`` command exits at once asking for the version of a distribution
    named "vllm" (its own is "vllm-cpu"); there the same OpenAI server starts from its module."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    return [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", str(folder)]


def _post(url: str, body: dict, timeout: float = 60.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_the_server_answers_completions_for_a_motif_12_7b_layout_folder(tmp_path):
    model, folder, _ = _write("motif_2_12.7b_layout", tmp_path)
    prompts = [PROMPTS[0], PROMPTS[1]]
    want = [model.generate(torch.tensor([p]), NEW)[0, len(p):].tolist() for p in prompts]
    port = _free_port()
    cmd = _serve_command(folder) + ["--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
                                    "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1",
                                    "--max-model-len", "256"]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, "vllm serve exited: " + (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not start in 240 s: " + \
                (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        for p, w in zip(prompts, want):
            body = {"model": str(folder), "prompt": p, "max_tokens": NEW, "min_tokens": NEW, "temperature": 0.0,
                    "return_token_ids": True}
            answer = _post(base + "/v1/completions", body)
            assert answer["choices"][0]["token_ids"] == w
        batch = _post(base + "/v1/completions", {"model": str(folder), "prompt": prompts, "max_tokens": NEW,
                                                 "min_tokens": NEW, "temperature": 0.0, "return_token_ids": True})
        assert sorted(c["index"] for c in batch["choices"]) == [0, 1]
        assert [c["token_ids"] for c in sorted(batch["choices"], key=lambda c: c["index"])] == want
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
