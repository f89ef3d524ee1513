"""`hparams_search=optuna`: our Optuna sweeper plugin (hydra_plugins/litforge/optuna_sweeper.py)
searches, stores the study in SQLite, resumes it, records failed and pruned trials."""

import ast
import csv
import json
import re
import subprocess
import sys

import optuna
import pytest
import torch
import yaml
from helpers import (
    ROOT,
    assert_option_builds,
    compose_config,
    run_in_process,
    run_script,
    tiny_run_args,
)
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.litforge.optuna_sweeper import (
    PRUNING,
    OptunaSweeper,
    _distribution,
    _has_key,
    _override_text,
    setup_hash,
    setup_of,
)


def distribution(line: str):
    return _distribution(OverridesParser.create().parse_override(line))


def test_search_space_syntax_maps_to_optuna_distributions():
    assert distribution("lr=interval(0.001, 0.1)") == FloatDistribution(0.001, 0.1)
    assert distribution("lr=tag(log, interval(1e-4, 1e-2))") == FloatDistribution(
        1e-4, 1e-2, log=True
    )
    assert distribution("epochs=int(interval(2, 8))") == IntDistribution(2, 8)
    # Hydra's range excludes its end: 64..512 in steps of 64
    assert distribution("batch=range(64, 513, 64)") == IntDistribution(64, 512, step=64)
    assert distribution("model=choice(mlp, cnn)") == CategoricalDistribution(["mlp", "cnn"])
    # Optuna stores plain values only: lists go in as their override text
    assert distribution("sizes=choice([256], [512, 256])") == CategoricalDistribution(
        ["[256]", "[512,256]"]
    )


def study_names(sweep_dir) -> list[str]:
    return sorted(optuna.get_all_study_names(f"sqlite:///{sweep_dir / 'optuna.db'}"))


