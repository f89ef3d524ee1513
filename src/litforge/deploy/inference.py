"""A trained classifier as other programs use it: uint8 images in, class scores out. Shared by
`predict.py`, `export.py` and `serve.py`.

- `ImageClassifier`: the network with its input normalization inside; what export.py writes.
- `InputContract`: what the model takes (channels, size, mean/std), read from the checkpoint,
  and `prepare`, which turns an image file's bytes into that input the way training did.
- `load_classifier`: any model file litforge writes (a checkpoint, `model.onnx`, `model.pt2`)
  as a `LoadedClassifier`: its contract, class names and a `logits(images)` function.
- `image_files`: what `input=<file|folder|glob>` names.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from litforge.data.images import (
    IMAGE_SUFFIXES,
    INTERPOLATIONS,
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIZE,
    decode,
    fit,
    normalize,
)
from litforge.errors import UserError

METADATA_KEY = "litforge"  # the key of the metadata in model.onnx and model.pt2
EXPORTED = (".onnx", ".pt2")


class InputError(ValueError):
    """An input contract litforge cannot prepare images for (what a file says is impossible)."""


class ImageClassifier(nn.Module):
    """`net` behind the normalization it was trained with: uint8 N×C×H×W in, logits N×K out.
    With the normalization in the graph, a caller of an exported model needs no mean/std."""

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # The training data's own normalization: the same floats reach the network.
        return self.net(normalize(images, self.mean, self.std))


@dataclass(frozen=True)
class InputContract:
    """What the model takes: uint8 images `channels`×`size`×`size`, as training fitted them."""

    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"  # training's `data.interpolation`

    def __post_init__(self) -> None:  # read from a file: checked before any image is fitted to it
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise InputError(
                f"images of {self.channels} channels: litforge prepares 1 (gray) or 3 (RGB)"
            )
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise InputError(f"images of {self.size!r} px, not a positive integer")
        if self.size > MAX_IMAGE_SIZE:
            raise InputError(
                f"images of {self.size} px, more than the {MAX_IMAGE_SIZE} px litforge fits "
                f"images to"
            )
        if self.interpolation not in INTERPOLATIONS:
            raise InputError(f"interpolation {self.interpolation!r} is none of {INTERPOLATIONS}")

    def prepare(self, data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
        """An image file's bytes as the model's input (uint8 C×H×W): decoded, converted to the
        trained channels, the shorter side resized to `size` and the center kept (evaluation's
        fit). Raises `BadImageError` for bytes that are no image, or one of more pixels than
        `max_pixels` (read from its header: a small file can unpack into gigabytes)."""
        return fit(decode(data, self.channels, max_pixels), self.size, self.interpolation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": "images",
            "dtype": "uint8",
            "shape": ["batch", self.channels, self.size, self.size],
            "layout": "NCHW, RGB order for 3 channels, values 0-255",
            "resize": f"shorter side to {self.size} ({self.interpolation}, antialiased), then the "
            f"central {self.size}x{self.size}",
            "interpolation": self.interpolation,
            "normalization": "inside the model: (images / 255 - mean) / std per channel",
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> InputContract:
        _, channels, height, width = values["shape"]
        if height != width:
            raise InputError(f"non-square {height}x{width} images")
        interpolation = values.get("interpolation", "bilinear")  # not in older exports
        return cls(channels, height, tuple(values["mean"]), tuple(values["std"]), interpolation)


@dataclass
class LoadedClassifier:
    """A model of any format litforge writes, ready to run on uint8 batches."""

    path: Path
    kind: str  # checkpoint, onnx or pt2
    contract: InputContract
    class_names: list[str]
    run: Callable[[torch.Tensor], torch.Tensor]  # uint8 N×C×H×W -> float logits N×K
    device: torch.device = torch.device("cpu")

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """Float logits N×K on the CPU for uint8 images N×C×H×W."""
        with torch.inference_mode():
            return self.run(images.to(self.device)).float().cpu()

    def metadata(self) -> dict[str, Any]:
        """What travels with an exported file: class names and the input/output contract."""
        return {
            "class_names": self.class_names,
            "input": self.contract.to_dict(),
            "output": {
                "name": "logits",
                "dtype": "float32",
                "shape": ["batch", len(self.class_names)],
                "meaning": "one score per class, in class_names' order; softmax gives "
                "probabilities",
            },
        }


def model_source(cfg: Any) -> tuple[Path, str]:
    """The model file `ckpt_path=` (a checkpoint) or `model_path=` (an exported file) names, and
    which of the two named it; exactly one must."""
    given = [key for key in ("ckpt_path", "model_path") if cfg.get(key)]
    if len(given) != 1:
        problem = "both ckpt_path and model_path are given" if given else "no model given"
        raise UserError(
            f"{problem}: set ckpt_path=<checkpoint train.py wrote, e.g. logs/train/runs/<run>/"
            f"checkpoints/last.ckpt> or model_path=<model.onnx or model.pt2 export.py wrote>."
        )
    return Path(cfg[given[0]]).expanduser(), given[0]


def pick_device(name: str, key: str) -> str:
    """`auto` (a GPU when there is one), or the device `name` says, if this machine has it."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except (RuntimeError, ValueError):
        raise UserError(f"{key}={name} is no device: use auto, cpu, cuda or cuda:<n>.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{key}={name}, but this machine has no CUDA GPU: use {key}=cpu or auto.")
    return name


