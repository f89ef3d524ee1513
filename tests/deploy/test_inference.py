"""litforge/deploy/inference.py: what predict.py, export.py and serve.py load a model with."""

import pytest
import torch
from helpers import (
    CRAFTED,
    LEGACY_CRAFTS,
    REFUSED,
    compose_config,
    crafted_checkpoint,
    free_port,
    photo,
    write_cnn_checkpoint,
)

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


@pytest.mark.parametrize("entry", ["predict.py", "export.py", "serve.py"])
@pytest.mark.parametrize(("under", "craft"), LEGACY_CRAFTS)
def test_settings_under_lightnings_other_keys_are_checked_alike(
    tmp_path, monkeypatch, under, craft, entry
):
    """What Lightning's loading also takes from the legacy keys `hparams` and
    `module_arguments`, or as one argument named by `hparams_name`, is checked before anything
    is built, by each command that reads a checkpoint."""
    from litforge.deploy import serve as serve_module
    from litforge.deploy.export import export
    from litforge.deploy.predict import predict
    from litforge.deploy.serve import serve

    def loaded(contract):  # what serve.py does once the model loaded: no server started here
        raise AssertionError("the crafted checkpoint loaded")

    monkeypatch.setattr(serve_module, "_warm_up", loaded)

    trained = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 32)
    path, made = crafted_checkpoint(trained, craft, tmp_path, under=under)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(photo(0, 64, 48))
    command, run = {"predict.py": ("predict", predict), "export.py": ("export", export)}.get(
        entry, ("serve", serve)
    )
    extra = {"predict": [f"input={tmp_path / 'images'}"], "serve": [f"server.port={free_port()}"]}
    extra = extra.get(command, [])
    with pytest.raises(UserError, match=REFUSED):
        run(compose_config(command, tmp_path / command, [f"ckpt_path={path}", *extra]))
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
