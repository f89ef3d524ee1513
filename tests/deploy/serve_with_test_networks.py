"""`python tests/deploy/serve_with_test_networks.py <overrides>`: serve.py, whose checkpoints may
also build the test networks of tests/helpers.py (`helpers.TEST_PACKAGES`).

LitServe spawns the model processes: each is a fresh interpreter that imports the main module
of the server (this file, not serve.py) before it loads the model, so they allow them too."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from helpers import TEST_PACKAGES  # noqa: E402  (from tests/)

import litforge.checkpoints  # noqa: E402

# What a checkpoint may build: also the classes of tests/helpers.py.
litforge.checkpoints.TRUSTED_PACKAGES = (*litforge.checkpoints.TRUSTED_PACKAGES, *TEST_PACKAGES)

if __name__ == "__main__":
    serve_py = TESTS.parent / "serve.py"
    sys.argv[0] = str(serve_py)
    # In globals of its own, as `python serve.py` runs it; `runpy.run_path` would make serve.py
    # the main module while it runs, the one the model processes import instead of this one.
    code = compile(serve_py.read_text(), serve_py, "exec")
    exec(code, {"__name__": "__main__", "__file__": str(serve_py)})
