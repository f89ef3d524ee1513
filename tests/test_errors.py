"""Bad input ends a run with one clear message and a non-zero exit, not a traceback."""

import os
import re
import runpy
import sys

import pytest
import torch
from helpers import ROOT, compose_config, go_offline, run_in_process, run_script

from litforge.errors import UserError
from litforge.pipeline import evaluate, train


def test_missing_dataset_offline_is_one_message_without_traceback(tmp_path, monkeypatch):
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    args = [
        "data=mnist",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run_dir}",
    ]
    go_offline(monkeypatch)
    result = run_in_process("train.py", *args)

    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith(
        f"error: mnist not found in {data_dir / 'MNIST' / 'raw'} (its download failed: "
    )
    assert "network disabled by the test" in error_lines[0]
    assert "data.root=<a folder holding MNIST/raw/>" in error_lines[0]
    # nothing half-written: no data folder, no checkpoints, no logger output
    assert not data_dir.exists()
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "csv").exists()

    full = run_in_process("train.py", *args, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr


@pytest.mark.slow
def test_eval_without_checkpoint_says_what_to_add(tmp_path):
    result = run_in_process("eval.py", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: no checkpoint given: add ckpt_path=")
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("model=resnet", "Could not find 'model/resnet'"),
        ("trainer.max_epoch=3", "Could not override 'trainer.max_epoch'"),
        ("+trainer.gradient_clip_algorithm=foo", "`gradient_clip_algorithm` foo is invalid."),
    ],
)
def test_hydra_and_omegaconf_mistakes_are_shown_as_hydra_shows_them(tmp_path, override, words):
    # Composing (an unknown option or key), or instantiating in the task (a `???` left, a value
    # a library's constructor refuses that no annotation bounds): Hydra's own message.
    result = run_in_process("train.py", override, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert words in result.stderr, result.stderr[-2000:]
    assert "Set the environment variable HYDRA_FULL_ERROR=1" in result.stderr
    assert not (tmp_path / "run").exists()  # the folder the failed run left empty went


@pytest.mark.slow
def test_a_network_that_does_not_fit_the_images_is_one_line(tmp_path):
    # Known once the data is: checked between building the data and the module.
    overrides = ["model=cnn", "model.net.channels=[8,8,8,8,8]", f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_in_process("train.py", *overrides)
    assert result.returncode == 1
    errors = [text for text in result.stderr.splitlines() if text.strip()]
    assert errors[-1] == (
        "error: model.net.channels: 5 pooling blocks shrink 28×28 images to nothing: use fewer "
        "entries, or a larger data.image_size."
    ), result.stderr
    # nothing else from Hydra: no traceback, no "Error executing job", no HYDRA_FULL_ERROR hint
    assert not any(word in result.stderr for word in ("Traceback", "Error executing", "HYDRA_"))
    assert not (tmp_path / "run").exists()


# The entry points at the root (a lean fork may have left out predict.py, export.py, serve.py).
ENTRY_POINTS = [p.name for p in sorted(ROOT.glob("*.py")) if p.name != "setup.py"]


@pytest.mark.parametrize("script", [s for s in ENTRY_POINTS if s != "serve.py"])
def test_a_config_mistake_is_told_before_torch_and_lightning_load(tmp_path, script):
    # A `lightning` that cannot be imported: the mistake is found and told without it (in a
    # second, rather than after the several seconds Lightning takes to load).
    (tmp_path / "lightning").mkdir()
    (tmp_path / "lightning" / "__init__.py").write_text("raise ImportError('lightning loaded')")
    result = run_script(script, "nosuch=1", env={"PYTHONPATH": str(tmp_path)}, timeout=60)
    assert result.returncode == 1
    assert "Could not override 'nosuch'" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_hydra_full_error_still_shows_the_traceback(tmp_path):
    result = run_script("train.py", "model=resnet", env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert "MissingConfigException" in result.stderr


# Values checked before any data is read: the data dir below does not exist, so a check that
# came after reading would report the missing dataset instead.
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.optimizer.lr=0", "model.optimizer.lr=0: must be > 0."),
        ("model.optimizer.lr=-0.1", "model.optimizer.lr=-0.1: must be > 0."),
        ("model.optimizer.lr=fast", "model.optimizer.lr=fast: must be a number."),
        ("model.optimizer.weight_decay=-1", "model.optimizer.weight_decay=-1: must be >= 0."),
        ("model.label_smoothing=1.0", "model.label_smoothing=1.0: must be < 1."),
        ("+model.backbone_lr_scale=-1", "model.backbone_lr_scale=-1: must be >= 0."),
        ("data.batch_size=0", "data.batch_size=0: must be > 0."),
        ("data.batch_size=64.5", "data.batch_size=64.5: must be an integer."),
        ("data.batch_size=1e9", "data.batch_size=1000000000.0: must be an integer."),
        ("seed=abc", "seed=abc: must be an integer, or null."),
        ("trainer.max_epochs=0", "trainer.max_epochs=0 trains nothing: set 1 or more (-1: no"),
        ("data.val_size=-5", "data.val_size=-5: must be >= 0."),
        ("data.val_size=60000", "data.val_size=60000 must be below the 60000 training images"),
        ("+data.bach_size=8", "data.bach_size: litforge.data.fashion_mnist.FashionMNISTData"),
        ("+trainer.max_epoch=3", "takes no argument max_epoch (did you mean trainer.max_epochs?)"),
        ("+callbacks.model_checkpoint.save_top=2", "(did you mean callbacks.model_checkpoint.sav"),
        ("logger=csv +logger.csv.flush_every=1", "(did you mean logger.csv.flush_logs_every_n_"),
        ("+model.optimizer.betas=[0.9]", "model.optimizer.betas=[0.9]: must be a list of 2 values"),
        ("data.download=maybe", "data.download=maybe: must be true or false."),
        ("data.batch_size=null", "data.batch_size=null: must not be null."),
        ("data=image_folder data.root=x data.val_fraction=null", "val_fraction=null: must not be"),
        ("trainer.devices=1.5", "trainer.devices=1.5: must be a list, or a string, or an integer."),
        ("model.optimizer.lr=null", "model.optimizer.lr=null: must not be null."),
        ("trainer.max_epochs=ten", "trainer.max_epochs=ten: must be an integer, or null."),
        ("optimized_metric_mode=maximum", "optimized_metric_mode=maximum: must be one of: max,"),
        ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1: must be >= 0."),
        ("model.compile=maybe", "model.compile=maybe: must be true or false."),
        ("test=1", "test=1: must be true or false."),
        ("model=cnn model.net.channels=[]", "model.net.channels=[]: must hold at least 1 value."),
        ("model=cnn model.net.hidden_size=0", "model.net.hidden_size=0: must be > 0."),
        ("model=cnn model.net.activation=tanh", "model.net.activation=tanh: must be one of: relu"),
        ("model.net.hidden_sizes=[256,0]", "model.net.hidden_sizes=[256,0]: each value must be >"),
        ("+model.net.hiden_sizes=[8]", "(did you mean model.net.hidden_sizes?)"),
        (
            "+model.optimizer.lrr=0.1",
            "AdamW takes no argument lrr (did you mean model.optimizer.lr?)",
        ),
        ("+model.scheduler.eta_mn=0", "(did you mean model.scheduler.eta_min?)"),
        ("+model.scheduler.interval=hour", "model.scheduler.interval=hour: must be one of: epoch,"),
        (
            "model.scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau "
            "~model.scheduler.T_max",
            "model.scheduler.monitor is not set. Add +model.scheduler.monitor=val/loss",
        ),
        ("strategy=ddp +strategy.find_unused=1", "(did you mean strategy.find_unused_parameters?)"),
        ("+data.bach_size=8", "(did you mean data.batch_size?)"),
        ("data.batch_size=1.5", "data.batch_size=1.5: must be an integer."),
        (
            "data=image_folder data.root=x data.mean=[0.5] data.std=[0]",
            "data.std=[0]: each value must be > 0.",
        ),
        ("model.net.dropout=1", "model.net.dropout=1: must be < 1."),
        ("trainer.accelerator=tpu", "trainer.accelerator=tpu, but this machine has no tpu"),
        ("trainer.accelerator=quantum", "trainer.accelerator=quantum is not one of: auto, cpu,"),
        ("data=image_folder", "data.root is not set: give the folder of your images: <folder>/"),
        ("data=image_folder data.root=x data.image_size=100000", "data.image_size=100000: must be"),
        (
            "data=image_folder data.root=x data.image_size=4097",
            "data.image_size=4097: must be <= 4096.",
        ),
        ("data=image_folder data.root=x data.mean=[0,0,0] data.std=[1,0,1]", "data.std=[1,0,1]: "),
        ("data=image_folder data.root=x data.mean=[0] data.std=[-1]", "data.std=[-1]: each value"),
        ("data=image_folder data.root=x data.std=[1]", "data.mean and data.std go together"),
        ("data=image_folder data.root=x data.channels=2", "data.channels=2: must be one of: 1, 3"),
        (
            "data=image_folder data.root=x data.channels=1 data.mean=[0,0,0] data.std=[1,1,1]",
            "data.mean and data.std hold 3 and 3 values for data.channels=1: give one per channel",
        ),
        (
            "data=image_folder data.root=x data.mean=[] data.std=[]",
            "data.mean and data.std hold 0 and 0 values: give one per channel (1 or 3)",
        ),
        (
            "data=image_folder data.root=x data.mean=[0,0] data.std=[1,1]",  # no 2-channel images
            "data.mean and data.std hold 2 and 2 values: give one per channel (1 or 3), or null",
        ),
    ],
)
def test_bad_config_values_are_refused_before_reading_data(tmp_path, override, message):
    cfg = compose_config("train", tmp_path, ["paths.data_dir=/nonexistent", *override.split()])
    with pytest.raises(UserError, match=re.escape(message)):
        train(cfg)


@pytest.mark.slow
def test_bad_value_from_the_cli_is_one_line(tmp_path):
    result = run_in_process("train.py", "model.optimizer.lr=0", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("error: model.optimizer.lr=0: must be > 0.")


@pytest.mark.parametrize("accelerator", ["cpu", "auto"])
def test_several_cpu_processes_and_no_epoch_limit_are_said(
    tmp_path, caplog, monkeypatch, accelerator
):
    """What runs where, before anything starts; a warning when processes outnumber the cores."""
    from litforge.pipeline import describe_run

    caplog.set_level("INFO")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    overrides = ["strategy=ddp", "trainer.devices=4", f"trainer.accelerator={accelerator}"]
    describe_run(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=-1"]))
    found = ", no GPU found" if accelerator == "auto" else ""
    assert (
        f"trainer.devices=4 on the CPU (trainer.accelerator={accelerator}{found}): 4 processes "
        f"on this machine, gloo between them." in caplog.text
    )
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "4 processes on 2 CPU cores: they take turns" in warning.message
    assert (
        "trainer.max_epochs=-1: no epoch limit." in caplog.text and "ckpt_path=last" in caplog.text
    )

    caplog.clear()  # one process, or an epoch limit: nothing to say
    describe_run(compose_config("train", tmp_path, ["trainer.accelerator=cpu"]))
    assert not caplog.records


def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path, idx_data_dir):
    # A learning rate multiplied by 1e30 after the first epoch: the loss blows up in the second.
    overrides = [
        "data=mnist",
        "data.val_size=100",
        "trainer.max_epochs=3",
        "~model.scheduler.T_max",
        "model.scheduler._target_=torch.optim.lr_scheduler.StepLR",
        "+model.scheduler.step_size=1",
        "+model.scheduler.gamma=1e30",
    ]
    with pytest.raises(
        UserError, match=r"the training loss became NaN or infinite at step \d+ \(epoch 1\)"
    ):
        train(compose_config("train", tmp_path, overrides))
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 0
    assert all(
        torch.isfinite(w).all() for w in last["state_dict"].values() if w.is_floating_point()
    )


@pytest.fixture
def mlp_checkpoint(tmp_path, idx_data_dir):
    overrides = ["data=mnist", "data.val_size=100", "trainer.max_epochs=1", "logger=none"]
    train(compose_config("train", tmp_path, overrides))
    return tmp_path / "run" / "checkpoints" / "last.ckpt"


def test_checkpoint_of_another_architecture_names_the_shapes(tmp_path, mlp_checkpoint):
    overrides = ["data=mnist", "data.val_size=100", f"ckpt_path={mlp_checkpoint}"]
    cfg = compose_config("train", tmp_path, [*overrides, "model.net.hidden_sizes=[64]"])
    with pytest.raises(UserError, match=r"holds another architecture") as error:
        train(cfg)
    assert "net.layers.1.weight: checkpoint [512, 784], model [64, 784]" in str(error.value)
    # all differences are counted (the checkpoint's second hidden layer too), the first shown
    assert int(re.search(r"\((\d+) difference", str(error.value)).group(1)) > 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"epoch,loss\n0,1.5\n", "is not a checkpoint (not a file torch.save wrote)"),
        (b"PK\x03\x04cut off", "is not a readable checkpoint"),  # a zip cut off mid-write
        (None, "is a torch file but not a Lightning checkpoint"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path, idx_data_dir, content, message):
    path = tmp_path / "metrics.ckpt"
    if content is None:
        torch.save({"weights": torch.zeros(3)}, path)
    else:
        path.write_bytes(content)
    cfg = compose_config("eval", tmp_path, ["data=mnist", f"ckpt_path={path}"])
    with pytest.raises(UserError, match=re.escape(f"ckpt_path={path} {message}")):
        evaluate(cfg)


class Refuses:
    def __init__(self) -> None:
        raise UserError("refused")


def test_a_constructors_user_error_comes_out_of_instantiate_as_itself():
    from hydra.errors import InstantiationException

    from litforge.pipeline import instantiate

    with pytest.raises(UserError, match="refused"):
        instantiate({"_target_": f"{__name__}.Refuses"})
    with pytest.raises(InstantiationException):  # any other error: Hydra's, as Hydra raises it
        instantiate({"_target_": "builtins.int", "_args_": [[1, 2]]})


def test_the_error_line_is_written_whole(monkeypatch):
    # Several processes of a job share the console; written unbuffered (PYTHONUNBUFFERED=1),
    # a line whose newline goes out apart can get another process's line in between.
    from litforge import errors

    class Console:  # records each write as the unbuffered stream would send it
        writes: list[str] = []

        def write(self, text: str) -> None:
            self.writes.append(text)

        def flush(self) -> None:
            pass

    @errors.reported
    def main(cfg):
        raise UserError("data.root is missing")

    monkeypatch.setattr("sys.stderr", Console())
    with pytest.raises(SystemExit) as exit:
        main({})
    assert exit.value.code == 1
    assert Console.writes == ["error: data.root is missing\n"]


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_importing_an_entry_point_changes_nothing_in_the_process(monkeypatch, script):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "")  # (put back after the test, whatever the import did)
    monkeypatch.delenv("HYDRA_FULL_ERROR")
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    environ, hook = dict(os.environ), sys.excepthook
    runpy.run_path(str(ROOT / script), run_name="imported")  # its module's code, not main()
    assert dict(os.environ) == environ
    assert sys.excepthook is hook


