"""`python eval.py ckpt_path=...`: test a checkpoint with the network stored in it."""

import shlex

import pytest
import torch
from helpers import CRAFTED, REFUSED, compose_config, crafted_checkpoint, write_idx_dataset
from omegaconf import OmegaConf

from litforge.errors import UserError
from litforge.pipeline import evaluate, train


def test_eval_reproduces_the_training_test_metrics(tmp_path, idx_data_dir):
    overrides = ["data=mnist", "data.val_size=100", "trainer.max_epochs=1"]
    # A non-default network: eval must take its shape from the checkpoint, not from the config.
    trained = train(
        compose_config(
            "train",
            tmp_path / "t",
            [*overrides, "model.net.hidden_sizes=[32]", f"paths.data_dir={idx_data_dir}"],
        )
    )
    best = next((tmp_path / "t" / "run" / "checkpoints").glob("epoch_*.ckpt"))

    cfg = compose_config(
        "eval",
        tmp_path / "e",
        ["data=mnist", f"ckpt_path={best}", f"paths.data_dir={idx_data_dir}"],
    )
    evaluated = evaluate(cfg)
    assert evaluated["test/acc"] == trained["test/acc"]
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-6)
    assert (tmp_path / "e" / "run" / "metrics.json").is_file()
    assert (tmp_path / "e" / "run" / "plots" / "confusion_matrix.png").is_file()  # feature: plots
    assert not (tmp_path / "e" / "run" / "plots" / "curves.png").exists()  # feature: plots


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory):
    """An MLP trained for one epoch on small MNIST files: (its last checkpoint, the data dir).
    Shared: the tests below read the checkpoint and write edited copies elsewhere."""
    tmp = tmp_path_factory.mktemp("one_epoch")
    data_dir = tmp / "data"
    write_idx_dataset(data_dir / "mnist", gz=True)
    write_idx_dataset(data_dir / "fashion_mnist")  # for the test of another dataset's checkpoint
    overrides = ["data=mnist", "data.val_size=100", "trainer.max_epochs=1", "logger=none"]
    train(compose_config("train", tmp, [*overrides, f"paths.data_dir={data_dir}"]))
    return tmp / "run" / "checkpoints" / "last.ckpt", data_dir


def test_checkpoint_of_another_dataset_is_refused(tmp_path, one_epoch_run):
    last, data_dir = one_epoch_run
    cfg = compose_config(
        "eval",
        tmp_path / "e",
        ["data=fashion_mnist", f"ckpt_path={last}", f"paths.data_dir={data_dir}"],
    )
    with pytest.raises(UserError, match="was trained on 'mnist'.*Add data=mnist"):
        evaluate(cfg)


@pytest.mark.parametrize(
    ("ckpt", "message"),
    [(None, "no checkpoint given: add ckpt_path="), ("missing.ckpt", "no such file")],
)
def test_missing_checkpoint_is_a_clear_error(tmp_path, ckpt, message):
    overrides = [] if ckpt is None else [f"ckpt_path={tmp_path / ckpt}"]
    with pytest.raises(UserError, match=message):
        evaluate(compose_config("eval", tmp_path, overrides))


@pytest.mark.parametrize("callbacks", ["default", "[default,early_stopping]"])
def test_train_py_callbacks_pasted_into_eval_py_compose(tmp_path, callbacks):
    cfg = compose_config("eval", tmp_path, [f"callbacks={callbacks}", "ckpt_path=x.ckpt"])
    OmegaConf.resolve(cfg)
    assert cfg.callbacks.model_checkpoint.monitor == "val/acc_best"


def test_a_run_without_callbacks_evaluates_without_model(tmp_path, idx_data_dir):
    """eval.py rebuilds the registered module from the checkpoint alone, whatever callbacks
    the run had; a class the checkpoint names is never looked up."""
    overrides = ["data=mnist", "data.val_size=100", f"paths.data_dir={idx_data_dir}"]
    overrides += ["trainer.max_epochs=1"]
    overrides += [
        "callbacks=none",
        "+callbacks.ckpt._target_=lightning.pytorch.callbacks.ModelCheckpoint",
    ]
    overrides += [f"+callbacks.ckpt.dirpath={tmp_path / 'ckpts'}", "logger=none", "test=false"]
    train(compose_config("train", tmp_path / "t", overrides))
    checkpoint = torch.load(next((tmp_path / "ckpts").glob("*.ckpt")), weights_only=True)
    checkpoint["module_class"] = "subprocess.Popen"
    path = tmp_path / "plain.ckpt"
    torch.save(checkpoint, path)
    data = ["data=mnist", f"ckpt_path={path}", f"paths.data_dir={idx_data_dir}", "logger=none"]
    assert "test/acc" in evaluate(compose_config("eval", tmp_path / "e", data))


