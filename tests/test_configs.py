"""Every option of every config group composes, resolves (Hydra's own node too), and builds what
it says; the trainer gets exactly what the config lists."""

import pytest
import torch
from helpers import CONF, compose_config, write_image_folder
from hydra.utils import get_class
from omegaconf import OmegaConf, open_dict

from hydra_plugins.litforge.optuna_sweeper import OptunaSweeper, _has_key
from litforge.callbacks import LearningRateMonitor
from litforge.checkpoints import AtomicCheckpointIO
from litforge.errors import UserError
from litforge.pipeline import build_datamodule, build_model, build_trainer, start
from litforge.streaming.datamodule import optimize_folder

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


def targets(group) -> set[type]:
    return {get_class(entry._target_) for entry in (group or {}).values() if entry}


@pytest.fixture(scope="module")
def own_data(tmp_path_factory) -> dict[str, list[str]]:
    """What data=image_folder and data=streaming need: a folder of images, and its shards."""
    tmp = tmp_path_factory.mktemp("own_data")
    folder = write_image_folder(tmp / "images", {"train": {"cat": 4, "dog": 4}})
    optimize_folder(str(folder), str(tmp / "shards"), 0, 0, num_workers=1)
    return {
        "image_folder": [f"data.root={folder}", "data.num_workers=0"],
        "streaming": [f"data.input_dir={tmp / 'shards'}", "data.num_workers=0"],
    }


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_resolves_and_builds(tmp_path, monkeypatch, own_data, group, option):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [f"{group}={option}"] + (["trainer.accelerator=cpu"] if group == "strategy" else [])
    if group == "data":
        overrides += own_data.get(option, [])
    if (group, option) == ("strategy", "parameter_server"):
        overrides += ["trainer.devices=3"]  # a server and 2 workers: 1 process is refused
    cfg = compose_config("train", tmp_path, overrides, keep_hydra=True)
    # Every interpolation has a value, Hydra's run and sweep folders and sweeper included.
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    # ??? is left only where the pipeline or Hydra fills it in
    assert OmegaConf.missing_keys(resolved) <= {
        "callbacks.log_run_config.run_config",
        "hydra.job.id",
        "hydra.hydra_help.hydra_help",
    }
    assert resolved.hydra.run.dir.startswith(str(tmp_path))
    sweeper = resolved.hydra.sweeper
    if sweeper._target_.endswith("OptunaSweeper"):  # its space parses into Optuna distributions
        arguments = {k: v for k, v in sweeper.items() if not k.startswith("_")}
        _, space = OptunaSweeper(**arguments)._search_space([])
        assert space and set(space) == set(sweeper.params)
        assert all(_has_key(cfg, key) for key in space)  # a space the model it composes has
        assert sweeper.study_name is None  # the sweeper names it after the setup
    with open_dict(cfg):
        del cfg["hydra"]

    try:
        start(cfg)
    except UserError as err:  # GPU-only options (fsdp, trainer=gpu), refused on a CPU machine
        assert not torch.cuda.is_available() and "GPU" in str(err)
        return
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    trainer = build_trainer(cfg)
    assert type(datamodule) is get_class(cfg.data._target_)
    assert type(model.net) is get_class(cfg.model.net._target_)
    expected = targets(cfg.get("callbacks"))
    if not trainer.loggers:  # Lightning's monitor needs one (see pipeline.build_trainer)
        expected.discard(LearningRateMonitor)
    assert expected <= {type(cb) for cb in trainer.callbacks}
    if not cfg.trainer.fast_dev_run:  # which replaces the loggers by a dummy
        assert {type(lg) for lg in trainer.loggers} == targets(cfg.get("logger"))
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO


@pytest.mark.parametrize("config", ["train", "eval"])
def test_defaults_build_a_trainer(tmp_path, config):
    cfg = compose_config(config, tmp_path)
    trainer = build_trainer(cfg)
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert [type(lg).__name__ for lg in trainer.loggers] == ["CSVLogger"]


def test_the_trainer_gets_what_the_config_lists_and_nothing_else(tmp_path):
    cfg = compose_config("train", tmp_path, ["callbacks=[early_stopping]", "logger=none"])
    trainer = build_trainer(cfg)
    ours = [cb for cb in trainer.callbacks if type(cb).__module__.split(".")[0] != "lightning"]
    assert ours == []  # no callback of ours appended out of sight
    assert [type(cb).__name__ for cb in trainer.callbacks if "Early" in type(cb).__name__] == [
        "EarlyStopping"
    ]


@pytest.mark.parametrize(("metric", "mode"), [("val/loss", "min"), ("val/acc_best", "max")])
def test_one_monitored_metric_drives_checkpoints_and_early_stopping(tmp_path, metric, mode):
    overrides = [
        "callbacks=[default,early_stopping]",
        f"optimized_metric={metric}",
        f"optimized_metric_mode={mode}",
    ]
    trainer = build_trainer(compose_config("train", tmp_path, overrides))
    best = [cb for cb in trainer.checkpoint_callbacks if cb.monitor]
    assert [(cb.monitor, cb.mode) for cb in best] == [(metric, mode)]
    [early] = [cb for cb in trainer.callbacks if type(cb).__name__ == "EarlyStopping"]
    assert (early.monitor, early.mode) == (metric, mode)


def test_model_takes_its_arguments_from_the_datamodule(tmp_path):
    cfg = compose_config("train", tmp_path, ["data=cifar10", "model=cnn"])
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    assert model.hparams.input_shape == [3, 32, 32] and model.hparams.num_classes == 10
    assert model.hparams.class_names[0] == "airplane"


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
