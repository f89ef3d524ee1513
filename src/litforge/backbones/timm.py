"""`model=timm`: a timm model without its classifier as the `backbone`, a linear `head` for the
dataset's classes. timm is imported only when such a network is built or configured: a run with
another model never loads it."""

import difflib
import logging
import math
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from litforge.errors import UserError
from litforge.hooks import PreparesRun

log = logging.getLogger(__name__)
# timm.create_model's arguments that read a file or fetch one: a checkpoint, which is data, holds
# the network's settings, so it must not name them.
READS_FILES = {"checkpoint_path", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"}
OFFLINE_HINT = "set model.net.pretrained_file=PATH to a local .safetensors/.pth file"


def _timm():
    try:
        import timm
    except ImportError as err:
        raise UserError(f'model=timm needs timm ({err}): pip install -e ".[timm]"') from err
    return timm


def check_model_name(name: str) -> None:
    """A UserError unless timm knows `name` (an architecture, or `architecture.tag`: weights)."""
    timm = _timm()
    if not timm.is_model(name):
        near = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(near)}?" if near else "timm.list_models() lists them."
        raise UserError(f"model.net.model_name={name} is not a timm model: {hint}")
    if "." in name:  # a tag names one set of weights of the architecture
        try:
            timm.get_pretrained_cfg(name)
        except RuntimeError as err:
            tags = ", ".join(timm.list_pretrained(name.split(".")[0] + ".*")) or "none"
            raise UserError(f"model.net.model_name={name}: {err} Its weights: {tags}.") from err


WEIGHTS_HELP = (
    "Give a .safetensors or .pth file of the backbone's weights (docs/models.md, A local weights "
    "file)."
)


def weights_file(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"model.net.pretrained_file={path}: no such file. {WEIGHTS_HELP}")
    with path.open("rb") as f:
        head = f.read(9)
    # torch.save's zip (or its older pickle), or safetensors: 8 bytes of length, then JSON.
    if not (head[:4] == b"PK\x03\x04" or head[:1] == b"\x80" or head[8:9] == b"{"):
        raise UserError(
            f"model.net.pretrained_file={path} is not a weights file (neither safetensors nor "
            f"torch.save's format). {WEIGHTS_HELP}"
        )
    return path


def data_config(model_name: str) -> dict[str, Any]:
    """What timm says the weights of `model_name` expect: input_size, interpolation, mean, std."""
    timm = _timm()
    from timm.data import resolve_data_config

    pretrained = timm.get_pretrained_cfg(model_name)
    return resolve_data_config(pretrained_cfg=pretrained.to_dict() if pretrained else {})


class TimmNet(PreparesRun, nn.Module):
    """timm's `model_name` with `num_classes=0` (pooled features) as `backbone`, then a linear
    `head`. `input_shape` (C, H, W) and `num_classes` come from the datamodule: weights trained on
    RGB images take gray ones too (timm adapts the first convolution to `in_chans`).

    `pretrained=True` fetches timm's weights from the Hugging Face hub; `pretrained_file` loads
    them from a local .safetensors or .pth file instead, which must hold every tensor of the
    backbone. Other keyword arguments go to `timm.create_model` (e.g. `img_size` for a ViT)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        model_name: str,
        pretrained: bool = False,
        pretrained_file: str | None = None,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if reading := sorted(READS_FILES & set(kwargs)):
            raise UserError(
                f"model.net.{reading[0]}: TimmNet reads weights only from pretrained_file (or "
                f"pretrained=true); a checkpoint holds them after training."
            )
        timm = _timm()
        check_model_name(model_name)
        # Only when set: some architectures take no drop_path_rate, and 0 is their default anyway.
        drops = {"drop_rate": drop_rate, "drop_path_rate": drop_path_rate}
        options = {"num_classes": 0, "in_chans": input_shape[0], **kwargs}
        options.update({k: v for k, v in drops.items() if v})
        if pretrained_file:
            path = weights_file(pretrained_file)
            try:
                self.backbone = timm.create_model(
                    model_name,
                    pretrained=True,
                    pretrained_cfg_overlay={"file": str(path)},
                    **options,
                )
            except RuntimeError as err:  # torch's load_state_dict: shapes that do not fit
                if isinstance(err.__cause__, pickle.UnpicklingError):  # weights_only refused it
                    raise UserError(
                        f"model.net.pretrained_file={path} holds Python objects besides tensors, "
                        f"which are never unpickled here (they could run code). Save the tensors "
                        f"alone: torch.save(model.state_dict(), path), or a .safetensors file."
                    ) from err
                raise UserError(
                    f"model.net.pretrained_file={path} does not fit {model_name}: {_summary(err)}"
                ) from err
            check_covered(self.backbone, path, model_name)
        elif pretrained:
            try:
                self.backbone = timm.create_model(model_name, pretrained=True, **options)
            except (OSError, RuntimeError) as err:  # offline, or no weights for this model
                raise UserError(
                    f"model.net.pretrained=true: the weights of {model_name} could not be fetched "
                    f"({_summary(err)}): {OFFLINE_HINT}."
                ) from err
        else:
            self.backbone = timm.create_model(model_name, **options)
        self.head = nn.Linear(self.backbone.num_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    @classmethod
    def prepare_run(cls, cfg: DictConfig) -> None:
        """Before the datamodule is built (training only): the model name and the weights file
        are checked, and with pretrained weights the data settings left null follow what timm
        says the weights expect. Set values win; a mean or std unlike the weights' is logged."""
        net = cfg.model.net
        check_model_name(net.model_name)
        pretrained = net.get("pretrained") or net.get("pretrained_file")
        if pretrained and resuming(cfg.get("ckpt_path"), cfg):
            # Resuming: the checkpoint holds the weights, and the file may be gone by now.
            log.info(f"Resuming from {cfg.ckpt_path}: the weights come from it.")
            for key in ("pretrained", "pretrained_file"):
                if key in net:
                    net[key] = None
        elif net.get("pretrained_file"):
            weights_file(net.pretrained_file)
        if pretrained:
            fill_data_settings(cfg.data, net.model_name)


