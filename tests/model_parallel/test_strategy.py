"""`strategy=model_parallel` (litforge/model_parallel/strategy.py): its config builds, what
cannot run is one line before anything starts, and a lost pipeline stage is named."""

import pytest
from helpers import assert_dead_rank_named, assert_option_builds, compose_config
from hydra.utils import instantiate

from litforge.errors import UserError
from litforge.model_parallel import ModelParallelStrategy
from litforge.pipeline import prepare_run


def test_the_config_composes_resolves_and_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    resolved = assert_option_builds(
        tmp_path, ["strategy=model_parallel", "trainer.accelerator=cpu"]
    )
    strategy = instantiate(resolved.strategy)
    assert type(strategy) is ModelParallelStrategy
    assert strategy._timeout.total_seconds() == 30 * 60  # a dead peer does not hang forever
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == ("auto", 1)
    assert (strategy.pipeline_parallel_size, strategy.schedule) == (1, "1f1b")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy=model_parallel", "trainer.precision=16-mixed"], "16-mixed is not supported"),
        (
            ["strategy=model_parallel", "trainer.devices=2", "strategy.tensor_parallel_size=3"],
            "must multiply to trainer.devices x trainer.num_nodes = 2",
        ),
        (
            [
                "strategy=model_parallel",
                "trainer.devices=2",
                "strategy.tensor_parallel_size=2",
                "debug=limit",
                "trainer.devices=2",
            ],
            "detect_anomaly=true",
        ),
    ],
)
def test_impossible_combinations_are_refused_before_launch(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        prepare_run(compose_config("train", tmp_path, overrides))


@pytest.mark.slow
def test_a_dead_pipeline_stage_stops_the_job_with_its_name(tmp_path, idx_data_dir):
    # The other stage waits for its activations when it dies.
    assert_dead_rank_named(
        tmp_path,
        idx_data_dir,
        "strategy=model_parallel",
        "strategy.pipeline_parallel_size=2",
        "strategy.microbatches=2",
    )
