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
    """`images` (C×H×W, uint8) in a grid, each under its two-line title, as a Pillow image:
    drawn by Pillow, not matplotlib (16 images: ~20 ms instead of ~0.7 s, benchmarks.md)."""
    from PIL import Image, ImageDraw, ImageFont

    # Small images scaled up by a whole factor (sharp pixels); a column fits its caption. Larger
    # ones as they are: fewer pixels to save.
    largest = max(max(image.shape[1:]) for image in images)
    factor = max(1, 176 // largest)
    side = max(176, largest * factor)
    columns, pad, header, caption = min(4, len(images)), 8, 30, 34
    rows = -(-len(images) // columns)
    width, height = pad + columns * (side + pad), header + rows * (caption + side + pad)
    grid = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(grid)
    title = "The test images most confidently wrong"
    draw.text((pad, 6), title, fill="black", font=ImageFont.load_default(size=16))
    font = ImageFont.load_default(size=12)
    for k, (image, text) in enumerate(zip(images, titles, strict=True)):
        x, y = pad + k % columns * (side + pad), header + k // columns * (caption + side + pad)
        draw.multiline_text((x, y), text, fill="black", font=font, spacing=2)
        pixels = image.permute(1, 2, 0).numpy()
        picture = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
        size = (picture.width * factor, picture.height * factor)
        grid.paste(picture.convert("RGB").resize(size, Image.Resampling.NEAREST), (x, y + caption))
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path, compress_level=1)  # (photos: 1/4 of the default level's time, ~10 % larger)
    return grid


def save(fig, path: Path):
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return fig


def close(fig) -> None:
    """pyplot keeps every figure alive until closed."""
    pyplot().close(fig)
