"""A Hydra sweeper that searches hyperparameters with Optuna (>= 4), through its ask/tell API.

`python train.py -m hparams_search=optuna` (conf/hparams_search/). The search space is
`hydra.sweeper.params`, in Hydra's sweep syntax, and sweep overrides on the command line join it:

    model.optimizer.lr: tag(log, interval(1e-4, 1e-2))   # float, log scale
    model.net.dropout: interval(0.0, 0.5)                 # float
    trainer.max_epochs: int(interval(2, 8))               # int (tag(log, ...) for log scale)
    data.batch_size: range(64, 513, 64)                   # int with a step (end excluded)
    model: choice(mlp, cnn)                               # categorical
    seed: 7                                               # not a sweep: fixed for all trials

One trial at a time: ask Optuna for values, run the job through the launcher (by default each
job is its own `python train.py ...` process), tell Optuna the job's `optimized_metric`. A job
that crashes or returns NaN is told as FAIL and the search goes on. The study lives in SQLite in
the sweep folder (or `storage`); running the same command again opens the same study and runs
the trials it still lacks (`n_trials` counts all finished trials of the study), so an
interrupted search resumes and a larger `n_trials` extends it. Optuna's database is the source
of truth: after each trial the sweep summary (`sweep_summary.py` beside this file) is rewritten
from it, with `best.yaml` holding the best trial's parameters.

A study holds the trials of one setup: everything a trial trains with that is not searched.
Unless `study_name` is given, it is named `<data>_<model>-<hash of that setup>`
(`mnist_mlp-1a2b3c4d`), so another model, image folder, image size or fixed override (such as
`trainer.max_epochs=3`) starts its own study, and says which studies of the same name exist and
how their setups differ. Left out of the setup (`NOT_SETUP`): Hydra's own settings (the sweep
folder, `n_trials`, sampler, pruner, the search space itself), `paths`, loggers, printing,
tags, the progress bar and data-loading speed settings, and the searched keys. The setup is the
config as written (interpolations unresolved), so moving the project keeps the study.

With a `pruner`, each job reports its monitored metric after every validation epoch and stops
early when the pruner says so; the trial is then told PRUNED. The job's callback
(`callbacks.optuna_pruning`, listed in conf/hparams_search/, `_optuna_pruning.py` beside this
file) learns its trial from an override this sweeper adds to the job's overrides:
`callbacks.optuna_pruning.trial={study_name:...,storage:...,trial_id:...,pruner:{...}}`.
"""

import difflib
import hashlib
import json
import logging
import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    Quote,
    QuotedString,
    RangeSweep,
)
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, read_write

from hydra_plugins.litforge import sweep_summary
from litforge.errors import UserError
from litforge.sweeps import JobFailed, one_line

log = logging.getLogger(__name__)


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.litforge.optuna_sweeper.OptunaSweeper"
    _recursive_: bool = False  # sampler and pruner stay configs: jobs rebuild the pruner
    # null: <data>_<model>-<hash of the setup> (see the module's docstring). Given: used as it is.
    study_name: Any = None
    n_trials: int = 20  # finished trials the study should hold
    # null: SQLite in the sweep folder. Any Optuna storage URL works (postgresql://...).
    storage: Any = None
    # null: maximize or minimize as the config's `optimized_metric_mode` says.
    direction: Any = None
    # `_target_` configs; null sampler: TPE seeded with the config's `seed`. null pruner: none.
    sampler: Any = None
    pruner: Any = None
    params: dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(
    group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="litforge"
)

# The callback that reports to the pruner (conf/hparams_search/*.yaml): in a search with a
# pruner, each job gets `<PRUNING>.trial=<its trial>` among its overrides.
PRUNING = "callbacks.optuna_pruning"


