"""`python train.py`: fit, test the best checkpoint, write the run dir (in-process and as a CLI)."""

import functools
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
            f"paths.data_dir={cfg.data.root_dir}",
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
    assert "is not in litforge.models.MODULES: eval.py builds its checkpoints" in caplog.text
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


def test_a_checkpoint_loads_as_the_registered_class_that_wrote_it(tmp_path, monkeypatch, caplog):
    from helpers import DictStepModule

    from litforge import models
    from litforge.checkpoints import load_module

    module = DictStepModule(
        net={"_target_": "litforge.models.mlp.MLP", "hidden_sizes": [8]},
        input_shape=(1, 28, 28),
        num_classes=10,
        optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1},
    )
    path = tmp_path / "fork.ckpt"
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    checkpoint["pytorch-lightning_version"] = L.__version__  # what Lightning's loading reads
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    trained_as = f"helpers.{DictStepModule.__qualname__}"  # (a class made in a function)
    assert checkpoint["module_class"] == trained_as

    # Not registered: loaded as the one class that is, saying so.
    assert type(load_module(checkpoint, str(path))) is models.ClassificationModule
    assert f"written by the LightningModule {trained_as!r}: loading it as" in caplog.text
    # Registered beside it: that class, without model=.
    monkeypatch.setattr(models, "MODULES", (models.ClassificationModule, DictStepModule))
    assert type(load_module(checkpoint, str(path))) is DictStepModule
    caplog.clear()  # model= naming another class wins, said
    other = load_module(checkpoint, str(path), "litforge.models.ClassificationModule")
    assert type(other) is models.ClassificationModule
    assert "loading it as litforge.models.classifier.ClassificationModule." in caplog.text


def test_a_module_saving_objects_as_settings_is_told_why_its_checkpoints_will_not_load(caplog):
    """A module ported from lightning-hydra-template saves its built network and optimizer as
    hyper-parameters: the run says, at its start, that checkpoints hold configs, not objects."""
    from types import SimpleNamespace

    from litforge.pipeline import warn_unless_loadable

    settings = {"net": torch.nn.Linear(4, 2), "optimizer": functools.partial(torch.optim.SGD)}
    warn_unless_loadable(SimpleNamespace(hparams=settings), SimpleNamespace(hparams={}))
    assert (
        "This run: model.net is a Linear object, not a config: the module takes net as a config "
        "(its _target_ and values) and builds it" in caplog.text
    )


def test_the_run_start_names_every_setting_to_register_at_once(caplog):
    """A nested network config and an optimizer of a fork's own: both said in one warning."""
    from types import SimpleNamespace

    from litforge.pipeline import warn_unless_loadable

    net = {"_target_": "litforge.models.mlp.MLP", "block": {"_target_": "mypkg.Block"}}
    optimizer = {"_target_": "mypkg.Lion", "_partial_": True, "lr": 0.1}
    model = SimpleNamespace(hparams={"net": net, "optimizer": optimizer})
    warn_unless_loadable(model, SimpleNamespace(hparams={}))
    [warning] = [r.message for r in caplog.records if "Until then" in r.message]
    assert warning.splitlines() == [
        "This run: model.net.block has a _target_ of its own (mypkg.Block), which "
        "litforge.models.NETWORKS does not list (src/litforge/models/__init__.py); if it is "
        "yours, add it there.",
        "This run: model.optimizer._target_=mypkg.Lion is not allowed: a checkpoint builds only "
        "what litforge.models.OPTIMIZERS lists (src/litforge/models/__init__.py); if it is "
        "yours, add it there.",
        "Until then its checkpoints load neither in eval.py nor to resume.",
    ]


def test_an_optimizer_from_outside_torch_optim_trains(tmp_path, idx_data_dir, caplog):
    """The user's config is trusted: any optimizer class trains (here a fork's own). Its
    checkpoints load once it is registered, which the run says at its start."""
    overrides = [*FAST, "trainer.max_epochs=1", "model.optimizer._target_=helpers.SignSGD"]
    overrides += ["~model.optimizer.weight_decay", "model.optimizer.lr=0.01"]
    metrics = train(compose_config("train", tmp_path, overrides))
    assert metrics["test/acc"] > 0.5
    assert (
        "This run: model.optimizer._target_=helpers.SignSGD is not allowed: a checkpoint builds "
        "only what litforge.models.OPTIMIZERS lists" in caplog.text
    )
    assert "Until then its checkpoints load neither in eval.py nor to resume." in caplog.text
    caplog.clear()  # torch.optim's own: nothing to say
    more = ["trainer.max_epochs=1", f"paths.data_dir={idx_data_dir}"]
    train(compose_config("train", tmp_path / "adamw", [*FAST, *more]))
    assert "Until then" not in caplog.text
