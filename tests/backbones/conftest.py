"""What the backbone tests share: a tiny timm model's weights in a local file (no download
here), and RGB photos of 128 px whose class is their colour."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("timm", reason='model=timm needs timm: pip install -e ".[timm]"')

MODEL = "test_resnet"  # timm's own tiny ResNet for tests: ~0.4 M parameters
COLOURS = {"blue": (40, 40, 200), "green": (40, 200, 40), "red": (200, 40, 40)}


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> Path:
    """A .safetensors file of the backbone's weights, as docs/models.md says to save one."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / f"{MODEL}.safetensors"
    save_file(timm.create_model(MODEL, num_classes=0).state_dict(), path)
    return path


def write_colour_folder(root: Path, train: int = 12, test: int = 4, size: int = 128) -> Path:
    """`root/{train,test}/<colour>/<n>.png`: noisy images of one colour each."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for name, rgb in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = rng.normal(rgb, 40, (size, size, 3)).clip(0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return root


@pytest.fixture(scope="session")
def colour_images(tmp_path_factory) -> Path:
    return write_colour_folder(tmp_path_factory.mktemp("colours") / "images")


@pytest.fixture(scope="session")
def timm_args():
    """Overrides for a seconds-long CPU run of model=timm on an image folder, at 128 px."""
    return _timm_args


def _timm_args(images: Path, *extra: str) -> list[str]:
    return [
        "model=timm",
        f"model.net.model_name={MODEL}",
        "data=image_folder",
        f"data.root={images}",
        "data.image_size=128",
        "data.num_workers=0",
        "data.batch_size=6",
        "model.optimizer.lr=0.01",  # a few steps to learn the colours in
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "logger=none",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        *extra,
    ]