def test_the_resolvers_come_from_the_entry_points_not_from_importing_the_package():
    registered = (
        "import sys, runpy, litforge, litforge.errors, litforge.runs; "
        "from omegaconf import OmegaConf; "
        "print(OmegaConf.has_resolver('job_id'), OmegaConf.has_resolver('cwd')); "
        "runpy.run_path(sys.argv[1], run_name='imported'); "
        "print(OmegaConf.has_resolver('job_id'), OmegaConf.has_resolver('cwd'))"
    )
    result = run_script("-c", registered, str(ROOT / "train.py"), timeout=60)
    assert result.stdout.split() == ["False", "False", "True", "True"], result.stderr


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ("text.ckpt", "is not a checkpoint (not a file torch.save wrote). Point it at"),
        (
            "run",
            "is a folder of checkpoints: give one, e.g. ckpt_path={run}/checkpoints/"
            "last.ckpt (the latest) or ckpt_path={run}/checkpoints/epoch_002.ckpt (the best)",
        ),
        (
            "run/checkpoints",
            "is a folder of checkpoints: give one, e.g. ckpt_path={run}/checkpoints/last.ckpt",
        ),
        ("empty", "is a folder, but neither a checkpoint nor a run folder with checkpoints"),
    ],
)
def test_what_is_no_checkpoint_file_says_which_file_to_give(tmp_path, given, line):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("last.ckpt", "epoch_002.ckpt"):
        torch.save({"state_dict": {}}, run / "checkpoints" / name)
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.ckpt").write_text("not a checkpoint\n")
    # (train.py given a run folder resumes its checkpoints/last.ckpt)
    for script in ("eval.py",) if given == "run" else ("eval.py", "train.py"):
        result = run_in_process(
            script, f"ckpt_path={tmp_path / given}", f"hydra.run.dir={tmp_path / 'out'}"
        )
        assert result.returncode == 1
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: ckpt_path={tmp_path / given} "), last
        assert line.format(run=run) in last, last
        assert "torch.save(_use_new_zipfile" not in last and "Traceback" not in result.stderr


