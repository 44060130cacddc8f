"""A retrofitted model under transformers' Trainer: λ reaches the logs that report_to integrations receive,
checkpoints resume with the schedule where it was, and every checkpoint reloads with from_pretrained_retrofit."""

from __future__ import annotations

import warnings

import pytest
import torch

T = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import diffattn  # noqa: E402
import diffattn.adapters as A  # noqa: E402

CFG = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           max_position_embeddings=32, num_labels=2)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, seq: int = 8):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 64, (n, seq), generator=g)
        self.labels = (self.ids[:, 0] > 32).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Recorder(T.TrainerCallback):
    """Stands for a report_to integration: the Trainer calls those before the callbacks passed to it."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(**CFG))
    return A.retrofit(model, "daa", anneal_steps=6, lambda_init=0.5, trainable=("classifier",))


def _args(out, **kw) -> T.TrainingArguments:
    base = dict(output_dir=str(out), per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1,
                report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    return T.TrainingArguments(**(base | kw))


@pytest.mark.slow
def test_lambda_reaches_callbacks_that_run_before_the_callback(tmp_path, one_thread):
    model = _model()
    rec = Recorder()
    trainer = T.Trainer(model=model, args=_args(tmp_path, max_steps=4), train_dataset=Rows(), callbacks=[rec])
    A.DiffAttnCallback.attach(trainer)
    assert isinstance(trainer.callback_handler.callbacks[0], A.DiffAttnCallback)
    trainer.train()
    steps = [r for r in rec.logs if "loss" in r]
    assert len(steps) == 4
    for i, r in enumerate(steps, start=1):  # logged after optimizer step i: t = i, λ(t) of DAA (2025) eq. 3
        assert r["diffattn/anneal_step"] == i and r["diffattn/anneal_progress"] == pytest.approx(i / 6)
        assert {f"diffattn/lambda_{j}" for j in (0, 1)} <= set(r)
        assert r["diffattn/lambda_mean"] == pytest.approx((r["diffattn/lambda_0"] + r["diffattn/lambda_1"]) / 2)
    # λ(t) = (1 − α)(t/T)λ_init + α λ_learn, α = t/T: recompute the last one from the layer's λ_learn
    lam = A.lambda_summary(model)
    for row in lam:
        a = 4 / 6
        want = (1 - a) * a * 0.5 + a * row["lambda_learn"]
        assert steps[-1][f"diffattn/lambda_{row['index']}"] == pytest.approx(want, abs=1e-6)
    hist = [h for h in trainer.state.log_history if "loss" in h]
    assert hist[-1]["diffattn/anneal_step"] == 4  # the history holds λ as well


def test_callback_in_callbacks_list_warns_when_integrations_would_miss_lambda(tmp_path, one_thread):
    model = _model()
    trainer = T.Trainer(model=model, args=_args(tmp_path, max_steps=1), train_dataset=Rows(),
                        callbacks=[A.DiffAttnCallback()])
    trainer.args.report_to = ["tensorboard"]  # set after construction: no integration is built, the check sees it
    with pytest.warns(UserWarning, match=r"DiffAttnCallback.attach\(trainer\)"):
        trainer.train()
    assert A.lambda_summary(model)[0]["step"] == 1


@pytest.mark.slow
def test_trainer_checkpoints_resume_and_reload(tmp_path, one_thread):
    rows = Rows()
    model = _model()
    trainer = T.Trainer(model=model, args=_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2),
                        train_dataset=rows)
    A.DiffAttnCallback.attach(trainer)
    trainer.train()
    ckpt = tmp_path / "checkpoint-2"
    assert ckpt.is_dir() and (tmp_path / "checkpoint-4").is_dir()

    # a checkpoint is a retrofitted model: from_pretrained_retrofit restores it, schedule step included
    reloaded = diffattn.from_pretrained_retrofit(tmp_path / "checkpoint-4").eval()
    model.eval()
    ids = rows.ids[:3]
    with torch.no_grad():
        assert (reloaded(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item() <= 1e-6
    assert [r["step"] for r in A.lambda_summary(reloaded)] == [4, 4]

    # resume from checkpoint-2: the schedule goes on from t = 2 and ends where the uninterrupted run ended
    fresh = _model()
    trainer2 = T.Trainer(model=fresh, args=_args(tmp_path / "resumed", max_steps=4), train_dataset=rows)
    A.DiffAttnCallback.attach(trainer2)
    trainer2.train(resume_from_checkpoint=str(ckpt))
    assert [r["step"] for r in A.lambda_summary(fresh)] == [4, 4]
    fresh.eval()
    with torch.no_grad():
        diff = (fresh(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item()
    assert diff <= 1e-5

    # and the plain architecture is told that it drops the retrofit
    with pytest.warns(A.RetrofitCheckpointWarning, match=r"from_pretrained_retrofit"):
        plain = T.BertForSequenceClassification.from_pretrained(ckpt)
    assert not A.adapters(plain)


def test_lambda_logs_rejects_a_plain_model():
    with pytest.raises(ValueError, match="no retrofitted layers"):
        A.lambda_logs(torch.nn.Linear(2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="log_lambda must be a bool"):
            A.DiffAttnCallback(log_lambda="yes")
