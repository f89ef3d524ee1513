"""No private Lightning API in the core (src/litforge/*.py, models/, data/): every Lightning
upgrade would otherwise be an audit. Feature folders may use it where nothing public serves, with a
comment naming the upstream issue."""

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "litforge"
CORE = sorted(
    [*SRC.glob("*.py"), *(SRC / "models").glob("*.py"), *(SRC / "data").glob("*.py")],
    key=lambda p: str(p),
)
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")
# Lightning internals reached through public objects (trainer, strategy, loops, callbacks), and
# private methods a subclass would override.
PRIVATE_ATTRIBUTES = {
    "_logger_connector",
    "_trainer",
    "fit_loop",
    "_launcher",
    "_configure_launcher",
    "_save_checkpoint",
    "_extract_stats",
    "_register_ddp_hooks",
    "_get_ddp_logging_data",
    "_combined_loader",
    "_skip_backward",
    "batch_progress",
}


def private_uses(text: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text, filename=name)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIGHTNING:
            parts = node.module.split(".")
            names = [a.name for a in node.names if a.name.startswith("_")]
            if any(p.startswith("_") for p in parts) or names:
                found.append(f"{where}: from {node.module} import {', '.join(names) or '...'}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIGHTNING and any(p.startswith("_") for p in parts):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name in PRIVATE_ATTRIBUTES:
            found.append(f"{where}: def {node.name} (overrides Lightning's private method)")
    return found


def test_the_core_is_what_this_test_reads():
    names = {p.name for p in CORE}
    assert {"pipeline.py", "strategies.py", "checkpoints.py", "base.py", "classifier.py"} <= names


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_lightning_api_in_the_core(path):
    assert private_uses(path.read_text(), str(path.relative_to(SRC.parent))) == []


def test_the_check_finds_what_it_looks_for():
    text = (
        "from lightning.fabric.utilities.load import _load_distributed_checkpoint\n"
        "import lightning.pytorch.loops._utils\n"
        "from lightning.pytorch.trainer.connectors.logger_connector import result\n"
        "def f(trainer, module):\n"
        "    trainer.fit_loop.epoch_loop.batch_progress.current.ready\n"
        "    module._trainer._logger_connector\n"
        "class C:\n"
        "    def _save_checkpoint(self, trainer, path): ...\n"
    )
    found = private_uses(text, "sample.py")
    assert sorted(line.split(": ", 1)[1] for line in found) == sorted(
        [
            "from lightning.fabric.utilities.load import _load_distributed_checkpoint",
            "import lightning.pytorch.loops._utils",
            "def _save_checkpoint (overrides Lightning's private method)",
            ".batch_progress",
            "._logger_connector",
            "._trainer",
            ".fit_loop",
        ]
    )


def inherited_private_uses(path: Path) -> list[str]:
    """`self._x` in a core class where `_x` belongs to a Lightning class it extends (a logger's
    `_experiment`, a callback's `_last_global_step_saved`): a private attribute by inheritance."""
    name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    module = importlib.import_module(name)
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        lightnings = [
            c for c in getattr(module, node.name).__mro__ if c.__module__.split(".")[0] in LIGHTNING
        ]
        sources = [inspect.getsource(c) for c in lightnings]
        for used in ast.walk(node):
            if (
                isinstance(used, ast.Attribute)
                and used.attr.startswith("_")
                and not used.attr.startswith("__")
                and isinstance(used.value, ast.Name)
                and used.value.id == "self"
                and any(re.search(rf"\b{used.attr}\b", source) for source in sources)
            ):
                found.append(
                    f"{name}:{used.lineno}: self.{used.attr} (of {lightnings[0].__name__})"
                )
    return found


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_attribute_of_a_lightning_class_in_the_core(path):
    assert inherited_private_uses(path) == []


def test_the_inherited_check_finds_a_loggers_private_attribute(tmp_path, monkeypatch):
    package = tmp_path / "probe_package"
    package.mkdir()
    (package / "probe.py").write_text(
        "import lightning.pytorch.loggers\n"
        "class Logger(lightning.pytorch.loggers.CSVLogger):\n"
        "    def experiment(self):\n"
        "        self._mine = 1\n"
        "        return self._experiment\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", package)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = inherited_private_uses(package / "probe.py")
    assert [line.split(": ", 1)[1] for line in found] == ["self._experiment (of CSVLogger)"]
