"""`strategy=model_parallel`: FSDP2 and tensor parallelism over CPU processes (gloo): the
parameters sharded as litforge/model_parallel/parallelize.py says, both checkpoint formats,
resuming from each, and single-device evaluation of the result (a folder of shards put together
into one file first: `python -m litforge.model_parallel to-file`)."""

import json
import math
import subprocess

import pytest
import torch
from helpers import (
    ROOT,
    compose_config,
    free_port,
    predicted_accuracy,
    run_script,
    tiny_run_args,
)

from litforge.model_parallel.shards import read_meta, to_file
from litforge.pipeline import evaluate as pipeline_evaluate

MP = ["strategy=model_parallel", "strategy.timeout.minutes=3"]


def train(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {"MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT / "tests")}
    result = run_script("train.py", *args, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def recording_placements(path) -> list[str]:
    """Overrides that make the run write how its parameters are held (helpers.RecordPlacements)."""
    return [
        "+callbacks.placements._target_=helpers.RecordPlacements",
        f"+callbacks.placements.path={path}",
    ]


def placements(path) -> dict[str, tuple[list[str], list[str]] | None]:
    """{parameter: (placements, mesh dimensions)}, None for a plain (unsharded) tensor."""
    held = json.loads(path.read_text())
    return {k: v and (v["placements"], v["mesh"]) for k, v in held.items()}


def evaluate(ckpt, data_dir, out_dir) -> dict:
    """eval.py's test metrics for `ckpt`, on one device (in this process: the single-device
    path needs no subprocess)."""
    overrides = [f"ckpt_path={ckpt}", "data=mnist", f"paths.data_dir={data_dir}"]
    return pipeline_evaluate(compose_config("eval", out_dir, overrides))


@pytest.mark.slow
def test_fsdp2_shards_every_layer_its_folders_evaluate_and_resume(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    args = tiny_run_args(
        idx_data_dir,
        run_dir,
        *MP,
        "trainer.devices=2",
        "trainer.precision=bf16-mixed",
        "trainer.gradient_clip_val=1.0",
        *recording_placements(tmp_path / "placements.json"),
    )
    train(*args)
    # every weight of the MLP sharded by rows over the two data-parallel processes
    held = placements(tmp_path / "placements.json")
    assert held and all(v == (["S(0)"], ["data_parallel"]) for v in held.values()), held
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_dir(), "save_distributed_checkpoint=true writes a folder of shards"

    # The best checkpoint's folder of shards, put together into one file: eval.py tests it
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    assert best.is_dir()
    whole = to_file(best)
    trained = json.loads((run_dir / "metrics.json").read_text())
    evaluated = evaluate(whole, idx_data_dir, tmp_path / "e1")
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)
    # and predict.py / export.py / serve.py take it (one device, the normalization from it)
    predicted = predicted_accuracy(whole, idx_data_dir)
    assert predicted == pytest.approx(trained["test/acc"], abs=1e-6)
    # train=false under the same strategy: every process reads the folder, then shards it again
    train(
        *tiny_run_args(
            idx_data_dir,
            tmp_path / "t",
            *MP,
            "trainer.devices=2",
            "train=false",
            f"ckpt_path={best}",
        )
    )
    tested_metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert tested_metrics["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)

    resumed_dir = tmp_path / "resumed"
    train(
        *tiny_run_args(
            idx_data_dir,
            resumed_dir,
            *MP,
            "trainer.devices=2",
            "trainer.max_epochs=2",
            f"ckpt_path={last}",
            "test=false",
        )
    )
    state = read_meta(resumed_dir / "checkpoints" / "last.ckpt")  # a folder of shards
    assert state["epoch"] == 1 and state["global_step"] == 2 * 5  # 500 images / (2 x 50) per step


@pytest.mark.slow
def test_tensor_parallel_cnn_single_file_checkpoint_evaluates_and_resumes(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    common = [
        "model=cnn",
        "model.net.channels=[8]",
        "model.net.hidden_size=16",
        *MP,
        "trainer.devices=2",
        "strategy.data_parallel_size=1",
        "strategy.tensor_parallel_size=2",
        "strategy.save_distributed_checkpoint=false",
    ]
    result = train(
        *tiny_run_args(
            idx_data_dir, run_dir, *common, *recording_placements(tmp_path / "placements.json")
        )
    )
    # the head's two linear layers split as a column/row pair; the convolutions are not sharded
    held = placements(tmp_path / "placements.json")
    assert held["head.3.weight"] == (["S(0)"], ["tensor_parallel"])
    assert held["head.6.weight"] == (["S(1)"], ["tensor_parallel"])
    assert held["features.0.weight"] is None
    # tensor-parallel ranks share their data: one data-parallel replica
    assert (
        "Batch size: 50 per process x 1 data-parallel process(es)" in result.stdout + result.stderr
    )
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    assert best.is_file()
    evaluated = evaluate(best, idx_data_dir, tmp_path / "e")
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=0.011)  # ±1 image

    resumed = tmp_path / "resumed"
    train(
        *tiny_run_args(
            idx_data_dir,
            resumed,
            *common,
            "trainer.max_epochs=2",
            f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
            "test=false",
        )
    )
    state = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == 20


@pytest.mark.slow
def test_two_by_two_mesh_on_four_processes(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    result = train(
        *tiny_run_args(
            idx_data_dir,
            run_dir,
            "model=cnn",
            "model.net.channels=[4]",
            "model.net.hidden_size=8",
            *MP,
            "trainer.devices=4",
            "strategy.tensor_parallel_size=2",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1",
            *recording_placements(tmp_path / "placements.json"),
        ),
        timeout=500,
    )
    assert "x 2 data-parallel process(es)" in result.stdout + result.stderr
    # the trunk sharded over data_parallel; the head over both mesh dimensions: FSDP2 splits
    # the tensor-parallel shards again (a strided shard of the same dimension)
    held = placements(tmp_path / "placements.json")
    assert held["features.0.weight"] == (["S(0)"], ["data_parallel"])
    dp_head, tp_head = held["head.3.weight"][0]
    assert dp_head.startswith("_S(0") and tp_head == "S(0)"
    assert held["head.6.weight"] == (["S(0)", "S(1)"], ["data_parallel", "tensor_parallel"])
    assert (run_dir / "metrics.json").is_file()


# The README's model_parallel shapes (strategy and pipeline sections) for each network. Covered
# above or in test_stages.py: MLP FSDP2 over 2, MLP in 2 stages (gpipe, interleaved), MLP 2
# stages x 2 data-parallel, CNN tensor parallel over 2, CNN 2 x 2 mesh, CNN 2 stages x 2 tensor
# parallel. The rest here, the CNN on RGB photos with its default two convolution blocks
# (channels-last weights, which FSDP2 cannot shard as they are).
README_SHAPES = {
    "fsdp2": ["trainer.devices=2"],
    "pipeline": ["trainer.devices=2", "strategy.pipeline_parallel_size=2"],
    "pipeline_x_fsdp2": ["trainer.devices=4", "strategy.pipeline_parallel_size=2"],
    "fsdp2_x_tensor": ["trainer.devices=4", "strategy.tensor_parallel_size=2"],
    "pipeline_x_tensor": [
        "trainer.devices=4",
        "strategy.pipeline_parallel_size=2",
        "strategy.tensor_parallel_size=2",
        "strategy.microbatches=4",
        "strategy.schedule=gpipe",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("network", "shape"),
    [
        ("cnn", "fsdp2"),
        ("cnn", "pipeline"),
        ("cnn", "pipeline_x_fsdp2"),
        ("mlp", "fsdp2_x_tensor"),
        ("mlp", "pipeline_x_tensor"),
    ],
)
def test_every_network_trains_in_every_readme_shape(tmp_path, network, shape):
    from helpers import write_cifar10

    data_dir = tmp_path / "data"
    write_cifar10(data_dir, per_batch=40, n_test=40)
    run_dir = tmp_path / "run"
    train(
        f"model={network}",
        "data=cifar10",
        "data._target_=helpers.WrittenCIFAR10DataModule",
        f"paths.data_dir={data_dir}",
        "data.val_size=40",
        "data.batch_size=8",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "logger=none",
        f"hydra.run.dir={run_dir}",
        *MP,
        *README_SHAPES[shape],
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert math.isfinite(metrics["train/loss"]) and "test/acc" in metrics


class WithBackbone(torch.nn.Module):
    """A network with no plan of its own but a `backbone` of blocks (as model=timm's)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Module()
        self.backbone.stem = torch.nn.Linear(4, 4)
        self.backbone.blocks = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(2)),
            torch.nn.Identity(),  # no parameters: nothing to shard
        )
        self.head = torch.nn.Linear(4, 2)


def test_a_network_with_a_backbone_is_sharded_by_its_blocks():
    from litforge.model_parallel.parallelize import backbone_units, count_blocks, has_plan

    net = WithBackbone()
    assert not has_plan(net) and count_blocks(net) == 1  # no cut for a pipeline is known
    assert backbone_units(net.backbone) == [net.backbone.blocks[0], net.backbone.blocks[1]]
    with pytest.raises(TypeError, match="does not know how to place Linear"):
        count_blocks(torch.nn.Linear(2, 2))