def load_classifier(
    path: str | Path, device: str = "cpu", compile: bool = False, key: str = "ckpt_path"
) -> LoadedClassifier:
    """The model in `path`: `*.onnx` (onnxruntime), `*.pt2` (torch.export), anything else a
    checkpoint file train.py wrote. `key` names the setting in error messages."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"{key}={path}: no such file.")
    if key == "model_path" and path.suffix not in EXPORTED:
        raise UserError(
            f"model_path={path} is neither a .onnx nor a .pt2 file: give the model.onnx or "
            f"model.pt2 export.py wrote, or a checkpoint as ckpt_path=<file>."
        )
    if path.suffix == ".onnx":
        return _load_onnx(path, key)
    if path.suffix == ".pt2":
        return _load_pt2(path, torch.device(device), key)
    return _load_checkpoint(path, torch.device(device), compile, key)


def classifier_from_checkpoint(path: Path, key: str = "ckpt_path") -> tuple[ImageClassifier, dict]:
    """The checkpoint's network behind its normalization (eval mode, CPU), and its
    hyperparameters with the data's `interpolation`."""
    from litforge import checkpoints

    checkpoint = checkpoints.read(path)
    module = checkpoints.load_module(path)
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    hp = {**checkpoints.data_settings(checkpoint), "interpolation": data.get("interpolation")}
    hp.update(interpolation=hp["interpolation"] or "bilinear")
    hp.update(channels_last=module.hparams.get("channels_last"))
    if any(hp.get(k) is None for k in ("input_shape", "mean", "std")):
        raise UserError(
            f"{key}={path} does not record its images' size and normalization (its run had "
            f"no ResumeState callback, or is older): train it again with this version."
        )
    # The module's network (a module of its own that has none: the module itself).
    net = module.net if isinstance(getattr(module, "net", None), torch.nn.Module) else module
    classifier = ImageClassifier(net, hp["mean"], hp["std"]).eval()
    if hp.get("channels_last"):  # as training ran it (other conv kernels, other last digits)
        classifier.to(memory_format=torch.channels_last)
    return classifier, hp


def restore_callbacks(cfg: Any, path: Path) -> None:
    """Hand each callback `cfg.callbacks` names the state the checkpoint `path` saved for it,
    through Lightning's `Callback.load_state_dict`, as a resumed run does: the provenance
    feature's says the commit the checkpoint was trained at."""
    import lightning as L
    from hydra.utils import instantiate

    from litforge import checkpoints

    states = checkpoints.read(path).get("callbacks")
    states = states if isinstance(states, dict) else {}
    for config in (cfg.get("callbacks") or {}).values():
        callback = instantiate(config) if config else None
        if isinstance(callback, L.Callback) and callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])


def _names(hp: dict) -> list[str]:
    return list(hp.get("class_names") or [str(i) for i in range(hp["num_classes"])])


def _load_checkpoint(path: Path, device: torch.device, compile: bool, key: str):
    classifier, hp = classifier_from_checkpoint(path, key)
    channels, height, width = hp["input_shape"]
    if height != width:
        raise UserError(f"{key}={path}: a model of non-square {height}x{width} images.")
    classifier.to(device)
    if compile:
        classifier.compile()
    mean, std = tuple(hp["mean"]), tuple(hp["std"])
    try:
        contract = InputContract(channels, height, mean, std, hp["interpolation"])
    except ValueError as err:
        raise UserError(f"{key}={path}: {err}; was it written by train.py?") from None
    return LoadedClassifier(path, "checkpoint", contract, _names(hp), classifier, device)


AGAIN = (
    "the file was altered or its metadata comes from another model: export it again with export.py"
)


