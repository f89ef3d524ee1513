"""`model=timm` under `strategy=model_parallel`: FSDP2 data parallelism over the backbone's
blocks (it has no tensor or pipeline plan, which is refused before launch)."""

import json

import pytest
from helpers import ROOT, free_port, run_in_process, run_script

pytest.importorskip("litforge.model_parallel", reason="the model_parallel feature is left out")


@pytest.mark.slow
def test_fsdp2_shards_the_backbone_over_two_processes(tmp_path, weights, colour_images, timm_args):
    placements = tmp_path / "placements.json"
    args = timm_args(
        colour_images,
        f"model.net.pretrained_file={weights}",
        "strategy=model_parallel",
        "strategy.timeout.minutes=3",
        "trainer.devices=2",
        "+callbacks.placements._target_=helpers.RecordPlacements",
        f"+callbacks.placements.path={placements}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    env = {"MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT / "tests")}
    result = run_script("train.py", *args, env=env, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    held = json.loads(placements.read_text())
    assert held and all(
        v == {"placements": ["S(0)"], "mesh": ["data_parallel"]} for v in held.values()
    ), held
    assert "test/acc" in json.loads((tmp_path / "run" / "metrics.json").read_text())


@pytest.mark.parametrize(
    "sizes",
    [
        ["strategy.tensor_parallel_size=2", "strategy.data_parallel_size=1"],
        ["strategy.pipeline_parallel_size=2", "data.batch_size=4"],
    ],
)
def test_tensor_and_pipeline_parallelism_are_refused_before_launch(
    tmp_path, colour_images, timm_args, sizes
):
    args = timm_args(colour_images, "strategy=model_parallel", "trainer.devices=2", *sizes)
    result = run_in_process("train.py", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: model_parallel: TimmNet has no tensor/pipeline plan: use "
        "strategy.tensor_parallel_size=1 and strategy.pipeline_parallel_size=1 (data parallelism "
        "with FSDP2), or add a plan in src/litforge/model_parallel/parallelize.py "
        "(docs/model_parallel.md)."
    )
