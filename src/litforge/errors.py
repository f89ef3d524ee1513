"""Bad input ends in one line that says what is wrong and how to fix it, and exit status 1
(`HYDRA_FULL_ERROR=1`: the traceback): `UserError` for problems our code finds, `one_line` for
Hydra's and OmegaConf's. An entry point gets both with two decorators around `@hydra.main`, as
train.py does; importing it changes nothing."""

import contextlib
import difflib
import functools
import inspect
import logging
import os
import re
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

FULL_ERROR = "LITFORGE_FULL_ERROR"  # the user's own HYDRA_FULL_ERROR, for processes main starts


class UserError(Exception):
    """A problem the user can fix (a missing file, a bad value). The message says what and how."""


class JobFailed(Exception):
    """The value of a sweep job that failed: its error line. (Not with the Hydra plugins: Hydra
    may import those twice, making two classes of one name.)"""


def number_problem(
    name: str, value: object, *, integer: bool = False, minimum: float = 0, above: bool = False
) -> str | None:
    """What is wrong with `value` as a number at least (`above`: above) `minimum`, or None."""
    kinds = (int,) if integer else (int, float)
    bound = f"{'greater than' if above else 'at least'} {minimum}"
    expected = f"{'an integer' if integer else 'a number'} {bound}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name}={value!r} is not a number: expected {expected}."
    if not isinstance(value, kinds):  # 1e9 is a float to YAML and Hydra
        return f"{name}={value!r} is not an integer: expected {expected}."
    if value < minimum or (above and value == minimum):
        return f"{name}={value} is out of range: expected {expected}."
    return None


def check_number(name: str, value: object, **bounds: Any) -> None:
    if problem := number_problem(name, value, **bounds):
        raise ValueError(problem)


