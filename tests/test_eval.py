"""`python eval.py ckpt_path=...`: test a checkpoint with the network stored in it."""

import contextlib
import logging
import shlex

import pytest
import torch
from helpers import (
    CRAFTED,
    LEGACY_CRAFTS,
    REFUSED,
    compose_config,
    crafted_checkpoint,
    run_script,
    write_idx_dataset,
)
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
    write_idx_dataset(data_dir / "MNIST" / "raw")
    write_idx_dataset(
        data_dir / "FashionMNIST" / "raw"
    )  # for the test of another dataset's checkpoint
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
    """eval.py rebuilds the module from the checkpoint alone, whatever callbacks the run had
    (none naming its class: ours); a class the checkpoint names from elsewhere is refused."""
    overrides = ["data=mnist", "data.val_size=100", f"paths.data_dir={idx_data_dir}"]
    overrides += ["trainer.max_epochs=1"]
    overrides += [
        "callbacks=none",
        "+callbacks.ckpt._target_=lightning.pytorch.callbacks.ModelCheckpoint",
    ]
    overrides += [f"+callbacks.ckpt.dirpath={tmp_path / 'ckpts'}", "logger=none", "test=false"]
    train(compose_config("train", tmp_path / "t", overrides))
    checkpoint = torch.load(next((tmp_path / "ckpts").glob("*.ckpt")), weights_only=True)
    assert "module_class" not in checkpoint
    path = tmp_path / "plain.ckpt"
    torch.save(checkpoint, path)
    data = ["data=mnist", f"ckpt_path={path}", f"paths.data_dir={idx_data_dir}", "logger=none"]
    assert "test/acc" in evaluate(compose_config("eval", tmp_path / "e", data))
    torch.save({**checkpoint, "module_class": "subprocess.Popen"}, path)
    with pytest.raises(UserError, match=r"module_class._target_='subprocess.Popen' is not allo"):
        evaluate(compose_config("eval", tmp_path / "e2", data))


def test_callbacks_none_tests_the_final_weights_and_eval_finds_lightnings_checkpoint(
    tmp_path, idx_data_dir, caplog
):
    """With callbacks=none Lightning's own checkpoint callback saves under the logger's folder:
    the run says it tests the final weights, and eval.py given the run folder names the file."""
    caplog.set_level(logging.INFO)
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
@pytest.mark.parametrize(
    ("under", "craft"), [("hyper_parameters", craft) for craft in CRAFTED] + LEGACY_CRAFTS
)
def test_a_checkpoint_builds_only_trusted_classes(tmp_path, one_epoch_run, under, craft, entry):
    """A checkpoint is data: where its settings are built (eval.py, load_from_checkpoint; and
    predict, export and serve: tests/deploy/test_inference.py), what they name is checked before
    anything is called (here: nothing made in `made/`), alike wherever Lightning's loading takes
    the module's arguments from: `hyper_parameters`, the legacy keys `hparams` and
    `module_arguments`, or all as one argument that `hparams_name` names. Resuming and
    train=false build the module from the run's own config: the checkpoint's settings build
    nothing there either."""
    from litforge.models import ClassificationModule

    last, data_dir = one_epoch_run
    path, made = crafted_checkpoint(last, craft, tmp_path, under=under)
    data = ["data=mnist", f"ckpt_path={path}", f"paths.data_dir={data_dir}", "logger=none"]
    if entry in ("eval.py", "load_from_checkpoint"):
        with pytest.raises(UserError, match=REFUSED):
            if entry == "eval.py":
                evaluate(compose_config("eval", tmp_path / "e", data))
            else:  # as docs/evaluation.md shows; fit would go on
                module = ClassificationModule.load_from_checkpoint(path, weights_only=True)
                module.configure_optimizers()
    else:  # (a crafted optimizer class: refused, as the saved state fits only its own)
        more = ["train=false"] if entry == "train=false" else ["trainer.max_epochs=2"]
        with contextlib.suppress(UserError):
            train(compose_config("train", tmp_path / "t", [*data, *more]))
    assert not any(made.iterdir())


def test_module_arguments_are_what_lightning_passes_to_the_constructor(tmp_path, monkeypatch):
    """`checkpoints.module_arguments` gathers a module's arguments from a checkpoint as the
    installed Lightning does, and Lightning reads no other key of the checkpoint for them: a
    Lightning that starts reading another one fails here."""
    import lightning as L
    from lightning.pytorch.core import saving

    from litforge.checkpoints import check_buildable, module_arguments

    class Recording(L.LightningModule):
        received: dict = {}

        def __init__(self, net=None, lr=0.1, mean=None):
            super().__init__()
            Recording.received = {"net": net, "lr": lr, "mean": mean}

    read = set()

    class ReadKeys(dict):  # the checkpoint, noting each key that is read
        def get(self, key, *default):
            read.add(key)
            return super().get(key, *default)

        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            read.add(key)
            return super().__contains__(key)

    load_state = saving._load_state  # (private: only this test reads it, to watch it)
    watched = lambda cls, ckpt, **kw: load_state(cls, ReadKeys(ckpt), **kw)  # noqa: E731
    monkeypatch.setattr(saving, "_load_state", watched)
    cases = [
        {"hyper_parameters": {"lr": 0.5}},
        {"hyper_parameters": {"lr": 0.5, "net": {"a": 1}}, "hparams_name": None},
        {"hyper_parameters": {"a": 1, "lr": 2}, "hparams_name": "net"},
        {"hyper_parameters": {"lr": 3}, "hparams_name": "kwargs", "hparams_type": "dict"},
    ]
    for case in cases:
        path = tmp_path / "c.ckpt"
        torch.save({"state_dict": {}, "pytorch-lightning_version": L.__version__, **case}, path)
        Recording.load_from_checkpoint(path, weights_only=True)
        expected = {"net": None, "lr": 0.1, "mean": None, **module_arguments(case, Recording)}
        assert Recording.received == expected, case
    # What module_arguments reads (the legacy keys: refused when they hold anything);
    # state_dict: the weights, loaded after the constructor.
    assert read <= {"hyper_parameters", "hparams_name", "hparams_type", "state_dict"} | set(
        saving.CHECKPOINT_PAST_HPARAMS_KEYS
    )
    for key in saving.CHECKPOINT_PAST_HPARAMS_KEYS:
        with pytest.raises(UserError, match=f"settings under {key}, keys of Lightning before"):
            check_buildable({"hyper_parameters": {}, key: {"lr": 1}}, "x.ckpt")


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


