"""`python predict.py ckpt_path=... input=<file|folder|glob>` (or `model_path=model.onnx|.pt2` for
`ckpt_path`): the class of each image, into
`<run dir>/predictions.csv` (`path`, `label`, `probability`, then `label_2`, `probability_2`, ...
up to `predict.top_k`), and a count per class on the console.

Images are prepared as the model was evaluated in training (`inference.InputContract`): decoded,
converted to its channels, fitted to its size; the normalization is part of the model.
"""

from __future__ import annotations

import csv
import logging
import math
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Literal

import rich
import rich.table
import rich.text
import torch
from omegaconf import DictConfig
from rich.progress import track
from torch.utils.data import DataLoader, Dataset

from litforge.console import CONFIG_TREE, print_config
from litforge.data.image_folder import cannot_decode
from litforge.data.images import BadImageError
from litforge.deploy.inference import (
    InputContract,
    image_files,
    load_classifier,
    model_source,
    pick_device,
    restore_callbacks,
    top_k,
)
from litforge.errors import UserError
from litforge.settings import NonNegativeInt, PositiveInt, check_values

log = logging.getLogger(__name__)

# predict.yaml's settings: their types and bounds (as `checks.OTHERS` has train.yaml's).
SETTINGS = {
    "predict.top_k": PositiveInt,
    "predict.batch_size": PositiveInt,
    "predict.num_workers": NonNegativeInt,
    "predict.on_bad_file": Literal["skip", "error"],
    "predict.max_image_pixels": PositiveInt,
}
# What makes a spreadsheet read a cell as a formula (OWASP's CSV injection guidance).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def shown(text: str) -> str:
    """`text` with its control characters written out (ESC as \\x1b): a terminal or spreadsheet
    that shows it runs none of them."""
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" else c for c in text)


def text_cell(text: object) -> str:
    """Text from the data (a class name, a file name) as a CSV cell that spreadsheets show as
    text: control characters written out, and a `'` before a cell that starts like a formula."""
    text = str(text)
    return f"'{shown(text)}" if text.startswith(FORMULA_STARTS) else shown(text)


class ImageFileInputs(Dataset):
    """Item i: (i, the prepared uint8 image) or (i, why the file cannot be read)."""

    def __init__(self, files: list[Path], contract: InputContract, max_pixels: int) -> None:
        self.files = files
        self.contract = contract
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str]:
        try:
            return index, self.contract.prepare(self.files[index].read_bytes(), self.max_pixels)
        except (BadImageError, OSError) as err:
            return index, str(err) or type(err).__name__


def readable_batch(items: list[tuple[int, torch.Tensor | str]]):
    """(indices, stacked images or None, [(index, reason) of the files that did not read])."""
    good = [(i, image) for i, image in items if isinstance(image, torch.Tensor)]
    bad = [(i, reason) for i, reason in items if isinstance(reason, str)]
    images = torch.stack([image for _, image in good]) if good else None
    return [i for i, _ in good], images, bad


def header(k: int) -> list[str]:
    ranked = [f"{column}_{rank}" for rank in range(2, k + 1) for column in ("label", "probability")]
    return ["path", "label", "probability", *ranked]


def predict(cfg: DictConfig) -> Counter:
    """Write predictions.csv for the images `cfg.input` names; returns the count per class."""
    check_values(cfg, SETTINGS)
    settings = cfg.predict
    path, key = model_source(cfg)
    output_dir = Path(cfg.paths.output_dir)
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=output_dir / CONFIG_TREE)
    files = image_files(cfg.get("input"))
    model = load_classifier(path, pick_device(settings.device, "predict.device"), key=key)
    if model.kind == "checkpoint":  # (not an exported model, which keeps no callback state)
        restore_callbacks(cfg, path)
    batches = math.ceil(len(files) / settings.batch_size)
    loader = DataLoader(
        ImageFileInputs(files, model.contract, settings.max_image_pixels),
        batch_size=settings.batch_size,
        # One batch is decoded faster here than worker processes start.
        num_workers=min(settings.num_workers, batches) if batches > 1 else 0,
        collate_fn=readable_batch,
    )
    k = min(settings.top_k, len(model.class_names))
    log.info(f"Predicting {len(files)} image(s) with {model.path} ({model.kind})")

    output = output_dir / "predictions.csv"
    partial = output.with_name(output.name + ".partial")  # a stopped run leaves no half a CSV
    output_dir.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    skipped = 0
    try:
        with partial.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(header(k))
            for indices, images, bad in track(loader, description="Predicting"):
                for index, reason in bad:
                    if settings.on_bad_file == "error":
                        bad_file = f"{files[index]} ({reason})"
                        raise cannot_decode(bad_file, "predict.on_bad_file=skip")
                    log.warning(f"Skipped {files[index]}: {reason}")
                    skipped += 1
                if images is None:
                    continue
                probabilities = model.logits(images).softmax(dim=1)
                for index, best in zip(
                    indices, top_k(probabilities, k, model.class_names), strict=True
                ):
                    ranked = [(text_cell(name), f"{p:.6f}") for name, p in best]
                    writer.writerow(
                        [text_cell(files[index]), *(v for pair in ranked for v in pair)]
                    )
                    counts[best[0][0]] += 1
        if not counts:
            raise UserError(f"input={cfg.input}: none of its {len(files)} file(s) decodes.")
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)
    summarize(counts, skipped, output)
    return counts


def summarize(counts: Counter, skipped: int, output: Path) -> None:
    table = rich.table.Table(title="Predicted classes", title_justify="left")
    table.add_column("class")
    table.add_column("images", justify="right")
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        table.add_row(rich.text.Text(shown(name)), str(count))  # Text: no console markup
    rich.print(table)
    if skipped:
        print(f"Skipped {skipped} unreadable file(s): named in the log.")
    log.info(f"{sum(counts.values())} prediction(s), {skipped} skipped: {output}")
    print(f"Predictions: {output}")  # not rich: it would wrap a long path
