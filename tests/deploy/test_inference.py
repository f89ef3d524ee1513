"""litforge/deploy/inference.py: what predict.py, export.py and serve.py load a model with."""

import pytest
import torch
from helpers import CRAFTED, REFUSED, crafted_checkpoint, photo, write_cnn_checkpoint

from litforge.data.images import decode, fit
from litforge.deploy.inference import InputContract, load_classifier
from litforge.errors import UserError


@pytest.mark.parametrize("craft", CRAFTED)
def test_a_checkpoint_builds_only_listed_networks(tmp_path, craft):
    """A checkpoint is data: what its configs name is checked before anything is called (here:
    nothing made in `made/`)."""
    trained = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 32)
    path, made = crafted_checkpoint(trained, craft, tmp_path)
    with pytest.raises(UserError, match=REFUSED):
        load_classifier(path)
    assert not any(made.iterdir())


def test_new_images_are_resized_with_the_interpolation_training_used(tmp_path):
    path = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 128)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["datamodule_hyper_parameters"] = {"interpolation": "nearest"}  # data.interpolation
    torch.save(checkpoint, path)
    contract = load_classifier(path).contract
    data = photo(0, width=300, height=200)
    decoded = decode(data, 3)
    assert torch.equal(contract.prepare(data), fit(decoded, 128, "nearest"))
    assert not torch.equal(contract.prepare(data), fit(decoded, 128, "bilinear"))
    assert InputContract.from_dict(contract.to_dict()) == contract  # what export.py writes

    checkpoint["datamodule_hyper_parameters"] = {"interpolation": "lanczos"}
    torch.save(checkpoint, path)
    with pytest.raises(UserError, match="interpolation='lanczos' is none of"):
        load_classifier(path)