def open_study(sweep_dir, name=None):
    """The study named `name` in the sweep folder's SQLite file (None: its only study)."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def search_args(data_dir, sweep_dir, *extra) -> list[str]:
    """`python train.py -m hparams_search=optuna` on the small MNIST files, seconds a trial
    (`sweep_dir` None: the default folder, logs/train/searches/<study name>/ under data_dir)."""
    return [
        "-m",
        "hparams_search=optuna",
        *tiny_run_args(data_dir, None),
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "logger=none",
        f"paths.log_dir={data_dir / 'logs'}",
        *([f"hydra.sweep.dir={sweep_dir}"] if sweep_dir is not None else []),
        *extra,
    ]


def search(data_dir, sweep_dir, *extra):
    return run_script("train.py", *search_args(data_dir, sweep_dir, *extra), timeout=600)


def search_in_process(data_dir, sweep_dir, *extra):
    """As `search`, with the sweeper in this process (its trials are still processes)."""
    return run_in_process("train.py", *search_args(data_dir, sweep_dir, *extra))


def summary_rows(sweep_dir) -> list[dict[str, str]]:
    with (sweep_dir / "summary.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_search_runs_trials_and_resumes_the_same_study(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    first = search(idx_data_dir, sweep_dir, "hydra.sweeper.n_trials=1")
    assert first.returncode == 0, first.stderr[-3000:]
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
    first_params = [t.params for t in study.trials]

    # The same command with a larger n_trials: the stored trial stays, one more runs.
    again = search(idx_data_dir, sweep_dir, "hydra.sweeper.n_trials=2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 finished trial(s), 1 to run" in again.stdout + again.stderr
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert [t.params for t in study.trials[:1]] == first_params
    assert study.trials[1].params != first_params[0]  # a new point of the space
    assert {p.name for p in sweep_dir.iterdir()} >= {"0", "1", "optuna.db", "summary.md"}

    rows = summary_rows(sweep_dir)
    assert sorted(row["job"] for row in rows) == ["0", "1"]  # all, not just the last run
    assert [float(row["val/acc_best"]) for row in rows] == pytest.approx(
        sorted((t.value for t in study.trials), reverse=True), abs=1e-4
    )
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["best_trial"] == study.best_trial.number
    assert best["best_params"] == study.best_params
    assert "model.optimizer.lr=" in " ".join(best["overrides"])


@pytest.mark.slow
def test_a_cross_validated_trial_is_the_mean_of_its_folds(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    done = search(idx_data_dir, sweep_dir, "hydra.sweeper.n_trials=1", "data.num_folds=2")
    assert done.returncode == 0, done.stderr[-3000:]
    folds = [json.loads((sweep_dir / job / "metrics.json").read_text()) for job in ("0", "1")]
    (trial,) = open_study(sweep_dir).trials
    assert trial.value == pytest.approx((folds[0]["val/acc_best"] + folds[1]["val/acc_best"]) / 2)
    (row,) = summary_rows(sweep_dir)
    mean_test = (folds[0]["test/acc"] + folds[1]["test/acc"]) / 2
    assert float(row["test/acc"]) == pytest.approx(mean_test, abs=1e-4)
    configs = [yaml.safe_load((sweep_dir / j / ".hydra" / "config.yaml").read_text()) for j in "01"]
    assert [c["data"]["fold"] for c in configs] == [0, 1]


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_search_goes_on(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    result = search(
        idx_data_dir,
        sweep_dir,
        "hydra.sweeper.n_trials=2",
        "data.val_size=choice(100000)",  # more than the training set: every trial fails
    )
    assert result.returncode == 1
    assert re.search(r"no trial of Optuna study 'mnist_mlp-[0-9a-f]{8}' completed", result.stderr)
    study = open_study(sweep_dir)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2  # both ran
    rows = summary_rows(sweep_dir)
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert all("val_size" in row["error"] for row in rows)


@pytest.mark.slow
def test_pruner_stops_a_trial_early(tmp_path, idx_data_dir):
    sweep_dir = tmp_path / "search"
    result = search(
        idx_data_dir,
        sweep_dir,
        "hydra.sweeper.n_trials=1",
        "trainer.max_epochs=3",
        # prunes any trial whose val/acc_best is below 1.1: all of them, after epoch 0
        "hydra.sweeper.pruner={_target_:optuna.pruners.ThresholdPruner,lower:1.1}",
    )
    assert result.returncode == 1  # no trial completed
    assert "Optuna pruned trial 0 after epoch 0." in result.stdout
    [trial] = open_study(sweep_dir).trials
    assert trial.state == TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]
    last = torch.load(sweep_dir / "0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 0  # training stopped after the first of 3 epochs
    # The job learnt its trial from an override (no environment variable), which its folder keeps.
    overrides = yaml.safe_load((sweep_dir / "0" / ".hydra" / "overrides.yaml").read_text())
    [told] = [o for o in overrides if o.startswith(f"{PRUNING}.trial=")]
    assert f"trial_id:{trial._trial_id}," in told and "optuna.pruners.ThresholdPruner" in told
    assert told not in " ".join(trial.user_attrs["overrides"])  # not part of what reproduces it


def test_a_trial_reaches_its_job_as_an_override_the_pruning_callback_takes(tmp_path):
    # A storage path Hydra's grammar could not take unquoted: spaces, quotes, '=', a backslash.
    db = tmp_path / "a b's=c\\" / "optuna.db"
    db.parent.mkdir()
    storage = f"sqlite:///{db}"
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    pruner = {"_target_": "optuna.pruners.ThresholdPruner", "lower": 0.5, "upper": None}
    sweeper = OptunaSweeper("s", 1, storage, None, None, OmegaConf.create(pruner), {})
    override = sweeper._trial_override(storage, trial._trial_id)

    # Hydra parses it back to what the sweeper meant.
    parsed = OverridesParser.create().parse_override(override)
    assert parsed.value() == {
        "study_name": "s",
        "storage": storage,
        "trial_id": trial._trial_id,
        "pruner": pruner,
    }
    # In a job's config, the callback of hparams_search=optuna reports to that trial.
    cfg = compose_config("train", tmp_path, ["hparams_search=optuna", override])
    callback = instantiate(cfg.callbacks.optuna_pruning)
    assert callback.trial.number == trial.number
    assert isinstance(callback.trial.study.pruner, optuna.pruners.ThresholdPruner)
    # Outside a search with a pruner: nothing to report to.
    cfg = compose_config("train", tmp_path, ["hparams_search=optuna"])
    assert instantiate(cfg.callbacks.optuna_pruning).trial is None


def test_override_text_is_what_hydra_parses_back():
    parser = OverridesParser.create()
    texts = ["it's \\ a=b c", "ends with \\", "{[,]}:"]
    for value in (None, True, 3, 1e-05, float("inf"), *texts, [1, "x"], {"a": {"b": []}}):
        assert parser.parse_override(f"k={_override_text(value)}").value() == value


def test_the_optuna_feature_stays_out_of_the_core_and_of_hydras_plugin_scan():
    # Nothing in src/litforge imports Optuna or the Hydra plugins.
    for path in (ROOT / "src" / "litforge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] in ("optuna", "hydra_plugins") for n in names), path
    # Hydra imports the plugins' modules at every start: the pruning callback's stays out, and
    # Lightning with it.
    scan = "from hydra.core.plugins import Plugins; import sys; Plugins.instance(); "
    scan += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'torch')"
    scan += " or m.startswith('hydra_plugins.litforge.')))"
    result = subprocess.run(
        [sys.executable, "-c", scan], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = ast.literal_eval(result.stdout)
    assert "hydra_plugins.litforge.optuna_sweeper" in loaded  # (the scan ran)
    assert not [m for m in loaded if not m.startswith("hydra_plugins.")], loaded


def setup_id(tmp_path, *overrides: str, searched=("model.optimizer.lr",)) -> str:
    """The setup hash of `train.py hparams_search=optuna <overrides>` as the sweeper takes it."""
    cfg = compose_config("train", tmp_path, ["hparams_search=optuna", *overrides], keep_hydra=True)
    GlobalHydra.instance().clear()
    return setup_hash(setup_of(cfg, list(searched)))


def test_a_study_is_identified_by_what_is_not_searched(tmp_path):
    image_folder = ["data=image_folder", "data.root=/images/a", "data.image_size=32"]
    base = setup_id(tmp_path, *image_folder)
    # What does not change what a trial trains: the same study.
    for same in (
        ["hydra.sweeper.n_trials=50", "hydra.sweep.dir=/elsewhere", "paths.root_dir=/other"],
        [
            "logger=tensorboard",
            "tags=[a]",
            "data.num_workers=0",
            "callbacks.rich_progress_bar=null",
        ],
        ["model.optimizer.lr=0.5"],  # searched: its default is no part of the setup
    ):
        assert setup_id(tmp_path, *image_folder, *same) == base, same
    # What does: a study of its own.
    for other in (
        ["data.root=/images/b"],
        ["data.image_size=64"],
        ["trainer.max_epochs=3"],
        ["model=cnn"],
        ["seed=7"],
        ["data.seed=7"],  # (`${seed}` as the data configs write it is left out: the seed is in)
    ):
        assert setup_id(tmp_path, *image_folder, *other) != base, other
    # Searched, a key is no longer part of the setup.
    assert setup_id(tmp_path, *image_folder, "trainer.max_epochs=3", searched=[]) != setup_id(
        tmp_path, *image_folder, searched=[]
    )
    assert setup_id(
        tmp_path, *image_folder, "trainer.max_epochs=3", searched=["trainer.max_epochs"]
    ) == setup_id(tmp_path, *image_folder, searched=["trainer.max_epochs"])


@pytest.mark.slow
def test_another_setup_starts_its_own_study_and_says_so(tmp_path, idx_data_dir):
    searches = idx_data_dir / "logs" / "train" / "searches"
    first = search_in_process(idx_data_dir, None, "hydra.sweeper.n_trials=1")
    assert first.returncode == 0, first.stderr[-3000:]
    [first_dir] = searches.iterdir()
    assert re.fullmatch(r"mnist_mlp-[0-9a-f]{8}", first_dir.name)
    assert study_names(first_dir) == [first_dir.name]
    assert (first_dir / "0" / "metrics.json").is_file()  # the trial's folder is in the study's

    # A fixed override more: another study in a folder of its own, and the log says why.
    other = search_in_process(
        idx_data_dir, None, "hydra.sweeper.n_trials=0", "trainer.max_epochs=2"
    )
    output = other.stdout + other.stderr
    [second_dir] = set(searches.iterdir()) - {first_dir}
    assert second_dir.name.startswith("mnist_mlp-")
    assert f"New Optuna study '{second_dir.name}'" in output
    assert f"other study of mnist_mlp: '{first_dir.name}'" in output
    assert "1 trial(s), setup differs in trainer.max_epochs: 1 -> 2" in output
    assert len(open_study(first_dir).trials) == 1  # untouched

    # The first command again, with a larger n_trials: its own study, resumed.
    again = search_in_process(idx_data_dir, None, "hydra.sweeper.n_trials=1")
    assert again.returncode == 0, again.stderr[-3000:]
    output = again.stdout + again.stderr
    assert (
        f"Optuna study '{first_dir.name}'" in output and "1 finished trial(s), 0 to run" in output
    )
    assert "New Optuna study" not in output
    assert len(list(searches.iterdir())) == 2


def test_setups_sharing_a_storage_keep_their_trials_apart(tmp_path):
    """Image folders and sizes with one sweep folder (one SQLite file): a study each. No trial
    runs (n_trials=0), so the folders need no images."""
    sweep_dir = tmp_path / "search"

    def run(*extra):
        return run_in_process(
            "train.py",
            "-m",
            "hparams_search=optuna",
            "data=image_folder",
            "hydra.sweeper.n_trials=0",
            f"hydra.sweep.dir={sweep_dir}",
            *extra,
        )

    run("data.root=/images/a")
    [first] = study_names(sweep_dir)
    assert first.startswith("image_folder_mlp-")
    run("data.root=/images/a")  # the same command: the same study
    assert study_names(sweep_dir) == [first]
    result = run("data.root=/images/b")
    assert "setup differs in data.root: /images/a -> /images/b" in result.stdout
    result = run("data.root=/images/a", "data.image_size=64")
    assert "setup differs in data.image_size: None -> 64" in result.stdout
    assert len(study_names(sweep_dir)) == 3


def test_a_study_name_given_is_used_as_is_and_warns_of_another_setup(tmp_path):
    sweep_dir = tmp_path / "search"
    search_in_process(
        tmp_path, sweep_dir, "hydra.sweeper.n_trials=0", "hydra.sweeper.study_name=mine"
    )
    result = search_in_process(
        tmp_path,
        sweep_dir,
        "hydra.sweeper.n_trials=0",
        "hydra.sweeper.study_name=mine",
        "trainer.max_epochs=3",
    )
    assert study_names(sweep_dir) == ["mine"]
    assert "Optuna study 'mine' was started with another setup (trainer.max_epochs: 1 -> 3)" in (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize(
    "command, error",
    [
        (
            ["model=cnn"],  # hparams_search=optuna searches the MLP's keys
            "error: search space: model.net.hidden_sizes is not in the config of model=cnn (did "
            "you mean model.net.hidden_size?); hparams_search=optuna searches another model: "
            "for model=cnn use hparams_search=optuna_cnn\n",
        ),
        (
            ["hparams_search=optuna_cnn", "model=mlp"],
            "error: search space: model.net.channels is not in the config of model=mlp; "
            "hparams_search=optuna_cnn searches another model: for model=mlp use "
            "hparams_search=optuna\n",
        ),
        (
            ["model.optimizer.lrr=interval(0.001,0.01)"],  # a typo: no other search config fits
            "error: search space: model.optimizer.lrr is not in the config of model=mlp (did you "
            "mean model.optimizer.lr?); search only keys the config has, or add one with "
            "+key=...\n",
        ),
    ],
    ids=["model=cnn", "optuna_cnn with model=mlp", "a typo"],
)
def test_a_search_space_the_model_lacks_is_one_line_before_any_trial(tmp_path, command, error):
    sweep_dir = tmp_path / "search"
    result = search_in_process(tmp_path, sweep_dir, "hydra.sweeper.n_trials=1", *command)
    assert result.returncode == 1
    assert result.stderr == error
    assert not (sweep_dir / "optuna.db").exists()  # no study, no trial


@pytest.mark.parametrize(
    "option", sorted(p.stem for p in (ROOT / "conf" / "hparams_search").glob("*.yaml"))
)
def test_search_config_composes_resolves_and_builds(tmp_path, monkeypatch, option):
    from omegaconf import OmegaConf

    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [f"hparams_search={option}", *(["model=cnn"] if option.endswith("cnn") else [])]
    resolved = assert_option_builds(tmp_path, overrides)
    sweeper = resolved.hydra.sweeper
    # Its space parses into Optuna distributions, over keys the model it composes has.
    arguments = {k: v for k, v in sweeper.items() if not k.startswith("_")}
    _, space = OptunaSweeper(**arguments)._search_space([])
    assert space and set(space) == set(sweeper.params)
    cfg = compose_config("train", tmp_path, overrides)
    assert all(_has_key(cfg, key) for key in space)
    assert sweeper.study_name is None  # the sweeper names it after the setup
    assert OmegaConf.select(resolved, "hydra.launcher._target_").endswith("SubprocessLauncher")