OVERSIZED = {  # settings that would build far more than the checkpoint holds (~19 GB: hidden)
    "a hidden layer of 6,000,000 units": ("net", {"hidden_sizes": [6_000_000]}),
    "3,000,000 classes": ("num_classes", 3_000_000),
    "a 4096x4096x7x7 convolution": (
        "net",
        {"_target_": "litforge.models.cnn.CNN", "channels": [4096, 4096], "kernel_size": 7},
    ),
    "settings the network does not take": ("net", {"_target_": "litforge.models.cnn.CNN", "x": 1}),
    "images of 100000 px": ("input_shape", [1, 100_000, 100_000]),
    "20,000 classes": ("num_classes", 20_000),
}


@pytest.mark.parametrize("craft", OVERSIZED)
def test_settings_larger_than_the_checkpoints_tensors_are_refused_before_building(
    tmp_path, one_epoch_run, craft
):
    from litforge.models import ClassificationModule

    last, data_dir = one_epoch_run
    checkpoint = torch.load(last, weights_only=True)
    key, value = OVERSIZED[craft]
    if key == "net" and "_target_" not in value:  # the MLP's other settings kept
        value = {**checkpoint["hyper_parameters"]["net"], **value}
    checkpoint["hyper_parameters"][key] = value
    path = tmp_path / "oversized.ckpt"
    torch.save(checkpoint, path)
    refused = r"another architecture than|is out of range: (images|at most)|build no module"
    data = ["data=mnist", f"ckpt_path={path}", f"paths.data_dir={data_dir}", "logger=none"]
    with pytest.raises(UserError, match=refused):
        evaluate(compose_config("eval", tmp_path / "e", data))
    with pytest.raises(UserError, match=refused):
        ClassificationModule.load_from_checkpoint(path, weights_only=True)


@pytest.mark.slow
def test_eval_refuses_a_checkpoint_of_a_6_million_unit_layer_under_1_5_gb(tmp_path, one_epoch_run):
    """The whole command, as a user runs it, measured by its own peak memory (resident)."""
    last, data_dir = one_epoch_run
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["hyper_parameters"]["net"]["hidden_sizes"] = [6_000_000]
    path = tmp_path / "oversized.ckpt"
    torch.save(checkpoint, path)
    measured = (
        "import resource, runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n"
        "    print('peak_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    args = [f"ckpt_path={path}", "data=mnist", f"paths.data_dir={data_dir}", "logger=none"]
    args += [f"hydra.run.dir={tmp_path / 'e'}"]
    done = run_script("-c", measured, "eval.py", *args)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "error:" in done.stderr and "another architecture than" in done.stderr
    peak_kb = int(done.stdout.split("peak_kb")[-1])
    assert peak_kb < 1.5 * 2**20, f"peak {peak_kb / 2**20:.2f} GB"


@pytest.mark.parametrize("given", ["s3://bucket/last.ckpt", "a file object"])
def test_load_from_checkpoint_takes_local_files_only(tmp_path, one_epoch_run, given):
    """What it checks is read from a local file; Lightning would read any other source unchecked."""
    from litforge.models import ClassificationModule

    last, _ = one_epoch_run
    with open(last, "rb") as opened:
        source = opened if given == "a file object" else given
        with pytest.raises(UserError, match="is no local file: .* Download it first"):
            ClassificationModule.load_from_checkpoint(source, weights_only=True)


def test_weights_expanded_from_one_value_are_no_weights(tmp_path, one_epoch_run):
    """A tensor saved as one value expanded to a shape has the shape but not the bytes: settings
    naming a 6,000,000-unit layer are refused on a 5 KB file too."""
    from litforge.models import ClassificationModule

    last, _ = one_epoch_run
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["hyper_parameters"]["net"]["hidden_sizes"] = [6_000_000]
    with torch.device("meta"):
        shapes = ClassificationModule(**checkpoint["hyper_parameters"]).state_dict()
    checkpoint["state_dict"] = {
        name: torch.zeros((), dtype=meta.dtype).expand(meta.shape) for name, meta in shapes.items()
    }
    checkpoint["optimizer_states"] = []
    path = tmp_path / "expanded.ckpt"
    torch.save(checkpoint, path)
    assert path.stat().st_size < 100_000
    with pytest.raises(UserError, match=r"another architecture than.*held in \d+ bytes"):
        ClassificationModule.load_from_checkpoint(path, weights_only=True)
