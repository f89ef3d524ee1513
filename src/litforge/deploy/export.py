"""`python export.py ckpt_path=... format=onnx|pt2`: a checkpoint as one file that runs without
litforge, checked against the checkpoint before it is kept.

The exported graph is `inference.ImageClassifier`: uint8 images N×C×H×W at the trained size in
(N free), logits out, the normalization inside. Class names and the input contract go into the
file (ONNX `metadata_props`, a `litforge` extra file in the .pt2) and into `model.json` beside it.

The check runs the exported file (onnxruntime for ONNX) and the checkpoint on the same images,
in one batch and one image alone, and compares the logits. Beyond `export.tolerance` the export
fails with one line and leaves no file.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from omegaconf import DictConfig

import litforge
from litforge.console import CONFIG_TREE, print_config
from litforge.data.images import BadImageError
from litforge.deploy.inference import (
    METADATA_KEY,
    ImageClassifier,
    InputContract,
    LoadedClassifier,
    image_files,
    load_classifier,
    restore_callbacks,
)
from litforge.errors import UserError
from litforge.settings import Positive, check_values

log = logging.getLogger(__name__)

FILES = {"onnx": "model.onnx", "pt2": "model.pt2"}
# export.yaml's settings: their types and bounds (as `checks.OTHERS` has train.yaml's).
SETTINGS = {"format": Literal["onnx", "pt2"], "export.tolerance": Positive}
SAMPLE_LIMIT = 64  # images the check runs on at most


def sample_images(spec: str | None, contract: InputContract) -> tuple[torch.Tensor, str]:
    """A uint8 batch to check the export on (from `spec`'s files, or seeded random pixels) and
    what it is."""
    if spec is None:
        generator = torch.Generator().manual_seed(0)
        shape = (16, contract.channels, contract.size, contract.size)
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator), "16 random"
    files = image_files(spec, key="export.sample_input")
    step = max(1, len(files) // SAMPLE_LIMIT)  # spread over the files (classes come in order)
    chosen = files[::step][:SAMPLE_LIMIT]
    images = []
    for path in chosen:
        try:
            images.append(contract.prepare(path.read_bytes()))
        except (BadImageError, OSError) as err:  # the check needs images, not all of them
            log.warning(f"export.sample_input: left out {path}, which does not decode ({err})")
    if not images:
        raise UserError(f"export.sample_input={spec}: none of its files decodes as an image.")
    return torch.stack(images), f"{len(images)} of {spec}"


def export_onnx(model: ImageClassifier, example: torch.Tensor, path: Path, metadata: str) -> None:
    try:
        import onnxscript  # noqa: F401  (what torch's ONNX exporter translates with)
    except ImportError as err:
        raise UserError('format=onnx needs onnxscript: pip install -e ".[export]"') from err
    for name in ("onnx_ir", "onnxscript"):  # their INFO lines would flood the run's log
        logging.getLogger(name).setLevel(logging.WARNING)
    program = torch.onnx.export(
        model,
        (example,),
        dynamo=True,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes={"images": {0: torch.export.Dim("batch")}},
        external_data=False,  # one file (models over 2 GB would need a .data file beside it)
        verbose=False,
    )
    program.model.metadata_props[METADATA_KEY] = metadata
    program.save(str(path))


def export_pt2(model: ImageClassifier, example: torch.Tensor, path: Path, metadata: str) -> None:
    program = torch.export.export(
        model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    with warnings.catch_warnings():
        # torch.export.save warns "No complete tensor found in the group" for every weight that
        # is not contiguous (the convolutions of a channels_last model) and saves its whole
        # storage with its strides: right for weights on the CPU, where export() loads the
        # checkpoint. (The warning came with pytorch/pytorch#164196, for weights on a GPU.)
        warnings.filterwarnings("ignore", "No complete tensor found in the group", UserWarning)
        torch.export.save(program, path, extra_files={METADATA_KEY: metadata})


def compare(reference: LoadedClassifier, exported: LoadedClassifier, images: torch.Tensor):
    """(max |logit difference|, share of images with the same top class), over `images` in one
    batch and the first image alone (the batch size must be free)."""
    expected = reference.logits(images)
    got = exported.logits(images)
    alone = exported.logits(images[:1])
    difference = max((got - expected).abs().max().item(), (alone - expected[:1]).abs().max().item())
    agreement = (got.argmax(1) == expected.argmax(1)).float().mean().item()
    return difference, agreement


def check_settings(cfg: DictConfig) -> None:
    if not cfg.get("ckpt_path"):
        raise UserError(
            "no checkpoint given: add ckpt_path=<file or folder>, e.g. "
            "logs/train/runs/<run>/checkpoints/last.ckpt"
        )
    check_values(cfg, SETTINGS)
    if Path(cfg.ckpt_path).suffix in (".onnx", ".pt2"):
        raise UserError(
            f"ckpt_path={cfg.ckpt_path} is an exported model already: export from the checkpoint "
            f"it came from."
        )


def export(cfg: DictConfig) -> Path:
    """Write, check and keep `<run dir>/model.<format>` and `model.json`; returns the model."""
    check_settings(cfg)
    output_dir = Path(cfg.paths.output_dir)
    if cfg.extras.get("print_config"):
        print_config(cfg, save_to=output_dir / CONFIG_TREE)
    reference = load_classifier(cfg.ckpt_path)
    restore_callbacks(cfg, Path(cfg.ckpt_path))
    images, described = sample_images(cfg.export.get("sample_input"), reference.contract)
    metadata = reference.metadata()
    text = json.dumps(metadata)

    # Written into a folder of its own, moved beside the run's files once it passed.
    partial = output_dir / ".export-partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        name = FILES[cfg.format]
        log.info(f"Exporting {reference.path} to {cfg.format}")
        writer = export_onnx if cfg.format == "onnx" else export_pt2
        # Traced on a batch of 2: an example of 1 would make torch.export fix the batch size.
        example = torch.zeros(2, *images.shape[1:], dtype=torch.uint8)
        writer(reference.run, example, partial / name, text)
        exported = load_classifier(partial / name, key="format")
        difference, agreement = compare(reference, exported, images)
        log.info(
            f"Check on {described} images: max |logit difference| {difference:.2e}, "
            f"same top class for {agreement:.0%}"
        )
        if not difference <= cfg.export.tolerance:  # NaN logits fail too
            raise UserError(
                f"the exported {cfg.format} model computes other logits than the checkpoint "
                f"(max |difference| {difference:.2e} > export.tolerance={cfg.export.tolerance}, "
                f"same top class for {agreement:.0%}): nothing was written."
            )
        check = {
            "images": described,
            "max_abs_logit_difference": difference,
            "same_top_class": agreement,
        }
        model_json = describe(cfg, name, metadata, check)
        (partial / "model.json").write_text(json.dumps(model_json, indent=2) + "\n")
        for path in partial.iterdir():
            path.replace(output_dir / path.name)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    path = output_dir / name
    print(
        f"Exported {path} (checked on {described} images: max |logit difference| "
        f"{difference:.2e}, same top class for {agreement:.0%})"
    )
    return path


def describe(cfg: DictConfig, name: str, metadata: dict, check: dict) -> dict[str, Any]:
    return {
        "file": name,
        "format": cfg.format,
        **metadata,
        "checkpoint": str(Path(cfg.ckpt_path).expanduser().resolve()),
        "check": check,
        "versions": {"litforge": litforge.__version__, "torch": torch.__version__},
    }