def _distribution(override: Override) -> Any:
    """The Optuna distribution for one sweep override (`interval`, `range`, `choice`)."""
    import optuna.distributions as d

    key, sweep = override.get_key_element(), override.value()
    log_scale = "log" in getattr(sweep, "tags", set())
    if isinstance(sweep, IntervalSweep):
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):  # int(interval(...))
            return d.IntDistribution(sweep.start, sweep.end, log=log_scale)
        return d.FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
    if isinstance(sweep, RangeSweep):
        values = list(sweep.range())
        if not values:
            raise UserError(f"search space: {key}={override.input_line} is an empty range")
        if log_scale:
            raise UserError(
                f"search space: {key}: tag(log, ...) needs an interval, not a range; write "
                f"tag(log, int(interval({sweep.start}, {values[-1]})))"
            )
        if all(isinstance(v, int) for v in values):
            return d.IntDistribution(values[0], values[-1], step=int(sweep.step))
        return d.FloatDistribution(values[0], values[-1], step=float(sweep.step))
    if isinstance(sweep, ChoiceSweep):
        plain = all(v is None or isinstance(v, bool | int | float | str) for v in sweep.list)
        # Optuna stores plain values only: lists and dicts become their override text.
        return d.CategoricalDistribution(
            sweep.list if plain else list(override.sweep_string_iterator())
        )
    raise UserError(f"search space: {key}: unsupported sweep {override.input_line}")


def _check_compatible(study: Any, space: dict[str, Any]) -> None:
    """A parameter keeps its kind within a study (Optuna refuses, mid-trial, otherwise)."""
    from optuna.distributions import check_distribution_compatibility

    for trial in study.get_trials(deepcopy=False):
        for name, old in trial.distributions.items():
            if name in space:
                try:
                    check_distribution_compatibility(old, space[name])
                except ValueError as err:
                    raise UserError(
                        f"search space: {name} was {old} in study {study.study_name!r} and is now "
                        f"{space[name]} ({err}); keep its kind, or start a new study with "
                        f"hydra.sweeper.study_name=<new name>"
                    ) from err


# Config keys that do not change what a trial trains, left out of a study's setup: Hydra's own
# (sweep folder, n_trials, sampler, pruner, search space: `_check_compatible` guards its kinds),
# where files are read and written, how a run is logged or shown, and data-loading speed.
NOT_SETUP = (
    "hydra",
    "paths",
    "logger",
    "extras",
    "tags",
    "task_name",
    "sweep_name",  # the job's sweep (set by the launcher)
    "callbacks.rich_progress_bar",
    "callbacks.optuna_pruning",  # reports to the pruner; the pruner is the sweeper's setting
    "data.num_workers",
    "data.pin_memory",
)
# Keys left out while they hold the value given here, which follows from a key of the setup:
# a study keeps its name when the configs gain such a key.
IMPLIED = {"data.seed": "${seed}"}
SETUP_ATTR = "setup"  # the study's user attribute holding its setup (JSON), to tell setups apart


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for a nested container; an empty dict stays a value."""
    if isinstance(node, dict) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def setup_of(config: DictConfig, searched: list[str]) -> dict[str, Any]:
    """What a trial trains with apart from the searched keys: the config as written (unresolved:
    `${paths...}` stays text), flattened, less `NOT_SETUP`, `searched` and `IMPLIED` values."""
    left_out = [*NOT_SETUP, *(key.lstrip("+") for key in searched)]
    flat = _flatten(OmegaConf.to_container(config, resolve=False))
    return {
        key: value
        for key, value in flat.items()
        if not any(key == out or key.startswith(f"{out}.") for out in left_out)
        and not (key in IMPLIED and value == IMPLIED[key])
    }


def setup_hash(setup: dict[str, Any]) -> str:
    text = json.dumps(setup, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _differences(old: dict[str, Any], new: dict[str, Any], most: int = 3) -> str:
    keys = sorted(
        k for k in old.keys() | new.keys() if old.get(k, "<none>") != new.get(k, "<none>")
    )
    shown = [f"{k}: {old.get(k, '<none>')} -> {new.get(k, '<none>')}" for k in keys[:most]]
    return ", ".join(shown) + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _has_key(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    # `in node` is False for a '???' value; its keys() hold it.
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118


def _studies_named(readable: str, storage: str, sweep_dir: Path) -> Iterator[tuple[str, str, Any]]:
    """(name, where, summary) of the studies named `readable` or `readable-<hash>`: in `storage`,
    and in the SQLite files of the sweep folder's siblings (one folder per study by default)."""
    import optuna

    storages = [storage]
    if sweep_dir.parent.is_dir():
        storages += [
            f"sqlite:///{folder.resolve() / 'optuna.db'}"
            for folder in sorted(sweep_dir.parent.iterdir())
            if folder != sweep_dir
            and (folder.name == readable or folder.name.startswith(f"{readable}-"))
            and (folder / "optuna.db").is_file()
        ]
    for url in dict.fromkeys(storages):
        for summary in optuna.get_all_study_summaries(url):
            name = summary.study_name
            if name == readable or name.startswith(f"{readable}-"):
                yield name, url.removeprefix("sqlite:///"), summary


