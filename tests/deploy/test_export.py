"""`python export.py ckpt_path=... format=onnx|pt2`: files that run without litforge (uint8 images
in, logits out) and compute what the checkpoint computes."""

import json

import numpy as np
import pytest
import torch
from helpers import compose_config, write_cnn_checkpoint

from litforge.deploy.export import export
from litforge.errors import UserError


def png_test_images(trained_images) -> tuple[np.ndarray, list[int]]:
    """The PNG test images as a caller without litforge prepares them from model.json's contract
    (20×24 files: the shorter side is 20 already; the central 20×20 kept), and their places in
    `trained_images.test_files`."""
    from PIL import Image

    places = [i for i, p in enumerate(trained_images.test_files) if p.suffix == ".png"]
    images = [
        np.asarray(Image.open(trained_images.test_files[i]).convert("RGB"))[:, 2:22] for i in places
    ]
    return np.stack(images).transpose(0, 3, 1, 2).copy(), places


def check_against_the_checkpoint(logits: np.ndarray, trained_images, places: list[int]) -> None:
    probabilities = torch.as_tensor(logits).detach().softmax(dim=1)
    expected = trained_images.probabilities[places]
    torch.testing.assert_close(probabilities, expected, atol=1e-5, rtol=0)


def test_onnx_file_runs_in_onnxruntime_alone_and_equals_the_checkpoint(
    exported_onnx, trained_images
):
    import onnx
    import onnxruntime

    contract = json.loads((exported_onnx.parent / "model.json").read_text())
    assert contract["input"]["dtype"] == "uint8"
    assert contract["input"]["shape"] == ["batch", 3, 20, 20]
    assert contract["class_names"] == trained_images.class_names
    assert contract["check"]["max_abs_logit_difference"] <= 1e-4
    assert contract["check"]["same_top_class"] == 1.0
    properties = {p.key: p.value for p in onnx.load(exported_onnx).metadata_props}
    assert json.loads(properties["litforge"])["class_names"] == trained_images.class_names

    session = onnxruntime.InferenceSession(exported_onnx, providers=["CPUExecutionProvider"])
    images, places = png_test_images(trained_images)
    (logits,) = session.run(None, {"images": images})  # the whole batch
    check_against_the_checkpoint(logits, trained_images, places)
    (one,) = session.run(None, {"images": images[:1]})  # and one image: the batch size is free
    check_against_the_checkpoint(one, trained_images, places[:1])


def test_pt2_file_runs_in_plain_torch_and_equals_the_checkpoint(exported_pt2, trained_images):
    extra = {"litforge": ""}
    program = torch.export.load(exported_pt2, extra_files=extra)
    assert json.loads(extra["litforge"])["input"]["shape"] == ["batch", 3, 20, 20]
    images, places = png_test_images(trained_images)
    model = program.module()
    check_against_the_checkpoint(model(torch.from_numpy(images)), trained_images, places)
    one = model(torch.from_numpy(images[:1]))
    check_against_the_checkpoint(one, trained_images, places[:1])
    assert json.loads((exported_pt2.parent / "model.json").read_text())["format"] == "pt2"


def test_export_beyond_the_tolerance_fails_and_leaves_no_file(
    tmp_path, trained_images, monkeypatch
):
    # An exporter that translated an operator wrongly: the check sees other logits.
    monkeypatch.setattr("litforge.deploy.export.compare", lambda *models: (0.5, 0.75))
    overrides = [f"ckpt_path={trained_images.checkpoint}", "format=onnx"]
    with pytest.raises(UserError, match=r"other logits .*5\.00e-01 > export\.tolerance=0\.0001"):
        export(compose_config("export", tmp_path, overrides))
    left = {p.name for p in (tmp_path / "run").iterdir()}
    assert not left & {"model.onnx", "model.json", ".export-partial"}, left


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "no checkpoint given: add ckpt_path="),
        (["ckpt_path=a.ckpt", "format=tflite"], "format=tflite: must be one of: onnx, pt2."),
        (["ckpt_path=model.onnx"], "an exported model already"),
        (["ckpt_path=a.ckpt", "export.tolerance=0"], r"export\.tolerance=0: must be > 0\."),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        export(compose_config("export", tmp_path, overrides))


@pytest.mark.parametrize("file_format", ["onnx", "pt2"])
def test_a_mirror_averaging_network_exports_its_averaging(tmp_path, file_format):
    checkpoint = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 128, mirror_average=True)
    path = export(
        compose_config("export", tmp_path, [f"ckpt_path={checkpoint}", f"format={file_format}"])
    )
    assert json.loads((path.parent / "model.json").read_text())["check"]["same_top_class"] == 1.0
    images = torch.randint(0, 256, (3, 3, 128, 128), dtype=torch.uint8)
    if file_format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        logits, mirrored = (
            session.run(None, {"images": x.numpy()})[0] for x in (images, images.flip(3))
        )
    else:
        model = torch.export.load(path).module()
        logits, mirrored = (model(x).detach().numpy() for x in (images, images.flip(3)))
    np.testing.assert_allclose(logits, mirrored, atol=1e-4)


def test_pt2_export_of_a_channels_last_model_warns_of_nothing(tmp_path):
    """torch.export.save warns about each non-contiguous weight (channels_last convolutions),
    a warning for weights on a GPU that export.py has no use for (export_pt2)."""
    import warnings

    checkpoint = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 128)  # channels_last, as trained
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        export(compose_config("export", tmp_path, [f"ckpt_path={checkpoint}", "format=pt2"]))
    assert not [str(w.message) for w in said if "complete tensor" in str(w.message)]
