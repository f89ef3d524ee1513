"""Pictures of a run: the test confusion matrix, the loss and accuracy curves, a sweep's ranking.

matplotlib is imported inside the functions, with its non-interactive backend: it costs start-up
time and needs no display, and only the end of a run draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confusion_matrix(matrix: torch.Tensor, class_names: Sequence[str], path: Path):
    """Counts of (true class, predicted class) on the test set, class names on both axes."""
    plt = _pyplot()
    n = len(class_names)
    # Wide and tall enough for the title and the axis labels with few classes too
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 + 0.6 * n), max(3.6, 0.8 + 0.6 * n)), dpi=100)
    ax.imshow(matrix.numpy(), cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    peak = float(matrix.max()) or 1.0
    for i in range(n):
        for j in range(n):
            value = int(matrix[i, j])
            ax.text(
                j,
                i,
                value,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if value > peak / 2 else "black",
            )
    accuracy = float(matrix.diag().sum() / matrix.sum().clamp(min=1))
    ax.set_title(f"Test confusion matrix\naccuracy {accuracy:.4f}")
    fig.tight_layout()
    return _save(fig, path)


def curves(epochs: dict[int, dict[str, float]], path: Path):
    """Train and validation loss and accuracy per epoch (`{epoch: {"val/acc": ..., ...}}`)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for ax, kind in ((loss_ax, "loss"), (acc_ax, "acc")):
        for split in ("train", "val"):
            name = f"{split}/{kind}"
            points = sorted((e, m[name]) for e, m in epochs.items() if name in m)
            if points:
                ax.plot([e + 1 for e, _ in points], [v for _, v in points], marker="o", label=split)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title("loss" if kind == "loss" else "accuracy")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def sweep(labels: Sequence[str], values: Sequence[float], metric: str, path: Path):
    """The optimized metric of each job of a sweep (failed jobs left out)."""
    plt = _pyplot()
    pairs = [
        (label, value) for label, value in zip(labels, values, strict=True) if not math.isnan(value)
    ]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.4 * len(pairs)), dpi=100)
    ax.barh([label for label, _ in pairs][::-1], [value for _, value in pairs][::-1])
    ax.set_xlabel(metric)
    ax.set_title(f"{metric} per job")
    fig.tight_layout()
    return _save(fig, path)


def close(fig) -> None:
    """Free a figure: pyplot keeps every figure alive until closed."""
    _pyplot().close(fig)


def _save(fig, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return fig
