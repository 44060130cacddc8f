"""The lm-evaluation-harness model ``diffattn`` end to end on local tasks (task YAML over a local JSONL), offline."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

QUESTIONS = [
    {"question": "The cat sat on the", "choices": ["mat", "sky", "idea"], "answer": 0},
    {"question": "Two plus two is", "choices": ["four", "blue"], "answer": 0},
    {"question": "Water is", "choices": ["dry", "wet"], "answer": 1},
    {"question": "The sun rises in the", "choices": ["east", "west", "ocean"], "answer": 0},
]


def _write_task(tmp_path, name, body):
    (tmp_path / f"{name}.yaml").write_text(body)


@pytest.fixture(scope="module")
def saved_lm(tmp_path_factory):
    from diffattn.models import create_model

    torch.manual_seed(0)
    model = create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=2, num_heads=4, max_seq_len=64).eval()
    d = tmp_path_factory.mktemp("run") / "model"
    model.save_pretrained(d)
    return model, d.parent  # the run directory: the model lies in run/model


def _setup_tasks(tmp_path):
    data = tmp_path / "toy.jsonl"
    data.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": t}) for t in ["Call me Ishmael.", "It was the best of times."]))
    gen = tmp_path / "gen.jsonl"
    gen.write_text(json.dumps({"prompt": "Say:", "target": "xyz"}) + "\n")
    _write_task(tmp_path, "toy_mc", f"""task: toy_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    _write_task(tmp_path, "toy_ppl", f"""task: toy_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""")
    _write_task(tmp_path, "toy_gen", f"""task: toy_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {gen}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 5
metric_list:
  - metric: exact_match
""")


def _loglik(model, context: str, continuation: str) -> float:
    ids = list((context + continuation).encode())
    n = len(continuation.encode())
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0, -n:].double(), -1)
    return logp.gather(1, torch.tensor(ids[-n:])[:, None]).sum().item()


@pytest.mark.slow  # ~20 s: lm-eval builds the tasks and runs three request types
def test_lm_eval_local_tasks_end_to_end(saved_lm, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from diffattn.eval.lm_harness import register

    register()  # puts "diffattn" in lm-eval's registry

    model, run_dir = saved_lm
    _setup_tasks(tmp_path)
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = lm_eval.simple_evaluate(model="diffattn", model_args=f"pretrained={run_dir},tokenizer=bytes",
                                  tasks=["toy_mc", "toy_ppl", "toy_gen"], task_manager=tasks, batch_size=1,
                                  device="cpu")
    res = out["results"]
    # independent reference: argmax over choices of log p(" " + choice | question), as lm-eval builds it
    hits = [max(range(len(q["choices"])), key=lambda i: _loglik(model, q["question"], " " + q["choices"][i]))
            == q["answer"] for q in QUESTIONS]
    assert res["toy_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
    # word perplexity: exp(−Σ loglik / #words) with loglik of every byte after a newline prefix
    texts = ["Call me Ishmael.", "It was the best of times."]
    total = sum(_loglik(model, "\n", t) for t in texts)
    words = sum(len(t.split()) for t in texts)
    assert res["toy_ppl"]["word_perplexity,none"] == pytest.approx(torch.tensor(-total / words).exp().item(),
                                                                   rel=1e-4)
    assert res["toy_gen"]["exact_match,none"] in (0.0, 1.0)


def test_lm_eval_model_rejects_bad_args(saved_lm):
    from diffattn.eval.lm_harness import DiffattnLM

    _, run_dir = saved_lm
    with pytest.raises(ValueError, match="exactly one of pretrained"):
        DiffattnLM()
    with pytest.raises(TypeError, match="unknown model_args"):
        DiffattnLM(pretrained=str(run_dir), tokenizer="bytes", temperature=1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        DiffattnLM(pretrained=str(run_dir), dtype="int8")


def test_lm_eval_model_on_retrofitted_hf_base_with_adapter(tmp_path):
    T = pytest.importorskip("transformers")
    import diffattn
    from diffattn.eval.lm_harness import DiffattnLM

    cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0,
                       eos_token_id=0)
    base = T.GPT2LMHeadModel._from_config(cfg).eval()
    base.save_pretrained(tmp_path / "base")
    diffattn.retrofit(base, "daa", lambda_init=0.5)
    with torch.no_grad():
        for p in base.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    diffattn.save_adapter(base, tmp_path / "adapter")
    lm = DiffattnLM(base=str(tmp_path / "base"), adapter=str(tmp_path / "adapter"), tokenizer="bytes",
                    device="cpu")

    class Req:
        def __init__(self, *args):
            self.args = args

    (ll, _), = lm.loglikelihood([Req("Hello", " world")])
    ids = list(b"Hello world")
    with torch.no_grad():
        logp = F.log_softmax(base(torch.tensor([ids[:-1]])).logits[0, -6:].double(), -1)
    assert ll == pytest.approx(logp.gather(1, torch.tensor(ids[-6:])[:, None]).sum().item(), rel=1e-5)