def _from_metadata(
    path: Path, text: str | None, key: str, graph_input: list, graph_classes: int | None
) -> tuple[InputContract, list[str]]:
    """The contract and class names in an exported file's metadata, checked against its graph
    (`graph_input`: the input's dtype and shape, None for a free dimension; `graph_classes`: the
    scores it gives): the graph is what runs, the metadata only says how to prepare images."""
    try:
        metadata = json.loads(text or "")
        contract, names = InputContract.from_dict(metadata["input"]), metadata["class_names"]
        if not all(isinstance(name, str) for name in names):
            raise TypeError("class names that are no strings")
    except InputError as err:
        raise UserError(f"{key}={path}: its metadata says {err}; {AGAIN}.") from None
    except (ValueError, KeyError, TypeError):
        raise UserError(
            f"{key}={path} holds no litforge metadata (class names, input contract): use a "
            f"file export.py wrote."
        ) from None
    said = [None, contract.channels, contract.size, contract.size]
    dtype, shape = graph_input
    fits = dtype == "uint8" and len(shape) == 4
    # Channels and size fixed in the graph (export.py fixes them): a free one would take any.
    fits = fits and all(g == s for g, s in zip(shape[1:], said[1:], strict=True))
    if not fits or graph_classes not in (None, len(names)):
        takes = "x".join("?" if g is None else str(g) for g in shape[1:])
        raise UserError(
            f"{key}={path}: its metadata says {contract.channels}x{contract.size}x{contract.size} "
            f"images and {len(names)} classes, but its graph takes {takes} images ({dtype}) and "
            f"gives {graph_classes or '?'} scores; {AGAIN}."
        )
    return contract, list(names)


def _load_onnx(path: Path, key: str) -> LoadedClassifier:
    try:
        import onnxruntime
    except ImportError as err:
        raise UserError('ONNX models need onnxruntime: pip install -e ".[export]"') from err
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error types
        raise UserError(f"{key}={path} is not a readable ONNX model ({err}).") from None
    metadata = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1 or len(outputs[0].shape) != 2:
        raise UserError(f"{key}={path} takes or gives other than one tensor: {AGAIN}.")
    dtype = inputs[0].type.removeprefix("tensor(").removesuffix(")")  # tensor(uint8)
    static = [d if isinstance(d, int) else None for d in inputs[0].shape]  # names: free ones
    classes = outputs[0].shape[1]
    classes = classes if isinstance(classes, int) else None
    contract, names = _from_metadata(path, metadata, key, [dtype, static], classes)
    input_name = inputs[0].name

    def run(images: torch.Tensor) -> torch.Tensor:
        (logits,) = session.run(None, {input_name: images.contiguous().numpy()})
        return torch.from_numpy(logits)

    return LoadedClassifier(path, "onnx", contract, names, run)


def _load_pt2(path: Path, device: torch.device, key: str) -> LoadedClassifier:
    extra = {METADATA_KEY: ""}
    try:
        program = torch.export.load(path, extra_files=extra)
    except Exception as err:  # a zip that is no exported program, or no zip at all
        raise UserError(f"{key}={path} is not a readable torch.export file ({err}).") from None
    contract, names = _from_metadata(path, extra[METADATA_KEY], key, *_pt2_signature(program))
    if device.type != "cpu":  # parameters and the constants baked into the graph alike
        program = torch.export.passes.move_to_device_pass(program, device)
    module = program.module()
    return LoadedClassifier(path, "pt2", contract, names, module, device)


def _pt2_signature(program) -> tuple[list, int | None]:
    """The exported program's input ([dtype, shape], None for a free dimension) and the number
    of scores it gives (None: free), from the example values the exporter recorded."""
    nodes = {node.name: node for node in program.graph.nodes}
    signature = program.graph_signature
    values = [
        nodes[name].meta.get("val") for name in (*signature.user_inputs, *signature.user_outputs)
    ]
    if len(values) != 2 or not all(isinstance(v, torch.Tensor) for v in values):
        return ["?", []], None  # no single tensor in and out: refused as a mismatch
    images, logits = values
    static = [d if isinstance(d, int) else None for d in images.shape]  # SymInt: a free one
    classes = logits.shape[1] if logits.ndim == 2 else 0  # not N×K: refused as a mismatch
    classes = classes if isinstance(classes, int) else None
    return [str(images.dtype).removeprefix("torch."), static], classes


def top_k(
    probabilities: torch.Tensor, k: int, class_names: Sequence[str]
) -> list[list[tuple[str, float]]]:
    """For each row, the `k` most probable classes as (name, probability), best first."""
    values, indices = probabilities.topk(min(k, probabilities.shape[1]), dim=1)
    return [
        [(class_names[i], p) for i, p in zip(row_i, row_p, strict=True)]
        for row_i, row_p in zip(indices.tolist(), values.tolist(), strict=True)
    ]


def image_files(spec: str, key: str = "input") -> list[Path]:
    """The files `spec` names: one file; every image file under a folder (by suffix, hidden
    files left out); or a glob's matches (`photos/*.jpg`, `**` for subfolders)."""
    if not spec:
        raise UserError(f"no images given: add {key}=<image file, folder or glob>.")
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
            and p.is_file()
        )
        if not files:
            raise UserError(
                f"{key}={spec}: the folder holds no image files ({', '.join(IMAGE_SUFFIXES)})."
            )
        return files
    if glob.has_magic(spec):
        matches = glob.glob(os.path.expanduser(spec), recursive=True)
        files = sorted(Path(p) for p in matches if Path(p).is_file())
        if not files:
            raise UserError(f"{key}={spec} matches no files.")
        return files
    raise UserError(f"{key}={spec}: no such file or folder.")
