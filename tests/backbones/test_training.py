"""`model=timm` end to end: trained from a local weights file, its checkpoint serves every entry
point once the file is gone; the backbone frozen for its epochs (one process and DDP), compiled,
resumed exactly; `callbacks=[default,ema]` tests what eval.py tests."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    ROOT,
    assert_same_run,
    compose_config,
    free_port,
    run_in_process,
    run_script,
)

from litforge.backbones.timm import TimmNet

MODEL = "test_resnet"


def backbone_names() -> list[str]:
    """The names of the backbone's parameters in a checkpoint's state_dict."""
    net = TimmNet((3, 32, 32), 3, MODEL)
    return [f"net.backbone.{name}" for name, _ in net.backbone.named_parameters()]


def state(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, weights_only=True)["state_dict"]


def assert_frozen_for_one_epoch(checkpoints: Path, weights: Path) -> None:
    """epoch_000.ckpt: the backbone as the weights file holds it, a trained head;
    epoch_001.ckpt: the backbone trained too."""
    from safetensors.torch import load_file

    loaded = load_file(weights)
    first, second = state(checkpoints / "epoch_000.ckpt"), state(checkpoints / "epoch_001.ckpt")
    for name in backbone_names():
        torch.testing.assert_close(first[name], loaded[name.removeprefix("net.backbone.")])
    assert any(not torch.equal(first[n], second[n]) for n in backbone_names())
    assert not torch.equal(second["net.head.weight"], first["net.head.weight"])


FREEZE_ONE_EPOCH = [
    "callbacks=[default,freeze_backbone]",
    "callbacks.freeze_backbone.epochs=1",
    "callbacks.model_checkpoint.save_top_k=-1",  # every epoch's checkpoint
    "trainer.max_epochs=2",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, weights, colour_images, timm_args):
    """train.py from a copy of the weights file, which is then deleted: what is left is the
    checkpoint. Its backbone frozen for the first of two epochs."""
    tmp = tmp_path_factory.mktemp("trained")
    file = shutil.copy(weights, tmp / "weights.safetensors")
    record = tmp / "probabilities.pt"
    args = timm_args(
        colour_images,
        f"model.net.pretrained_file={file}",
        *FREEZE_ONE_EPOCH,
        "+callbacks.record._target_=helpers.RecordTestProbabilities",
        f"+callbacks.record.path={record}",
        f"hydra.run.dir={tmp / 'run'}",
    )
    result = run_in_process("train.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    Path(file).unlink()
    metrics = json.loads((tmp / "run" / "metrics.json").read_text())
    checkpoints = tmp / "run" / "checkpoints"
    best = torch.load(checkpoints / "last.ckpt", weights_only=True)["callbacks"]
    best = next(v["best_model_path"] for k, v in best.items() if k.startswith("ModelCheckpoint"))
    return SimpleNamespace(
        run=tmp / "run",
        checkpoints=checkpoints,
        best=Path(best),
        metrics=metrics,
        probabilities=torch.load(record),
        test_files=sorted((colour_images / "test").rglob("*.png")),
    )


@pytest.mark.slow
def test_the_backbone_is_frozen_for_its_epochs_then_trains(trained, weights):
    assert_frozen_for_one_epoch(trained.checkpoints, weights)
    assert trained.metrics["test/acc"] > 0.9, "the colours are learned"
    said = (trained.run / "train.log").read_text()
    assert said.count("Backbone frozen for epoch(s) 0 to 0") == 1
    assert said.count("Backbone unfrozen at epoch 1") == 1


@pytest.mark.slow
def test_the_checkpoint_alone_evaluates(trained, colour_images, tmp_path):
    from litforge.pipeline import evaluate

    hp = torch.load(trained.best, weights_only=True)["hyper_parameters"]
    assert "pretrained_file" not in hp["net"] and hp["input_shape"] == [3, 128, 128]
    overrides = [f"ckpt_path={trained.best}", "data=image_folder", f"data.root={colour_images}"]
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", [*overrides, "logger=none"]))
    assert evaluated["test/acc"] == pytest.approx(trained.metrics["test/acc"], abs=1e-6)
    assert evaluated["test/loss"] == pytest.approx(trained.metrics["test/loss"], abs=1e-5)


@pytest.mark.slow
def test_the_checkpoint_alone_predicts(trained, colour_images, tmp_path):
    pytest.importorskip("litforge.deploy", reason="the deploy feature is left out")
    from litforge.deploy.predict import predict

    overrides = [f"ckpt_path={trained.best}", f"input={colour_images / 'test'}"]
    predict(compose_config("predict", tmp_path / "predict", [*overrides, "predict.device=cpu"]))
    rows = (tmp_path / "predict" / "run" / "predictions.csv").read_text().splitlines()[1:]
    names = sorted(p.name for p in (colour_images / "test").iterdir())
    expected = {
        str(p): names[int(q.argmax())]
        for p, q in zip(trained.test_files, trained.probabilities, strict=True)
    }
    assert {r.split(",")[0]: r.split(",")[1] for r in rows} == expected


@pytest.mark.slow
@pytest.mark.parametrize("file_format", ["onnx", "pt2"])
def test_the_checkpoint_alone_exports_and_serves(trained, colour_images, tmp_path, file_format):
    """export.py checks the file against the checkpoint on the test images; the server's model
    process answers from the checkpoint."""
    pytest.importorskip("litforge.deploy", reason="the deploy feature is left out")
    from litforge.deploy.export import export
    from litforge.deploy.serve import ImageClassifierAPI

    overrides = [
        f"ckpt_path={trained.best}",
        f"format={file_format}",
        f"export.sample_input={colour_images / 'test'}",
    ]
    path = export(compose_config("export", tmp_path, overrides))
    check = json.loads((path.parent / "model.json").read_text())["check"]
    assert check["max_abs_logit_difference"] <= 1e-4 and check["same_top_class"] == 1.0

    api = ImageClassifierAPI(str(trained.best), "ckpt_path", 1, max_batch_size=8, batch_timeout=0)
    api.setup("cpu")
    image = api.model.contract.prepare(trained.test_files[0].read_bytes()).numpy()
    answer = api.encode_response(api.predict(api.decode_request(image)))
    assert answer["label"] == trained.test_files[0].parent.name


@pytest.mark.slow
def test_ddp_on_two_processes_freezes_the_backbone_on_both(
    tmp_path, weights, colour_images, timm_args
):
    args = timm_args(
        colour_images,
        f"model.net.pretrained_file={weights}",
        *FREEZE_ONE_EPOCH,
        "strategy=ddp",
        "strategy.timeout.minutes=3",
        "trainer.devices=2",
        "test=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    result = run_script("train.py", *args, env={"MASTER_PORT": str(free_port())}, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_frozen_for_one_epoch(tmp_path / "run" / "checkpoints", weights)


@pytest.mark.slow
def test_a_compiled_backbone_trains(tmp_path, colour_images, timm_args):
    args = timm_args(
        colour_images,
        "model.compile=true",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "test=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    # In its own process (torch.compile's state stays out of this one), compiling in it alone.
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    result = run_script("train.py", *args, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_result(tmp_path, weights, colour_images, timm_args):
    """Killed in its second epoch, as the backbone starts to train; resumed from last.ckpt once
    the weights file is gone (the checkpoint holds the weights)."""
    file = shutil.copy(weights, tmp_path / "weights.safetensors")

    def args(run: Path, *extra: str) -> list[str]:
        return timm_args(
            colour_images,
            f"model.net.pretrained_file={file}",
            "callbacks=[default,freeze_backbone]",
            "trainer.max_epochs=2",
            "trainer.deterministic=true",
            "model.net.drop_rate=0.3",
            "data.horizontal_flip=true",
            "data.crop_scale=[0.5,1]",
            f"hydra.run.dir={run}",
            *extra,
        )

    uninterrupted = run_in_process("train.py", *args(tmp_path / "uninterrupted"))
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    run = tmp_path / "run"
    fault = ["+callbacks.fault._target_=helpers.SendSignal", "+callbacks.fault.signal=SIGKILL"]
    fault += ["+callbacks.fault.epoch=1", "+callbacks.fault.batch=1"]
    killed = run_script("train.py", *args(run, *fault), env={"PYTHONPATH": str(ROOT / "tests")})
    assert killed.returncode == -9, killed.stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    Path(file).unlink()
    resumed = run_in_process("train.py", *args(run, f"ckpt_path={last}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run, tmp_path / "uninterrupted")


@pytest.mark.slow
def test_ema_tests_the_average_as_eval_py_does(tmp_path, colour_images, timm_args):
    args = timm_args(
        colour_images,
        "callbacks=[default,ema]",
        "callbacks.ema.decay=0.5",  # over a few steps: far from the current weights
        "trainer.max_epochs=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    result = run_in_process("train.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    trained = json.loads((tmp_path / "run" / "metrics.json").read_text())
    [best] = (tmp_path / "run" / "checkpoints").glob("epoch_*.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    assert "current_model_state" in checkpoint  # resuming goes on from the current weights
    assert (tmp_path / "run" / "train.log").read_text().count("EMA weights in use") == 1
    from litforge.pipeline import evaluate

    overrides = [f"ckpt_path={best}", "data=image_folder", f"data.root={colour_images}"]
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", [*overrides, "logger=none"]))
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], abs=1e-5)


def test_freezing_a_network_without_a_backbone_is_one_line(tmp_path, idx_data_dir):
    from helpers import tiny_run_args

    args = tiny_run_args(idx_data_dir, tmp_path / "run", "callbacks=[default,freeze_backbone]")
    result = run_in_process("train.py", *args)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: callbacks.freeze_backbone: MLP has no `backbone` to freeze: use a network with "
        "one (model=timm), or leave freeze_backbone out of callbacks."
    )