def fill_data_settings(data: DictConfig, model_name: str) -> None:
    """The null ones of data.image_size, mean, std (channels with them), interpolation, from the
    weights of `model_name`; only the keys the datamodule has (in-memory datasets: none)."""
    expected = data_config(model_name)
    mean, std = list(expected["mean"]), list(expected["std"])
    if data.get("channels") == 1:  # gray images: the channels' average
        mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
    weights = {
        "image_size": expected["input_size"][1],
        "mean": mean,
        "std": std,
        "interpolation": expected["interpolation"],
    }
    filled = {}
    for key, value in weights.items():
        if key in data and data[key] is None:
            data[key] = filled[key] = value
    if "mean" in filled and "channels" in data and data.channels is None:
        data.channels = filled["channels"] = len(mean)  # gray images as RGB, as the weights see
    if filled:
        settings = ", ".join(f"data.{k}={v}" for k, v in filled.items())
        log.info(f"From the weights of {model_name}: {settings} (set them to choose others).")
    given = {k: list(data[k]) for k in ("mean", "std") if k in data and k not in filled}
    if given and not all(_close(given[k], weights[k]) for k in given):
        log.warning(
            f"data.mean={given.get('mean')}, data.std={given.get('std')} normalize otherwise than "
            f"the weights of {model_name} were trained (mean={mean}, std={std}): leave them null "
            f"to use the weights' own."
        )


def _summary(err: Exception) -> str:
    """The gist of another library's message, on one line."""
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a, b, strict=True)
    )


def check_covered(backbone: nn.Module, path: Path, model_name: str) -> None:
    """timm loads a weights file without complaint when its names are another model's (it keeps
    the rest randomly initialized): refuse a file that lacks tensors of the backbone."""
    from timm.models import load_state_dict

    given = load_state_dict(str(path))  # as timm read it: EMA weights, `module.` prefixes
    wanted = [k for k in backbone.state_dict() if not k.endswith("num_batches_tracked")]
    missing = [k for k in wanted if k not in given]
    if missing:
        raise UserError(
            f"model.net.pretrained_file={path} does not hold the weights of {model_name}: "
            f"{len(missing)} of its {len(wanted)} tensors are missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}). Save the weights of the same timm model "
            f"(docs/models.md, A local weights file)."
        )


def resuming(ckpt_path: str | None, cfg: DictConfig) -> bool:
    """Whether the run goes on from a checkpoint (`last`: when its run folder has one)."""
    if ckpt_path != "last":
        return ckpt_path is not None
    return any(Path(cfg.paths.output_dir, "checkpoints").glob("last*.ckpt"))
