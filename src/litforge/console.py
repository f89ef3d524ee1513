"""Console output: the config in short (the tree in `config_tree.log`), the final metrics, and
Lightning's lines without repeats and adverts."""

import logging
import warnings
from pathlib import Path

import rich.markup  # (binds `rich` too)
import rich.syntax
import rich.table
import rich.tree
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

CONFIG_TREE = "config_tree.log"  # in the run folder: the whole config, resolved
# Printed first, in this order; any other top-level key follows.
CONFIG_ORDER = ("data", "model", "strategy", "trainer", "callbacks", "logger", "paths", "extras")
# Lightning's warnings that say nothing about this run: (message, category).
QUIET_WARNINGS = (
    # Step-level logs count steps across epochs: an epoch shorter than that still logs them.
    (r"The number of training batches \(\d+\) is smaller than the logging interval", UserWarning),
    # Lightning 2.6.6 with torch >= 2.10: a deprecation inside Lightning, not in user code.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated in torch 2.14.
    (r"'set_vital' is deprecated", UserWarning),
    # Testing a checkpoint (eval.py) needs none of the callbacks that wrote it.
    (r"Be aware that when using `ckpt_path`, callbacks used to create", UserWarning),
)


@rank_zero_only
def print_config(cfg: DictConfig, save_to: Path) -> None:
    save_to.parent.mkdir(parents=True, exist_ok=True)
    with save_to.open("w") as f:
        rich.print(config_tree(cfg), file=f)
    groups, overrides = _choices()
    # Not where the tree went: a run that fails before it writes anything else leaves no folder
    # (`errors.reported`). `print_metrics` names the file once the run is done.
    shown = {"Config": " ".join(groups), "Overrides": " ".join(overrides)}
    # Escaped: `callbacks=[a,b]` is no markup. Not highlighted: plain, as the log lines around.
    lines = [f"[bold]{k}:[/] {rich.markup.escape(str(v))}" for k, v in shown.items() if v]
    rich.get_console().print("\n".join(lines), highlight=False, soft_wrap=True)


def config_tree(cfg: DictConfig) -> rich.tree.Tree:
    tree = rich.tree.Tree("config", style="bold")
    keys = [k for k in CONFIG_ORDER if k in cfg] + [k for k in cfg if k not in CONFIG_ORDER]
    for key in keys:
        node = cfg[key]
        text = OmegaConf.to_yaml(node, resolve=True) if isinstance(node, DictConfig) else str(node)
        tree.add(f"[bold]{key}[/]").add(rich.syntax.Syntax(text, "yaml", theme="ansi_dark"))
    return tree


def _choices() -> tuple[list[str], list[str]]:
    """`group=option` for each group in use (not Hydra's) and the overrides, under `@hydra.main`."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return [], []
    hydra_cfg = HydraConfig.get()
    chosen = {
        group: option
        for group, option in hydra_cfg.runtime.choices.items()
        if option is not None and group.split("/")[0] != "hydra" and _exists(group, option)
    }
    order = [g for g in CONFIG_ORDER if g in chosen] + [g for g in chosen if g not in CONFIG_ORDER]
    return [f"{g}={chosen[g]}" for g in order], list(hydra_cfg.overrides.task)


def print_metrics(metrics: dict[str, float], output_dir: Path) -> None:
    table = rich.table.Table(title="Final metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{value:.4f}")
    rich.print(table)
    if (output_dir / CONFIG_TREE).is_file():  # (extras.print_config=false: none)
        rich.print(f"Full config: {output_dir / CONFIG_TREE}")
    rich.print(f"Run directory: {output_dir}")


def _exists(group: str, option: str) -> bool:
    """False for an optional default without a file, which Hydra lists among the choices."""
    from hydra.core.global_hydra import GlobalHydra

    try:
        options = GlobalHydra.instance().config_loader().get_group_options(group)
        return option in options or "/" in option  # (an option in a subfolder: not listed)
    except Exception:  # no Hydra instance to ask: show it
        return True


def _no_adverts(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip:")


def quiet_lightning() -> None:
    """Each Lightning line once, without adverts and noise; idempotent, once logging is set up.
    (Lightning's loggers also reach the root's handlers: where it has a console, theirs go.)"""
    for message, category in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    ranks = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _no_adverts not in ranks.filters:
        ranks.addFilter(_no_adverts)
    root = logging.getLogger()
    if not any(_is_console(h) for h in root.handlers):
        return  # (e.g. `hydra/job_logging=disabled`): Lightning's handlers are its only output
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if _is_console(h)]:
            logger.removeHandler(handler)
        logger.propagate = True


def _is_console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler  # a FileHandler is a StreamHandler too
