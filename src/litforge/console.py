"""Console output: the config tree at the start of a run, the metrics table at its end."""

from __future__ import annotations

from pathlib import Path

import rich
import rich.syntax
import rich.table
import rich.tree
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

# Printed first, in this order; any other top-level key follows.
CONFIG_ORDER = ("data", "model", "strategy", "trainer", "callbacks", "logger", "paths", "extras")


@rank_zero_only
def print_config(cfg: DictConfig, save_to: Path | None = None) -> None:
    """Print the resolved config as a tree (and save the same text to `save_to`)."""
    tree = rich.tree.Tree("config", style="bold")
    keys = [k for k in CONFIG_ORDER if k in cfg] + [k for k in cfg if k not in CONFIG_ORDER]
    for key in keys:
        value = cfg[key]
        text = (
            OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        )
        tree.add(f"[bold]{key}[/]").add(rich.syntax.Syntax(text, "yaml", theme="ansi_dark"))
    rich.print(tree)
    if save_to is not None:
        save_to.parent.mkdir(parents=True, exist_ok=True)
        with save_to.open("w") as f:
            rich.print(tree, file=f)


def print_metrics(metrics: dict[str, float], output_dir: Path) -> None:
    table = rich.table.Table(title="Final metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{value:.4f}")
    rich.print(table)
    rich.print(f"Run directory: {output_dir}")
