"""How bad input reaches the user: one line that says what is wrong and how to fix it, exit
status 1, and the full traceback only with `HYDRA_FULL_ERROR=1`.

- `UserError`: a problem the user can fix; its message is the line.
- `number_problem`: the wording for a number out of range, shared by the config checks (which
  name config keys) and the classes (which name their own arguments).
- `one_line`: the line for a UserError or a Hydra/OmegaConf mistake (an unknown option, an unknown
  key, a `_target_` that does not import, a constructor's ValueError), None for anything else.
- `reported`: the decorator of the entry points' task functions.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from omegaconf import DictConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


class UserError(Exception):
    """A problem the user can fix (a missing file, a bad value). The message says what and how."""


class JobFailed(Exception):
    """The value of a sweep job that failed: its error line. (Here rather than with the Hydra
    plugins, which Hydra may import twice, making two classes of one name.)"""


def number_problem(
    name: str, value: object, *, integer: bool = False, minimum: float = 0, above: bool = False
) -> str | None:
    """What is wrong with `value` as a number (`integer`: a whole one) at least `minimum`
    (`above`: greater than it); None when nothing is."""
    kinds = (int,) if integer else (int, float)
    bound = f"{'greater than' if above else 'at least'} {minimum}"
    expected = f"{'an integer' if integer else 'a number'} {bound}"
    if isinstance(value, bool) or not isinstance(value, kinds):
        return f"{name}={value!r} is not a number: expected {expected}."
    if value < minimum or (above and value == minimum):
        return f"{name}={value} is out of range: expected {expected}."
    return None


def _causes(err: BaseException | None) -> list[BaseException]:
    chain = []
    while err is not None:
        chain.append(err)
        err = err.__cause__
    return chain


def user_error_in(err: BaseException | None) -> UserError | None:
    """The UserError behind `err`, also when Hydra's instantiate wrapped it in its own exception."""
    return next((e for e in _causes(err) if isinstance(e, UserError)), None)


def one_line(err: BaseException) -> str | None:
    """The one line to show for `err`, or None when it is not a mistake of the user's (a bug)."""
    from hydra.errors import (
        ConfigCompositionException,
        HydraException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if (user_error := user_error_in(err)) is not None:
        return str(user_error)
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, option = (err.missing_cfg_file or "").rpartition("/")
        return (
            f"{group}={option}: no such option (conf/{group}/{option}.yaml). "
            f"Choose one of: {', '.join(err.options)}."
        )
    cause = err.__cause__
    if isinstance(err, ConfigCompositionException) and isinstance(
        cause, (ConfigKeyError, ConfigAttributeError)
    ):
        known = list(cause.parent_node.keys()) if cause.parent_node is not None else []
        near = difflib.get_close_matches(str(cause.key), known, n=3)
        parent = cause.full_key.rpartition(".")[0] or "the config"
        hint = f"did you mean {', '.join(near)}?" if near else f"it has: {', '.join(known)}."
        return (
            f"{cause.full_key} is not a setting of {parent}: {hint} "
            f"(+{cause.full_key}=... adds a new key.)"
        )
    if isinstance(err, InstantiationException):
        return _instantiation_line(err)
    if isinstance(err, OverrideParseException):
        return f"{err.override}: not an override Hydra can parse ({str(err).splitlines()[0]})."
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return str(err).strip().splitlines()[0]
    return None


def _instantiation_line(err: BaseException) -> str | None:
    """`<config key>: <what the constructor said> (<class>)`, with nearby argument names for an
    unexpected one; None for errors that look like bugs rather than bad settings."""
    chain = _causes(err)
    root = chain[-1]
    key = re.search(r"full_key: (\S+)", str(err))
    where = f"{key[1]}: " if key else ""
    targets = [t for e in chain for t in re.findall(r"target '([^']+)'", str(e))]
    target = targets[-1] if targets else "?"
    if isinstance(root, ImportError):
        return f"{where}cannot import _target_ {target} ({root}). Check its spelling."
    if not isinstance(root, (ValueError, TypeError)):
        return None
    message = str(root).strip().splitlines()[0].rstrip(".")
    hint = ""
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", message)
    if unexpected:
        from hydra.utils import get_object

        accepted = list(inspect.signature(get_object(target)).parameters)
        near = difflib.get_close_matches(unexpected[1], accepted, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f"; it takes {', '.join(accepted)}"
    return f"{where}{message} (in {target}){hint}"


def reported(task: Callable[[DictConfig], T]) -> Callable[[DictConfig], T]:
    """Decorate an entry point's task, under `@hydra.main`: a mistake of the user's (see
    `one_line`), in the command line, the config or the run, ends in one `error:` line and exit
    status 1. `HYDRA_FULL_ERROR=1` shows the traceback instead.

    Hydra prints its own errors (an unknown option, key or value) over several lines, and hands
    them on only when HYDRA_FULL_ERROR is set (hydra 1.3 has no hook; hydra #3361): it is set
    here, they reach `sys.excepthook`, and the user's own wish is kept in LITFORGE_FULL_ERROR for
    this process and the processes it starts.
    """
    wanted = os.environ.setdefault("LITFORGE_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", ""))
    if wanted != "1":
        os.environ["HYDRA_FULL_ERROR"] = "1"
        sys.excepthook = _excepthook

    @functools.wraps(task)
    def run(cfg: DictConfig) -> T:
        try:
            return task(cfg)
        except Exception as err:
            line = None if wanted == "1" else one_line(err)
            if line is None:
                raise
            log.debug("error", exc_info=True)  # the traceback, in the run's log file
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(1)

    return run


def _excepthook(kind: type[BaseException], err: BaseException, traceback: Any) -> None:
    line = one_line(err) if isinstance(err, Exception) else None
    if line is None:
        sys.__excepthook__(kind, err, traceback)
    else:
        print(f"error: {line}", file=sys.stderr, flush=True)
