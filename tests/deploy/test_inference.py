"""litforge/deploy/inference.py: what predict.py, export.py and serve.py load a model with."""

import json
from pathlib import Path

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


def with_metadata(exported: Path, folder: Path, change) -> Path:
    """A copy of the export `exported` in `folder`, its litforge metadata edited by `change` and
    its graph untouched: what a bundle put together by hand, or altered, holds."""
    folder.mkdir()
    if exported.suffix == ".onnx":
        import onnx

        model = onnx.load(exported)
        entry = next(p for p in model.metadata_props if p.key == "litforge")
        metadata = json.loads(entry.value)
        change(metadata)
        entry.value = json.dumps(metadata)
        onnx.save(model, folder / exported.name)
    else:
        extra = {"litforge": ""}
        program = torch.export.load(exported, extra_files=extra)
        metadata = json.loads(extra["litforge"])
        change(metadata)
        torch.export.save(
            program, folder / exported.name, extra_files={"litforge": json.dumps(metadata)}
        )
    return folder / exported.name


def set_shape(channels: int, size: int):
    return lambda metadata: metadata["input"].update(shape=["batch", channels, size, size])


@pytest.mark.parametrize("file_format", ["onnx", "pt2"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            set_shape(3, 224),
            r"metadata says 3x224x224 images and 3 classes, but its graph takes 3x20x20 images",
        ),
        (set_shape(1, 20), r"metadata says 1x20x20 images .* graph takes 3x20x20 images"),
        (
            lambda metadata: metadata["class_names"].extend(["d", "e"]),
            r"metadata says 3x20x20 images and 5 classes, but its graph .* gives 3 scores",
        ),
        # Bounded before the graph is even compared: nothing is fitted to it.
        (set_shape(3, 8000), r"metadata says images of 8000 px, more than the 4096 px"),
        (
            set_shape(4, 20),
            r"metadata says images of 4 channels: litforge prepares 1 \(gray\) or 3",
        ),
        (
            lambda metadata: metadata["input"].update(shape=["batch", 3, 20, 8000]),
            "metadata says non-square 20x8000 images",
        ),
    ],
)
def test_metadata_the_graph_contradicts_is_refused(tmp_path, request, file_format, change, message):
    """A bundle's metadata says how images are prepared; the graph is what runs. A model.onnx whose
    metadata said 8000 px had predict.py resize an image to 8000² before onnxruntime failed."""
    exported = request.getfixturevalue(f"exported_{file_format}")
    path = with_metadata(exported, tmp_path / "bundle", change)
    with pytest.raises(UserError, match=message) as refused:
        load_classifier(path, key="model_path")
    assert str(refused.value).startswith(f"model_path={path}: ")
    assert "export it again with export.py" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_unaltered_export_loads_with_its_contract(exported_onnx, exported_pt2):
    for path in (exported_onnx, exported_pt2):
        model = load_classifier(path, key="model_path")
        assert (model.contract.channels, model.contract.size) == (3, 20)
        assert model.class_names == ["a", "b", "c"]


@pytest.mark.parametrize("name", ["notes.txt", "last.ckpt"])
def test_model_path_takes_only_exported_files(tmp_path, name):
    path = tmp_path / name
    path.write_text("not a model")
    with pytest.raises(UserError, match=f"model_path={path} is neither a .onnx nor a .pt2 file"):
        load_classifier(path, key="model_path")


def test_an_export_whose_metadata_contradicts_its_graph_predicts_nothing(tmp_path, exported_onnx):
    """model.json's size is checked against the graph before any image is fitted to it."""
    from litforge.deploy.predict import predict

    bundle = with_metadata(exported_onnx, tmp_path / "bundle", set_shape(3, 224))
    (tmp_path / "photo.jpg").write_bytes(photo(0))  # 640x480
    overrides = [f"model_path={bundle}", f"input={tmp_path / 'photo.jpg'}"]
    with pytest.raises(UserError, match="its graph takes 3x20x20 images"):
        predict(compose_config("predict", tmp_path, overrides))
    assert not list((tmp_path / "run").glob("predictions.csv*"))
