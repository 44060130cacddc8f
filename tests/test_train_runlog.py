"""diffattn.train.runlog: ``metrics.jsonl`` as a resumed run finds it (rows after its checkpoint dropped) and as a
finished run reports it (its last training loss)."""

from __future__ import annotations

import json
import math

from diffattn.train.runlog import last_logged_loss, truncate_metrics


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_truncate_metrics_drops_the_rows_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    truncate_metrics(path, 3)  # nothing logged yet: nothing to do
    assert not path.exists()
    _write(path, [{"step": s, "loss": 1.0 / s} for s in range(1, 6)] + [{"step": 4, "eval": {"accuracy": 0.5}}])
    truncate_metrics(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_last_logged_loss_is_the_last_training_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert math.isnan(last_logged_loss(path))
    _write(path, [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 1.25}, {"step": 2, "eval": {"loss": 9.0}}])
    assert last_logged_loss(path) == 1.25
    _write(path, [{"step": 2, "eval": {"accuracy": 1.0}}])
    assert math.isnan(last_logged_loss(path))
