"""User-facing errors: one clear line instead of a traceback."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


# Jobs of a sweep (-m) that failed, as the subprocess launcher reported them; see `exit_status`.
failed_sweep_jobs: list[str] = []


def exit_status() -> int:
    """0, or 1 when a job of a sweep failed: entry points exit with this after `main()`."""
    if failed_sweep_jobs:
        print(f"error: {len(failed_sweep_jobs)} job(s) of the sweep failed:", file=sys.stderr)
        for message in failed_sweep_jobs:
            print(f"  {message}", file=sys.stderr)
    return 1 if failed_sweep_jobs else 0


class UserError(Exception):
    """A problem the user can fix (a missing file, a bad value). The message says what and how."""


def check_number(
    key: str, value: object, *, integer: bool = False, minimum: float = 0, above: bool = False
) -> None:
    """A config value must be a number (`integer`: a whole one) at least `minimum`
    (`above`: greater than it). Checked before data is read or processes start."""
    kinds = (int,) if integer else (int, float)
    bound = f"{'greater than' if above else 'at least'} {minimum}"
    expected = f"{'an integer' if integer else 'a number'} {bound}"
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise UserError(f"{key}={value!r} is not a number: expected {expected}. Set {key}=...")
    if value < minimum or (above and value == minimum):
        raise UserError(f"{key}={value} is out of range: expected {expected}. Set {key}=...")


def user_error_in(err: BaseException | None) -> UserError | None:
    """The UserError behind `err`, also when Hydra's instantiate wrapped it in its own exception."""
    while err is not None:
        if isinstance(err, UserError):
            return err
        err = err.__cause__
    return None


def exit_on_user_error(task: Callable[..., T]) -> Callable[..., T]:
    """Turn a `UserError` raised by `task` into one line on stderr and exit status 1.

    `HYDRA_FULL_ERROR=1` re-raises instead, so the full traceback is still one variable away.
    """

    @functools.wraps(task)
    def wrapper(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except Exception as err:
            user_error = user_error_in(err)
            if user_error is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            log.debug("user error", exc_info=True)  # kept in the run's log file
            print(f"error: {user_error}", file=sys.stderr, flush=True)
            sys.exit(1)

    return wrapper