def _override_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _override_text(value: Any) -> str:
    """A plain value (None, bool, number, string, list, dict) in Hydra's override grammar, which
    parses it back to the same value: strings are quoted, so that a path or URL passes whole."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _override_value(value)
    if isinstance(value, str):
        return QuotedString(text=value, quote=Quote.single).with_quotes()
    if isinstance(value, list | tuple):
        return "[" + ",".join(_override_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_text(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"{value!r} has no override text")


def _mean_metrics(run_dirs: list[str | Path]) -> dict[str, float]:
    """The metrics.json of a job, or the mean of each metric over a trial's folds."""
    found = [Path(d, "metrics.json") for d in run_dirs]
    runs = [json.loads(f.read_text()) for f in found if f.is_file()]
    names = set.intersection(*(set(r) for r in runs)) if runs else set()
    return {name: statistics.mean(r[name] for r in runs) for name in sorted(names)}


class OptunaSweeper(Sweeper):
    writes_own_summary = True  # from the study, all trials; see sweep_summary.SweepSummary

    def __init__(
        self,
        study_name: str | None,
        n_trials: int,
        storage: str | None,
        direction: str | None,
        sampler: Any,
        pruner: Any,
        params: dict[str, Any],
    ) -> None:
        self.study_name, self.n_trials, self.storage = study_name, n_trials, storage
        self.named_by_user = bool(study_name)  # else named after the setup, in `sweep`
        self.direction, self.sampler, self.pruner = direction, sampler, pruner
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.launcher: Any = None

    @one_line  # a UserError here: one `error:` line (Hydra would print a traceback)
    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _search_space(self, arguments: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Fixed overrides for every trial, and the distributions to sample from. Command-line
        arguments win over `hydra.sweeper.params` for the same key."""
        merged = {
            str(key): f"{key}={value}" for key, value in self.params.items() if value is not None
        }
        parser = OverridesParser.create()
        for override in parser.parse_overrides(arguments):
            merged[override.get_key_element()] = override.input_line
        fixed, space = [], {}
        for line in merged.values():
            override = parser.parse_override(line)
            if override.is_sweep_override():
                space[override.get_key_element()] = _distribution(override)
            else:
                fixed.append(line)
        if not space:
            raise UserError(
                "the Optuna sweeper has nothing to search: give hydra.sweeper.params "
                "(see conf/hparams_search/optuna.yaml) or a sweep such as "
                "'model.optimizer.lr=tag(log,interval(1e-4,1e-2))'"
            )
        return fixed, space

    def _check_keys(self, start: DictConfig, space: dict[str, Any], arguments: list[str]) -> None:
        """Every searched key is in the config (`+key` adds one), before any trial runs: a search
        config written for another model would otherwise fail every trial."""
        choices = start.hydra.runtime.choices
        from_command_line = {
            o.get_key_element() for o in OverridesParser.create().parse_overrides(arguments)
        }
        for key in space:
            if key.startswith("+") or "@" in key or "/" in key or _has_key(start, key):
                continue
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(start, parent) if parent else start
            close = difflib.get_close_matches(
                leaf, [str(k) for k in node] if isinstance(node, DictConfig) else [], n=1
            )
            model = choices.get("model")
            line = (
                f"search space: {key} is not in the config"
                + (f" of model={model}" if model else "")
                + (f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else "")
            )
            search = choices.get("hparams_search")
            fitting = (
                self._fitting_searches(arguments, search, model)
                if search and key not in from_command_line
                else []
            )
            if fitting:
                line += f"; hparams_search={search} searches another model: for model={model} use "
                line += " or ".join(f"hparams_search={option}" for option in fitting)
            else:
                line += "; search only keys the config has, or add one with +key=..."
            raise UserError(line)

    def _fitting_searches(self, arguments: list[str], search: str, model: Any) -> list[str]:
        """The other hparams_search configs that keep this command's model and whose search
        space it has (composed with this command's fixed overrides)."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        loader = self.hydra_context.config_loader
        kept = [
            o.input_line
            for o in OverridesParser.create().parse_overrides(arguments)
            if not o.is_sweep_override() and o.get_key_element() != "hparams_search"
        ]
        fitting = []
        for option in loader.get_group_options("hparams_search"):
            if option == search:
                continue
            try:
                cfg = loader.load_sweep_config(self.config, [*kept, f"hparams_search={option}"])
            except (HydraException, OmegaConfBaseException):  # does not compose with this command
                continue
            keys = [str(k) for k in OmegaConf.select(cfg, "hydra.sweeper.params", default={})]
            if (
                cfg.hydra.runtime.choices.get("model") == model
                and keys
                and all(k.startswith("+") or _has_key(cfg, k) for k in keys)
            ):
                fitting.append(option)
        return fitting

    def _name_study(self, start: DictConfig, space: dict[str, Any], setup: dict[str, Any]) -> str:
        """Name the study after its setup unless the user named it; returns the readable part.
        The jobs' configs get the name too (their folders are in the sweep folder)."""
        choices = start.hydra.runtime.choices
        readable = "_".join(
            str(choices[group])
            for group in ("data", "model")
            if choices.get(group) and group not in space
        )
        readable = readable or "search"
        if self.named_by_user:
            return readable
        assert self.config is not None
        self.study_name = f"{readable}-{setup_hash(setup)}"
        with read_write(self.config.hydra):
            self.config.hydra.sweeper.study_name = self.study_name
            # What the launcher composes each job from (Hydra's and ours alike).
            self.config.hydra.overrides.hydra.append(f"hydra.sweeper.study_name={self.study_name}")
        return readable

    def _compare_setup(
        self, study: Any, storage: str, setup: dict[str, Any], readable: str, sweep_dir: Path
    ) -> None:
        """Record a new study's setup, and say what other studies of its name were set up with;
        warn when a study named by the user was set up otherwise."""
        stored = study.user_attrs.get(SETUP_ATTR)
        if stored is not None:
            old = json.loads(stored)
            if old != setup:
                log.warning(
                    f"Optuna study {self.study_name!r} was started with another setup "
                    f"({_differences(old, setup)}); its trials are not comparable with this "
                    f"search's. Leave out hydra.sweeper.study_name to give each setup its own "
                    f"study."
                )
            return
        if study.trials:  # from before studies recorded their setup
            return
        study.set_user_attr(SETUP_ATTR, json.dumps(setup, default=str))
        if self.named_by_user:
            log.info(f"New Optuna study {self.study_name!r}.")
            return
        log.info(f"New Optuna study {self.study_name!r}: no earlier search had this setup.")
        for name, where, summary in _studies_named(readable, storage, sweep_dir):
            if name == self.study_name:
                continue
            old = summary.user_attrs.get(SETUP_ATTR)
            how = (
                f"setup differs in {_differences(json.loads(old), setup)}"
                if old
                else (f"setup not recorded; hydra.sweeper.study_name={name} adds to it")
            )
            log.info(
                f"  other study of {readable}: {name!r} in {where}, "
                f"{summary.n_trials} trial(s), {how}"
            )

    def _create_study(self, sweep_dir: Path) -> tuple[Any, str]:
        import optuna

        assert self.config is not None
        mode = OmegaConf.select(self.config, "optimized_metric_mode", default="max")
        direction = self.direction or ("maximize" if mode == "max" else "minimize")
        sampler_config = self.sampler or {
            "_target_": "optuna.samplers.TPESampler",
            "seed": OmegaConf.select(self.config, "seed"),
        }
        sampler = instantiate(sampler_config)
        pruner = instantiate(self.pruner) if self.pruner else optuna.pruners.NopPruner()
        storage = self.storage or f"sqlite:///{(sweep_dir / 'optuna.db').resolve()}"
        try:
            study = optuna.create_study(
                study_name=self.study_name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                direction=direction,
                load_if_exists=True,
            )
        except ValueError as err:  # e.g. the stored study has another direction
            raise UserError(f"Optuna study {self.study_name!r} in {storage}: {err}") from err
        # A trial still RUNNING was cut off with its invocation (one search per study at a time).
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            log.warning(f"trial {trial.number} was interrupted; recording it as failed")
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        # A seeded sampler draws the same points in each invocation: a resumed study's sampler is
        # seeded past its trials, so that it does not run its first points again.
        if study.trials and sampler_config.get("seed") is not None:
            seed = sampler_config["seed"] + len(study.trials)
            study.sampler = instantiate(sampler_config, seed=seed)
        return study, storage

    @one_line
    def sweep(self, arguments: list[str]) -> None:
        try:
            import optuna
        except ModuleNotFoundError as err:
            raise UserError(
                "hydra/sweeper=optuna needs Optuna: pip install -e '.[optuna]'"
            ) from err

        assert self.config is not None and self.launcher is not None
        if not OmegaConf.select(self.config, "optimized_metric"):
            raise UserError("the Optuna sweeper needs `optimized_metric` (e.g. val/acc_best)")
        fixed, space = self._search_space(arguments)
        # The config every trial starts from (its own values then added), composed as the
        # launcher composes a job: the search's keys are checked on it and its setup named.
        start = self.hydra_context.config_loader.load_sweep_config(self.config, fixed)
        self._check_keys(start, space, arguments)
        setup = setup_of(start, list(space))
        readable = self._name_study(start, space, setup)
        sweep_dir = Path(self.config.hydra.sweep.dir)  # holds the study's name
        sweep_dir.mkdir(parents=True, exist_ok=True)
        study, storage = self._create_study(sweep_dir)
        self._compare_setup(study, storage, setup, readable, sweep_dir)
        _check_compatible(study, space)
        finished = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        todo = self.n_trials - finished
        log.info(
            f"Optuna study {self.study_name!r} ({storage}): {finished} finished trial(s), "
            f"{max(todo, 0)} to run (n_trials={self.n_trials})"
        )
        if todo <= 0:
            log.info(f"Nothing to run: raise hydra.sweeper.n_trials above {finished} to add more.")
        folds = self._folds(start, arguments)
        if folds and self.pruner:
            log.warning("hydra.sweeper.pruner is not used: a trial's folds are jobs of their own.")
        prunes = todo > 0 and bool(self.pruner) and not folds and self._can_prune(start)
        for _ in range(max(todo, 0)):
            trial = study.ask(fixed_distributions=space)
            overrides = fixed + [f"{k}={_override_value(v)}" for k, v in trial.params.items()]
            trial.set_user_attr("overrides", overrides)  # what reproduces the trial
            told = [self._trial_override(storage, trial._trial_id)] if prunes else []
            # k-fold: a job per fold, numbered trial × folds + fold
            runs = [overrides + [f"data.fold={fold}"] for fold in folds] or [overrides + told]
            jobs = self.launcher.launch(runs, initial_job_idx=trial.number * len(runs))
            self._tell(study, trial, jobs)
            self._write_summary(study, sweep_dir)
        # Failed trials are results of a search, recorded in the study and the summary; the
        # search itself failed only when no trial completed.
        if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            raise UserError(
                f"no trial of Optuna study {self.study_name!r} completed; the errors are in "
                f"{sweep_dir / 'summary.md'}"
            )

    @staticmethod
    def _can_prune(start: DictConfig) -> bool:
        """Whether the jobs have the callback that reports to the pruner."""
        if _has_key(start, f"{PRUNING}.trial"):
            return True
        log.warning(
            f"hydra.sweeper.pruner prunes nothing: the config has no {PRUNING}.trial to tell "
            f"the jobs their trial (conf/hparams_search/optuna.yaml lists that callback)."
        )
        return False

    def _trial_override(self, storage: str, trial_id: int) -> str:
        """The override that tells a job which trial it is, so that it can report to the pruner
        (`_optuna_pruning.OptunaPruning`); it shows in the job's `.hydra/overrides.yaml`."""
        trial = {
            "study_name": self.study_name,
            "storage": storage,
            "trial_id": trial_id,
            "pruner": OmegaConf.to_container(self.pruner, resolve=True),
        }
        return f"{PRUNING}.trial={_override_text(trial)}"

    @staticmethod
    def _folds(start: DictConfig, arguments: list[str]) -> list[int]:
        """The folds each trial runs, when the data are cross-validated (`data.num_folds`) and
        no `data.fold` is given: all of them, the trial's value their mean."""
        num_folds = OmegaConf.select(start, "data.num_folds")
        given = any(re.match(r"\+*data\.fold=", argument) for argument in arguments)
        if not num_folds or given:
            return []
        log.info(
            f"data.num_folds={num_folds}: each trial is the mean of {num_folds} jobs, a fold each"
        )
        return list(range(num_folds))

    def _tell(self, study: Any, trial: Any, jobs: list[Any]) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("run_dir", str(jobs[0].working_dir))
        values = []
        for job in jobs:
            value = job._return_value if job.status.name == "COMPLETED" else None
            if isinstance(value, JobFailed):  # litforge's launcher: the error line
                trial.set_user_attr("error", str(value))
                value = None
            values.append(value)
        if len(jobs) > 1:  # the folds: the summary's row averages their metrics.json
            trial.set_user_attr("run_dirs", [str(job.working_dir) for job in jobs])
        # Read back what the job itself wrote into the trial (`_optuna_pruning.py`).
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        stored = next(t for t in running if t.number == trial.number)
        failed = [v for v in values if v is None or not math.isfinite(float(v))]
        if "pruned_at_epoch" in stored.user_attrs:
            study.tell(trial, state=TrialState.PRUNED)
        elif failed:
            if failed[0] is not None:
                trial.set_user_attr(
                    "error", f"{OmegaConf.select(self.config, 'optimized_metric')} is {failed[0]}"
                )
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, statistics.mean(float(v) for v in values))

    def _write_summary(self, study: Any, sweep_dir: Path) -> None:
        from optuna.trial import TrialState

        assert self.config is not None
        metric = OmegaConf.select(self.config, "optimized_metric")
        mode = OmegaConf.select(self.config, "optimized_metric_mode", default="max")
        status = {
            TrialState.COMPLETE: "completed",
            TrialState.FAIL: "failed",
            TrialState.PRUNED: "pruned",
        }
        jobs = []
        for trial in study.get_trials(deepcopy=False, states=tuple(status)):
            run_dir = Path(trial.user_attrs.get("run_dir", ""))
            metrics = _mean_metrics(trial.user_attrs.get("run_dirs") or [run_dir])
            if trial.value is not None:
                metrics[metric] = trial.value
            jobs.append(
                sweep_summary.JobResult(
                    trial.number,
                    list(trial.user_attrs.get("overrides", [])),
                    run_dir,
                    status[trial.state],
                    metrics if trial.state == TrialState.COMPLETE else {},
                    trial.user_attrs.get("error", ""),
                )
            )
        sweep_summary.write(sweep_dir, jobs, metric, mode, show=True)
        completed = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if completed:
            best = study.best_trial
            summary = {
                "study_name": self.study_name,
                "direction": study.direction.name.lower(),
                "trials": len(jobs),
                "best_trial": best.number,
                metric: best.value,
                "best_params": best.params,
                "overrides": best.user_attrs.get("overrides", []),
            }
            OmegaConf.save(OmegaConf.create(summary), sweep_dir / "best.yaml")
            log.info(
                f"Best so far: trial {best.number}, {metric}={best.value:.4f}: "
                f"{' '.join(best.user_attrs.get('overrides', []))}"
            )
