"""What the sweep plugins (src/hydra_plugins/litforge/) share. Here, outside `hydra_plugins`:
Hydra's plugin scan may import a plugin module twice, which would make two classes of one name."""

import functools
import os
import sys
from typing import Any

from litforge.errors import UserError, say_error


class JobFailed(Exception):
    """The value of a sweep job that failed: its error line."""


def one_line(function):
    """Decorate what Hydra runs outside a task (a sweeper's `setup` and `sweep`): a UserError
    ends the process in one `error:` line and exit status 1 (`HYDRA_FULL_ERROR=1`: raised on).
    SystemExit passes through Hydra, which would print any exception with a traceback."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except UserError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            say_error(str(err))
            sys.exit(1)

    return run
