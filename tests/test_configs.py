"""Every option of every config group composes, resolves (Hydra's own node too), and builds what
it says; the trainer gets exactly what the config lists."""

import pytest
from helpers import CONF, assert_option_builds, compose_config, feature_paths, write_image_folder
from hydra.utils import get_class

from litforge.pipeline import build_datamodule, build_model, build_trainer

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "local"))
# A feature folder's options are tested with it (tests/<feature>/).
OPTIONS = [
    (g, p.stem)
    for g in GROUPS
    for p in sorted((CONF / g).glob("*.yaml"))
    if not any(str(p.relative_to(CONF.parent)).startswith(f) for f in feature_paths())
]


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
    }


def targets(group) -> set[type]:
    return {get_class(entry._target_) for entry in (group or {}).values() if entry}


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_resolves_and_builds(tmp_path, monkeypatch, group, option):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [f"{group}={option}"] + (["trainer.accelerator=cpu"] if group == "strategy" else [])
    if (group, option) == ("data", "image_folder"):
        folder = write_image_folder(tmp_path / "images", {"train": {"cat": 4, "dog": 4}})
        overrides += [f"data.root={folder}", "data.num_workers=0"]
    assert_option_builds(tmp_path, overrides)


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