def one_line(err: BaseException) -> str | None:
    """The one line to show for `err`, or None when it is no mistake of the user's (a bug)."""
    import hydra.errors
    import omegaconf.errors

    chain, cause = [err], err.__cause__  # err, what caused it, what caused that...
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    if user_error := next((e for e in chain if isinstance(e, UserError)), None):
        return str(user_error)
    if isinstance(err, hydra.errors.MissingConfigException) and err.options is not None:
        group, _, option = (err.missing_cfg_file or "").rpartition("/")
        return f"{group}={option}: no such option (conf/{group}/{option}.yaml). Choose one of: " + (
            f"{', '.join(err.options)}."
        )
    if isinstance(err, hydra.errors.ConfigCompositionException) and isinstance(
        cause, (omegaconf.errors.ConfigKeyError, omegaconf.errors.ConfigAttributeError)
    ):
        key, known = cause.full_key, list(cause.parent_node or [])
        near = difflib.get_close_matches(str(cause.key), known, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"it has: {', '.join(known)}."
        parent = key.rpartition(".")[0] or "the config"
        return f"{key} is not a setting of {parent}: {hint} (+{key}=... adds it)"
    if isinstance(err, hydra.errors.OverrideParseException):
        return f"{err.override}: not an override Hydra can parse ({str(err).splitlines()[0]})."
    if isinstance(err, hydra.errors.InstantiationException):
        # `<config key>: <what the constructor said> (in <class>)`. Lightning is loaded by now.
        from hydra.utils import get_object
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        key = re.search(r"full_key: (\S+)", str(err))
        where = f"{key[1]}: " if key else ""
        target = ([t for e in chain for t in re.findall(r"target '([^']+)'", str(e))] or ["?"])[-1]
        root = chain[-1]
        message = str(root).strip().splitlines()[0].rstrip(".")
        if isinstance(root, ImportError):
            return f"{where}cannot import _target_ {target} ({root}). Check its spelling."
        # A constructor refusing a value, or a wrong argument name; other errors are bugs.
        signature = isinstance(root, TypeError) and re.search(r"(keyword|positional) arg", message)
        if not (signature or isinstance(root, (ValueError, MisconfigurationException))):
            return None
        if unexpected := re.search(r"unexpected keyword argument '(\w+)'", message):
            accepted = []
            with contextlib.suppress(Exception):  # not importable or no signature: no names
                accepted = list(inspect.signature(get_object(target)).parameters)
            near = difflib.get_close_matches(unexpected[1], accepted, n=3)
            message += f"; did you mean {', '.join(near)}?" if near else f"; it takes {accepted}"
        return f"{where}{message} (in {target})"
    if monitored := next((e for e in chain if "conditioned on metric" in str(e)), None):
        # Lightning's: a ReduceLROnPlateau's monitor that the run does not log
        return f"model.scheduler.monitor: {str(monitored).split('. Condition can')[0]}."
    if missing := [e for e in chain if isinstance(e, omegaconf.errors.MissingMandatoryValue)]:
        return _missing_value(str(missing[0].full_key))
    if isinstance(err, (hydra.errors.HydraException, omegaconf.errors.OmegaConfBaseException)):
        # A resolver's UserError reaches here as text only (OmegaConf drops the exception).
        line = str(err).strip().splitlines()[0]
        return line.removeprefix(f"{UserError.__name__} raised while resolving interpolation: ")
    return None


def _missing_value(key: str) -> str:
    """`key` is `???`: say so, with what belongs there (the comment on its line in the YAML)."""
    group, _, leaf = key.partition(".")
    where = meaning = ""
    with contextlib.suppress(Exception):  # outside a Hydra run: the key alone
        from hydra.core.hydra_config import HydraConfig

        runtime = HydraConfig.get().runtime
        option = runtime.choices.get(group)
        for source in runtime.config_sources:
            path = Path(source.path) / group / f"{option}.yaml"
            if source.schema == "file" and option and path.is_file():
                name = re.escape(leaf.rpartition(".")[2])
                found = re.search(rf"^\s*{name}:\s*\?\?\?\s*#\s*(.+)$", path.read_text(), re.M)
                where, meaning = f" ({group}={option})", found[1].strip() if found else ""
                break
    return f"{key} is not set and this run needs it{where}: add {key}=<{meaning or 'a value'}>."


def _full_error() -> bool:  # the user asked for tracebacks (HYDRA_FULL_ERROR=1)
    return os.environ.get(FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR")) == "1"


def one_line_errors(main):
    """Decorate an entry point's `main`, above `@hydra.main`: a mistake Hydra finds ends in one
    `error:` line too. Hydra hands its errors on only with HYDRA_FULL_ERROR set (hydra #3361), so
    it is 1 while `main` runs; processes it starts find the user's own in LITFORGE_FULL_ERROR."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        saved = {name: os.environ.get(name) for name in (FULL_ERROR, "HYDRA_FULL_ERROR")}
        os.environ.update({FULL_ERROR: "1" if _full_error() else "", "HYDRA_FULL_ERROR": "1"})
        try:
            return main(*args, **kwargs)
        except Exception as err:
            if _full_error() or (line := one_line(err)) is None:
                raise  # the traceback
            _say_error(line)
            sys.exit(1)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    return run


def reported(task):
    """Decorate an entry point's task, under `@hydra.main`: a mistake of the user's ends in one
    `error:` line (the traceback: in the log file), and an empty run folder goes."""

    @functools.wraps(task)
    def run(cfg: Any) -> Any:
        new_folder = _new_run_dir(cfg)
        try:
            return task(cfg)
        except Exception as err:
            # Full errors: the folder stays, traceback in its log; sweeps: Hydra records a failure.
            if _full_error() or (line := one_line(err)) is None or _hydra_mode() == "MULTIRUN":
                raise
            root = logging.getLogger()
            log_files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
            for handler in log_files:  # the traceback: in train.log only
                handler.stream.write(f"error: {line}\n{traceback.format_exc()}")
                handler.flush()
            _say_error(line)
            if new_folder is not None and _holds_only_hydra_files(new_folder, empty_logs=False):
                for handler in log_files:  # the log files in it: closed first
                    if new_folder in Path(handler.baseFilename).parents:
                        root.removeHandler(handler)
                        handler.close()
                shutil.rmtree(new_folder, ignore_errors=True)
            sys.exit(1)

    return run


def _hydra_mode() -> str | None:  # RUN or MULTIRUN while Hydra runs the task
    from hydra.core.hydra_config import HydraConfig

    return getattr(HydraConfig.get().mode, "name", None) if HydraConfig.initialized() else None


def _new_run_dir(cfg: Any) -> Path | None:
    """The run folder if Hydra has just made it; None for a sweep's job (the summary lists it),
    a multi-process job's processes but the first, and a folder reentered (`ckpt_path=last`)."""
    from hydra.core.hydra_config import HydraConfig

    if _hydra_mode() != "RUN" or cfg.get("sweep_name"):  # sweep_name: a subprocess launcher's job
        return None
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")  # Lightning's DDP, torchrun, SLURM
    if any(os.environ.get(rank, "0") != "0" for rank in ranks):
        return None
    folder = Path(HydraConfig.get().runtime.output_dir)
    return folder if _holds_only_hydra_files(folder, empty_logs=True) else None


def _holds_only_hydra_files(folder: Path, empty_logs: bool) -> bool:
    """`folder` holds nothing but `.hydra/*.yaml` and `*.log` files (`empty_logs`: empty ones)."""
    try:
        for entry in folder.iterdir():
            if entry.name == ".hydra" and entry.is_dir():
                hydras = all(f.suffix == ".yaml" and f.is_file() for f in entry.iterdir())
            else:
                log = entry.suffix == ".log" and entry.is_file() and not entry.is_symlink()
                hydras = log and not (empty_logs and entry.stat().st_size)
            if not hydras:
                return False
    except OSError:  # gone, or not a folder
        return False
    return True


def _say_error(line: str) -> None:
    # One write: `print` writes the newline apart, and unbuffered another process can cut in.
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
