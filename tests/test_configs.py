"""Every option of every config group composes, and what it builds is what it says."""

import importlib.util

import pytest
from helpers import CONF, compose_config
from hydra.utils import instantiate
from omegaconf import OmegaConf

from litforge.pipeline import build_datamodule, build_model, build_trainer

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "local"))
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def test_groups_are_the_documented_ones():
    assert set(GROUPS) >= {
        "data",
        "model",
        "strategy",
        "trainer",
        "callbacks",
        "logger",
        "paths",
        "extras",
        "debug",
        "experiment",
        "hparams_search",
    }


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_resolves(tmp_path, group, option):
    cfg = compose_config("train", tmp_path, [f"{group}={option}"])
    OmegaConf.resolve(cfg)  # every interpolation has a value
    assert cfg.task_name


@pytest.mark.parametrize("config", ["train", "eval"])
def test_defaults_build_a_trainer(tmp_path, config):
    cfg = compose_config(config, tmp_path)
    trainer = build_trainer(cfg)
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert [type(lg).__name__ for lg in trainer.loggers] == ["CSVLogger"]


@pytest.mark.parametrize("data", ["mnist", "fashion_mnist"])
def test_model_takes_its_input_from_the_datamodule(tmp_path, data):
    cfg = compose_config("train", tmp_path, [f"data={data}"])
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    assert model.hparams.input_shape == [1, 28, 28] and model.hparams.num_classes == 10
    assert len(model.hparams.class_names) == 10


def test_several_loggers_at_once(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = compose_config("train", tmp_path, ["logger=[csv,tensorboard]"])
    trainer = build_trainer(cfg)
    assert [type(lg).__name__ for lg in trainer.loggers] == ["CSVLogger", "TensorBoardLogger"]


def test_wandb_logger_config_builds(tmp_path, monkeypatch):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb not installed (pip install -e '.[loggers]')")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = compose_config("train", tmp_path, ["logger=wandb"])
    assert type(instantiate(cfg.logger.wandb)).__name__ == "WandbLogger"


def test_callbacks_default_and_opt_in(tmp_path):
    default = compose_config("train", tmp_path)
    assert set(default.callbacks) == {
        "model_checkpoint",
        "last_checkpoint",
        "resume_state",
        "stop_on_nonfinite_loss",
        "plots",
        "log_run_config",
        "lr_monitor",
        "rich_progress_bar",
    }
    with_es = compose_config("train", tmp_path, ["callbacks=[default,early_stopping]"])
    assert "early_stopping" in with_es.callbacks
    trainer = build_trainer(compose_config("train", tmp_path, ["callbacks.lr_monitor=null"]))
    names = {type(cb).__name__ for cb in trainer.callbacks}
    assert "LearningRateMonitor" not in names and "ModelCheckpoint" in names


def test_experiment_overlay_wins_over_defaults(tmp_path):
    cfg = compose_config("train", tmp_path, ["experiment=fashion_mnist_mlp"])
    assert cfg.trainer.max_epochs == 20 and cfg.model.scheduler.T_max == 20
    assert list(cfg.model.net.hidden_sizes) == [1024, 512, 256]


def test_debug_overlay_uses_its_own_log_folder(tmp_path):
    cfg = compose_config("train", tmp_path, ["debug=fdr"])
    assert cfg.trainer.fast_dev_run is True and cfg.task_name == "debug"


def test_no_logger_runs_without_the_learning_rate_monitor(tmp_path):
    trainer = build_trainer(compose_config("train", tmp_path, ["logger=none"]))
    assert trainer.loggers == []
    assert not any(type(cb).__name__ == "LearningRateMonitor" for cb in trainer.callbacks)
