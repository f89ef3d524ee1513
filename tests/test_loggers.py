"""`logger=`: tensorboard records the model graph when asked; a resumed CSV log keeps its rows.
W&B and MLflow: tests/tracking/."""

import importlib.util

import pytest
from helpers import compose_config

from litforge.pipeline import train


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard: pip install -e '.[loggers]'",
)
@pytest.mark.parametrize("log_graph", [False, True])
def test_tensorboard_records_the_graph_when_asked(tmp_path, idx_data_dir, log_graph):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = ["data=mnist", "data.val_size=100", "trainer.max_epochs=1"]
    overrides += ["logger=tensorboard", f"logger.tensorboard.log_graph={log_graph}"]
    train(compose_config("train", tmp_path, overrides))
    graphs = []
    for events in (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if accumulator.Tags()["graph"]:
            graphs.append({node.name.split("/")[0] for node in accumulator.Graph().node})
    if log_graph:  # Lightning records it when fitting and again when testing
        assert graphs and all(g == {"input", "output", "ClassificationModule"} for g in graphs)
    else:
        assert graphs == []


def test_a_resumed_csv_log_is_rewritten_by_rank_zero_only(tmp_path, monkeypatch):
    """Other processes of a resumed job leave metrics.csv alone: two rewriting it at once lost
    the kept rows' columns (seen in a requeued SLURM job)."""
    from lightning.pytorch.utilities import rank_zero_only

    from litforge.loggers import CSVLogger

    metrics = tmp_path / "csv" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("epoch,step,val/acc\n0,9,0.5\n")
    before = metrics.stat().st_mtime_ns
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = CSVLogger(tmp_path, name="csv", version="", resume_from="last.ckpt")
    logger.experiment  # noqa: B018 (what Lightning touches first)
    assert metrics.read_text() == "epoch,step,val/acc\n0,9,0.5\n"
    assert metrics.stat().st_mtime_ns == before
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert CSVLogger(tmp_path, name="csv", version="", resume_from="x").experiment.metrics_keys


def test_a_resumed_csv_log_keeps_its_rows_without_saying_they_will_be_deleted(tmp_path, recwarn):
    from litforge.loggers import CSVLogger

    metrics = tmp_path / "csv" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("epoch,step,val/acc\n0,9,0.5\n")
    logger = CSVLogger(tmp_path, name="csv", version="", resume_from="last.ckpt")
    logger.log_metrics({"val/acc": 0.75}, step=19)
    logger.save()
    assert metrics.read_text().splitlines()[1:] == ["0,9,0.5", ",19,0.75"]
    assert not [w for w in recwarn if "will be deleted" in str(w.message)]
