"""litforge/deploy/inference.py: what predict.py, export.py and serve.py load a model with."""

import pytest
from helpers import CRAFTED, REFUSED, crafted_checkpoint, write_cnn_checkpoint

from litforge.deploy.inference import load_classifier
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
