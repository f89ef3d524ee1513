"""`python train.py`: fit, test the best checkpoint, write the run dir (in-process and as a CLI)."""

import json

import lightning as L
import pytest
import torch
from helpers import ROOT, compose_config, run_in_process, run_script

from litforge.errors import UserError
from litforge.pipeline import optimized_metric, start, train

FAST = ["data=mnist", "data.val_size=100", "data.batch_size=64", "trainer.max_epochs=2"]


@pytest.fixture
def trained_run(tmp_path, idx_data_dir):
    cfg = compose_config("train", tmp_path, FAST)
    metrics = train(cfg)
    return cfg, metrics, tmp_path / "run"


def test_run_dir_holds_checkpoints_logs_and_metrics(trained_run):
    cfg, metrics, run_dir = trained_run
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written == pytest.approx(metrics)
    for key in ("test/acc", "test/loss", "test/f1", "val/acc", "val/acc_best", "train/loss"):
        assert key in written
    assert written["test/acc"] > 0.9, "the synthetic classes are easy to learn"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run_dir / "checkpoints").glob("epoch_*.ckpt"))) == 1  # the best
    assert (run_dir / "csv" / "metrics.csv").is_file()
    assert optimized_metric(cfg, metrics) == metrics["val/acc_best"]


def test_checkpoints_load_with_weights_only(trained_run):
    _, _, run_dir = trained_run
    for path in (run_dir / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        assert checkpoint["hyper_parameters"]["net"]["_target_"] == "litforge.models.mlp.MLP"
        assert checkpoint["datamodule_hyper_parameters"]["name"] == "mnist"


def test_logged_hyperparameters_are_the_resolved_run_config(trained_run):
    _, _, run_dir = trained_run
    hparams = (run_dir / "csv" / "hparams.yaml").read_text()
    assert "max_epochs: 2" in hparams and "MNISTDataModule" in hparams
    assert "${" not in hparams


@pytest.mark.parametrize("value", [0, 7])
def test_any_seed_seeds_including_zero(tmp_path, value):
    cfg = compose_config("train", tmp_path, [f"seed={value}"])
    start(cfg)
    assert torch.initial_seed() == value


def test_unknown_optimized_metric_is_a_clear_error(tmp_path):
    cfg = compose_config("train", tmp_path, ["optimized_metric=val/nope"])
    with pytest.raises(Exception, match="optimized_metric=val/nope was not logged"):
        optimized_metric(cfg, {"val/acc": 0.5})


@pytest.mark.slow
def test_cli_run_then_eval_reproduces_the_test_metric(tmp_path, idx_data_dir):
    run_dir = tmp_path / "run"
    result = run_in_process(
        "train.py",
        *FAST[:-1],
        "trainer.max_epochs=1",
        f"paths.data_dir={idx_data_dir}",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "config_tree.log").is_file()
    assert "Final metrics" in result.stdout and str(run_dir) in result.stdout
    trained = json.loads((run_dir / "metrics.json").read_text())

    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    eval_dir = tmp_path / "eval"
    result = run_in_process(
        "eval.py",
        f"ckpt_path={best}",
        # train.py's overrides, pasted: the settings come from the checkpoint, the class from model=
        *FAST[:-1],
        "model=mlp",
        "trainer.max_epochs=1",
        f"paths.data_dir={idx_data_dir}",
        f"hydra.run.dir={eval_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads((eval_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == trained["test/acc"]
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-6)


def test_train_false_tests_the_given_checkpoint(trained_run, tmp_path):
    cfg, trained, run_dir = trained_run
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    cfg = compose_config(
        "train",
        tmp_path / "t",
        [
            *FAST,
            "train=false",
            f"ckpt_path={best}",
            "logger=none",
            f"paths.data_dir={cfg.data.root}",
        ],
    )
    tested = train(cfg)
    assert tested["test/acc"] == trained["test/acc"]  # its weights, not untrained ones
    assert json.loads((tmp_path / "t" / "run" / "metrics.json").read_text()) == tested
    assert optimized_metric(cfg, tested) is None  # nothing trained: nothing to optimize


def test_train_false_without_a_checkpoint_says_what_to_add(tmp_path):
    cfg = compose_config("train", tmp_path, ["train=false"])
    with pytest.raises(UserError, match="no checkpoint given: add ckpt_path="):
        train(cfg)


@pytest.mark.slow
def test_sweep_from_another_directory_uses_it_as_the_project_root(tmp_path, idx_data_dir):
    # Defaults only: data in <cwd>/data, runs in <cwd>/logs (multirun resolves its folder before
    # Hydra's runtime config exists, so the root must not depend on it).
    assert idx_data_dir == tmp_path / "data"
    result = run_script(
        str(ROOT / "train.py"),
        "-m",
        "debug=fdr",
        "data=mnist",
        "data.val_size=100",
        "model.optimizer.lr=0.001",  # a sweep of one job: where it goes is the point
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    summary = ["plots"] if (ROOT / "conf" / "sweeps").is_dir() else []  # the sweeps feature's
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", *summary]
    assert "test/acc" in json.loads((sweep / "0" / "metrics.json").read_text())


def test_a_forks_own_training_step_trains_evaluates_and_resumes(tmp_path, idx_data_dir, caplog):
    """A step that returns a dict with its logits and logs its own metric runs with the
    default callbacks; eval.py and a resumed run take the same module."""
    from litforge.pipeline import evaluate

    module = "model._target_=helpers.DictStepModule"
    data = ["data=mnist", "data.val_size=100", f"paths.data_dir={idx_data_dir}"]
    first = train(compose_config("train", tmp_path / "a", [*data, module, "trainer.max_epochs=1"]))
    assert "train/top2" in first and first["test/acc"] > 0.5
    last = tmp_path / "a" / "run" / "checkpoints" / "last.ckpt"

    resumed = [*data, module, "trainer.max_epochs=2", f"ckpt_path={last}"]
    metrics = train(compose_config("train", tmp_path / "b", resumed))
    assert torch.load(tmp_path / "b" / "run" / "checkpoints" / "last.ckpt")["epoch"] == 1
    assert "train/top2" in metrics

    evaluated = evaluate(
        compose_config("eval", tmp_path / "e", [*data, f"ckpt_path={last}", f"+{module}"])
    )
    assert evaluated["test/acc"] == first["test/acc"]


def test_a_checkpoint_loads_as_the_class_that_wrote_it_where_that_is_trusted(tmp_path):
    """The class a checkpoint names (`module_class`) is built when this project defines it;
    one defined elsewhere (here tests/helpers.py) only when `model=` names it."""
    from helpers import DictStepModule

    from litforge import models
    from litforge.checkpoints import load_module

    settings = {
        "net": {"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [8]},
        "input_shape": (1, 28, 28),
        "num_classes": 10,
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1},
    }
    module = DictStepModule(**settings)
    path = tmp_path / "fork.ckpt"
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint["pytorch-lightning_version"] = L.__version__  # what Lightning's loading reads
    ours = "litforge.models.classifier.ClassificationModule"
    torch.save({**checkpoint, "module_class": ours}, path)
    assert type(load_module(path)) is models.ClassificationModule
    torch.save({**checkpoint, "module_class": "helpers.DictStepModule"}, path)
    with pytest.raises(UserError, match="module_class._target_='helpers.DictStepModule' is not"):
        load_module(path)
    assert type(load_module(path, "helpers.DictStepModule")) is DictStepModule


def test_an_optimizer_from_outside_torch_optim_trains(tmp_path, idx_data_dir, caplog):
    """The user's config is trusted: any optimizer class trains (here one of tests/helpers.py;
    a fork's own package's also evaluates and resumes: tests/test_checkpoints.py)."""
    overrides = [*FAST, "trainer.max_epochs=1", "model.optimizer._target_=helpers.SignSGD"]
    overrides += ["~model.optimizer.weight_decay", "model.optimizer.lr=0.01"]
    metrics = train(compose_config("train", tmp_path, overrides))
    assert metrics["test/acc"] > 0.5
