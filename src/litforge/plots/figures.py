"""Pictures of a run: the test confusion matrix, the loss and accuracy curves, the mistakes.
matplotlib is imported only to draw, non-interactive: it costs start-up time and needs no
display."""

from collections.abc import Sequence
from pathlib import Path

import torch


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confusion_matrix(matrix: torch.Tensor, class_names: Sequence[str], path: Path):
    plt = pyplot()
    n = len(class_names)
    # Room for the title and axis labels with few classes too
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 + 0.6 * n), max(3.6, 0.8 + 0.6 * n)), dpi=100)
    ax.imshow(matrix.numpy(), cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    ax.set(xlabel="predicted", ylabel="true")
    peak = float(matrix.max()) or 1.0
    for i, row in enumerate(matrix.tolist()):
        for j, value in enumerate(row):
            color = "white" if value > peak / 2 else "black"
            ax.text(j, i, value, ha="center", va="center", fontsize=7, color=color)
    accuracy = float(matrix.diag().sum() / matrix.sum().clamp(min=1))
    ax.set_title(f"Test confusion matrix\naccuracy {accuracy:.4f}")
    return save(fig, path)


def curves(epochs: dict[int, dict[str, float]], path: Path):
    """`epochs`: `{epoch: {"val/acc": ..., ...}}`."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for ax, kind, title in zip(axes, ("loss", "acc"), ("loss", "accuracy"), strict=True):
        for split in ("train", "val"):
            name = f"{split}/{kind}"
            points = sorted((e, m[name]) for e, m in epochs.items() if name in m)
            if points:
                ax.plot([e + 1 for e, _ in points], [v for _, v in points], marker="o", label=split)
        ax.set(xlabel="epoch", title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    return save(fig, path)


def mistakes(images: Sequence[torch.Tensor], titles: Sequence[str], path: Path):
    """`images` (C×H×W, uint8) in a grid, each under its title."""
    plt = pyplot()
    columns = min(4, len(images))
    rows = -(-len(images) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.9 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, title in zip(axes.flat, images, titles, strict=False):
        pixels = image.permute(1, 2, 0).numpy()
        gray = pixels.shape[2] == 1
        ax.imshow(pixels[..., 0] if gray else pixels, cmap="gray" if gray else None)
        ax.set_title(title, fontsize=8)
    fig.suptitle("The test images most confidently wrong")
    return save(fig, path)


def save(fig, path: Path):
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return fig


def close(fig) -> None:
    """pyplot keeps every figure alive until closed."""
    pyplot().close(fig)