def test_callbacks_none_tests_the_final_weights_and_eval_finds_lightnings_checkpoint(
    tmp_path, idx_data_dir, caplog
):
    """With callbacks=none Lightning's own checkpoint callback saves under the logger's folder:
    the run says it tests the final weights, and eval.py given the run folder names the file."""
    overrides = ["data=mnist", "data.val_size=100", f"paths.data_dir={idx_data_dir}"]
    run = tmp_path / "run"
    overrides += ["trainer.max_epochs=1", "callbacks=none", f"paths.output_dir={run}"]
    assert "test/acc" in train(compose_config("train", run, overrides))
    assert "Testing the final weights: no checkpoint callback monitors a metric." in caplog.text
    [saved] = run.glob("*/checkpoints/*.ckpt")  # (csv/checkpoints/epoch=0-step=N.ckpt)
    data = ["data=mnist", f"paths.data_dir={idx_data_dir}", "logger=none"]
    with pytest.raises(UserError, match="is a folder of checkpoints: give one") as refused:
        evaluate(compose_config("eval", tmp_path / "e", [*data, f"ckpt_path={run}"]))
    # What it suggests, as a shell passes it on (`=` in the file name: quoted for Hydra).
    suggested = shlex.split(str(refused.value).split("e.g. ")[1].removesuffix(" (the best)"))
    assert "test/acc" in evaluate(compose_config("eval", tmp_path / "e", [*data, *suggested]))


def test_load_from_checkpoint_rebuilds_the_trained_module(one_epoch_run):
    """docs/evaluation.md's recipe for one's own code: Lightning's loading, weights only."""
    from litforge.models import ClassificationModule

    last, _ = one_epoch_run
    module = ClassificationModule.load_from_checkpoint(last, weights_only=True)
    saved = torch.load(last, weights_only=True)["state_dict"]
    assert all(torch.equal(module.state_dict()[k], v) for k, v in saved.items())
    assert module(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize("entry", ["eval.py", "load_from_checkpoint", "train=false", "resume"])
@pytest.mark.parametrize("craft", CRAFTED)
def test_a_checkpoint_builds_only_listed_networks(tmp_path, one_epoch_run, craft, entry):
    """A checkpoint is data: what its configs name is checked against litforge.models'
    lists before anything is called (here: nothing made in `made/`), on every path that reads
    one (predict, export and serve: tests/deploy/test_inference.py)."""
    from litforge.models import ClassificationModule

    last, data_dir = one_epoch_run
    path, made = crafted_checkpoint(last, craft, tmp_path)
    data = ["data=mnist", f"ckpt_path={path}", f"paths.data_dir={data_dir}", "logger=none"]
    with pytest.raises(UserError, match=REFUSED):
        if entry == "eval.py":
            evaluate(compose_config("eval", tmp_path / "e", data))
        elif entry == "load_from_checkpoint":  # as docs/evaluation.md shows; fit would go on
            module = ClassificationModule.load_from_checkpoint(path, weights_only=True)
            module.configure_optimizers()
        else:
            more = ["train=false"] if entry == "train=false" else ["trainer.max_epochs=2"]
            train(compose_config("train", tmp_path / "t", [*data, *more]))
    assert not any(made.iterdir())


def test_image_size_channels_and_normalization_come_from_the_checkpoint(tmp_path, monkeypatch):
    """A CNN trained on 160x120 RGB photos at data.image_size=128 evaluates without retyping it;
    another explicit size is one line before any image is read."""
    from helpers import write_image_folder

    from litforge.data.image_folder import ImageFolderDataModule

    counts = {"train": {"a": 12, "b": 12, "c": 12}, "test": {"a": 4, "b": 4, "c": 4}}
    root = write_image_folder(tmp_path / "photos", counts, size=(120, 160))
    data = ["data=image_folder", f"data.root={root}", "data.num_workers=0", "data.batch_size=8"]
    model = ["model=cnn", "model.net.channels=[8,16]", "model.net.hidden_size=16"]
    overrides = [*data, *model, "trainer.max_epochs=1", "logger=none"]
    trained = train(compose_config("train", tmp_path / "t", [*overrides, "data.image_size=128"]))
    best = next((tmp_path / "t" / "run" / "checkpoints").glob("epoch_*.ckpt"))

    evaluated = evaluate(compose_config("eval", tmp_path / "e", [*data, f"ckpt_path={best}"]))
    assert evaluated["test/acc"] == trained["test/acc"]

    def read(self):
        raise AssertionError("the images were read before the settings were checked")

    monkeypatch.setattr(ImageFolderDataModule, "inspect", read)
    cfg = compose_config(
        "eval", tmp_path / "e2", [*data, f"ckpt_path={best}", "data.image_size=64"]
    )
    with pytest.raises(UserError, match=r"data.image_size=64, but .* was trained with 128: leave"):
        evaluate(cfg)