def test_a_single_number_as_crop_scale_is_one_line(tmp_path):
    from helpers import write_image_folder

    root = write_image_folder(tmp_path / "photos", {"train": {"a": 2, "b": 2}})
    args = ["data=image_folder", f"data.root={root}", "data.image_size=20", "data.crop_scale=0.5"]
    result = run_in_process("train.py", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.crop_scale=0.5: must be a list of 2 values, or null."
    )


def test_a_missing_file_names_the_checkpoints_beside_it(tmp_path):
    from litforge.checkpoints import read

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04")
    with pytest.raises(UserError, match=r"no such file. \S+ holds: last.ckpt."):
        read(tmp_path / "checkpoints" / "best.ckpt")


def test_a_checkpoint_naming_a_network_by_a_plain_value_is_told_so():
    from litforge.checkpoints import build_module
    from litforge.models import ClassificationModule

    settings = {"net": "resnet18", "input_shape": [1, 8, 8], "num_classes": 2, "optimizer": {}}
    with pytest.raises(UserError, match="x.ckpt: its settings build no module"):
        build_module({"hyper_parameters": settings}, ClassificationModule, "x.ckpt")


def test_a_data_folder_left_unset_is_one_line(tmp_path):
    result = run_in_process("train.py", "data=image_folder", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.root is not set: give the folder of your images: <folder>/<class>/<image>, "
        "or <folder>/train/<class>/<image>."
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # (a subprocess: DDP's processes would start from it)
def test_fewer_validation_images_than_processes_is_one_line(tmp_path):
    from helpers import write_image_folder

    root = write_image_folder(tmp_path / "photos", {".": {"a": 12, "b": 12}})  # 2 for val
    args = ["data=image_folder", f"data.root={root}", "data.image_size=20", "model=cnn"]
    args += ["strategy=ddp"]
    args += ["trainer.devices=4", "trainer.accelerator=cpu", "data.num_workers=0"]
    result = run_script("train.py", *args, f"hydra.run.dir={tmp_path / 'run'}", timeout=240)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: 2 validation images for 4 processes (trainer.devices × trainer.num_nodes): each "
        "process needs one or more. Add validation images (data.val_fraction, or a val/ "
        "folder), or use fewer processes."
    ]


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path, script):
    # Under a file; read-only mounts, immutable folders and unwritable ones take the same path
    # (as root, the tests cannot make a folder unwritable).
    (tmp_path / "afile").write_text("")
    folder = tmp_path / "afile" / "run"
    result = run_in_process(script, f"hydra.run.dir={folder}")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: cannot write the run folder {folder} (Not a directory): set "
        f"hydra.run.dir=<a folder you can write>."
    ]


def test_a_failed_run_points_at_no_folder_it_deletes(tmp_path):
    (tmp_path / "photos").mkdir()  # no images: refused after the config is printed
    args = ["data=image_folder", f"data.root={tmp_path / 'photos'}"]
    result = run_in_process("train.py", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: data.root=")
    assert "Overrides: data=image_folder" in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()
    assert str(tmp_path / "run") not in result.stdout + result.stderr
