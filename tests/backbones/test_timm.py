"""`model=timm` (litforge/backbones/timm.py): the network follows the data, its weights come from
a local file that must fit it, and with pretrained weights the data settings follow them."""

import logging
import sys

import pytest
import torch
from helpers import assert_option_builds, compose_config

from litforge.backbones.timm import TimmNet
from litforge.errors import UserError
from litforge.models import ClassificationModule
from litforge.pipeline import prepare_run

MODEL = "test_resnet"


def backbone_parameters(net: TimmNet) -> dict[str, torch.Tensor]:
    return {k: v for k, v in net.backbone.state_dict().items() if "num_batches" not in k}


@pytest.mark.parametrize(("shape", "classes"), [((1, 28, 28), 10), ((3, 128, 128), 3)])
def test_input_channels_and_classes_follow_the_data(shape, classes, weights):
    for net in (
        TimmNet(shape, classes, MODEL),
        TimmNet(shape, classes, MODEL, pretrained_file=weights),
    ):
        assert net(torch.randn(2, *shape)).shape == (2, classes)
        assert net.backbone.conv1[0].in_channels == shape[0]


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_weights_file_loads_exactly_its_weights(tmp_path, weights, suffix):
    from safetensors.torch import load_file

    saved = load_file(weights)
    path = weights
    if suffix == ".pth":
        path = tmp_path / "weights.pth"
        torch.save(saved, path)
    net = TimmNet((3, 64, 64), 5, MODEL, pretrained_file=str(path))
    loaded = backbone_parameters(net)
    assert loaded.keys() <= saved.keys()
    for name, value in loaded.items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(  # not what a fresh model would have by chance
        backbone_parameters(TimmNet((3, 64, 64), 5, MODEL))["conv1.0.weight"],
        loaded["conv1.0.weight"],
    )


def test_an_unknown_model_name_is_refused_with_the_nearest_names():
    with pytest.raises(
        UserError, match=r"model_name=test_resnt is not a timm model: did you mean "
    ):
        TimmNet((3, 32, 32), 2, "test_resnt")
    with pytest.raises(
        UserError, match=r"test_resnet\.foo: .* Its weights: test_resnet\.r160_in1k"
    ):
        TimmNet((3, 32, 32), 2, "test_resnet.foo")


def test_a_missing_weights_file_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"pretrained_file=.*nowhere\.safetensors: no such file"):
        TimmNet((3, 32, 32), 2, MODEL, pretrained_file=str(tmp_path / "nowhere.safetensors"))
    text = tmp_path / "notes.pth"
    text.write_text("not weights at all\n")
    with pytest.raises(UserError, match=r"notes\.pth is not a weights file \(neither safetensors"):
        TimmNet((3, 32, 32), 2, MODEL, pretrained_file=str(text))
    for reading in ("checkpoint_path", "pretrained_cfg_overlay"):  # only pretrained_file reads
        with pytest.raises(UserError, match=f"model.net.{reading}: TimmNet reads weights only"):
            TimmNet((3, 32, 32), 2, MODEL, **{reading: str(text)})
    pickled = tmp_path / "pickled.pth"  # a whole module, not its tensors: weights_only refuses it
    torch.save({"model": torch.nn.Linear(2, 2)}, pickled)
    with pytest.raises(UserError, match=r"pickled\.pth holds Python objects besides tensors"):
        TimmNet((3, 32, 32), 2, MODEL, pretrained_file=str(pickled))


def test_a_file_of_another_models_weights_is_refused(tmp_path):
    """timm itself would load it, keeping the backbone random where names differ."""
    import timm
    from safetensors.torch import save_file

    foreign = tmp_path / "vit.safetensors"
    save_file(timm.create_model("test_vit", num_classes=0).state_dict(), foreign)
    with pytest.raises(UserError) as err:
        TimmNet((3, 32, 32), 2, MODEL, pretrained_file=str(foreign))
    message = str(err.value)
    assert f"{foreign} does not hold the weights of {MODEL}" in message
    assert "conv1.0.weight" in message and "\n" not in message


def test_a_file_of_fewer_weights_is_refused(tmp_path, weights):
    from safetensors.torch import load_file, save_file

    partial = {k: v for k, v in load_file(weights).items() if not k.startswith("layer4.")}
    save_file(partial, tmp_path / "partial.safetensors")
    with pytest.raises(UserError, match=r"missing \(layer4\.0\."):
        TimmNet((3, 32, 32), 2, MODEL, pretrained_file=str(tmp_path / "partial.safetensors"))


def test_no_hub_offline_says_to_use_a_local_file(monkeypatch):
    import huggingface_hub.constants
    from helpers import go_offline

    go_offline(monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no retries
    with pytest.raises(UserError, match=r"could not be fetched .*set model\.net\.pretrained_file="):
        TimmNet((3, 32, 32), 2, MODEL, pretrained=True)


def test_without_timm_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    with pytest.raises(UserError, match=r'needs timm .*pip install -e "\.\[timm\]"'):
        TimmNet((3, 32, 32), 2, MODEL)


def test_backbone_lr_scale_gives_the_backbone_its_own_learning_rate():
    module = ClassificationModule(
        net={"_target_": "litforge.backbones.timm.TimmNet", "model_name": MODEL},
        input_shape=(3, 32, 32),
        num_classes=3,
        optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01},
        backbone_lr_scale=0.1,
    )
    head, backbone = module.configure_optimizers()["optimizer"].param_groups
    assert (head["lr"], backbone["lr"]) == pytest.approx((0.01, 0.001))
    assert {id(p) for p in backbone["params"]} == {id(p) for p in module.net.backbone.parameters()}
    assert {id(p) for p in head["params"]} == {id(p) for p in module.net.head.parameters()}


def test_the_checkpoint_keeps_no_weights_file_name(weights):
    module = ClassificationModule(
        net={
            "_target_": "litforge.backbones.timm.TimmNet",
            "model_name": MODEL,
            "pretrained": True,
            "pretrained_file": str(weights),
        },  # fmt: skip
        input_shape=(3, 32, 32),
        num_classes=3,
        optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01},
    )
    assert module.hparams.net == {
        "_target_": "litforge.backbones.timm.TimmNet",
        "model_name": MODEL,
    }


# --- data settings from the weights (TimmNet.prepare_run, before the datamodule is built) ----


def configured(tmp_path, *overrides: str):
    cfg = compose_config(
        "train", tmp_path, ["model=timm", f"model.net.model_name={MODEL}", *overrides]
    )
    prepare_run(cfg)
    return cfg


def test_null_data_settings_follow_the_weights(tmp_path, weights, caplog):
    with caplog.at_level(logging.INFO, logger="litforge.backbones.timm"):
        cfg = configured(
            tmp_path, "data=image_folder", "data.root=x", f"model.net.pretrained_file={weights}"
        )
    assert (cfg.data.image_size, cfg.data.channels) == (160, 3)  # test_resnet's r160_in1k
    assert (list(cfg.data.mean), list(cfg.data.std)) == ([0.5] * 3, [0.5] * 3)
    [line] = [r.getMessage() for r in caplog.records if "From the weights" in r.getMessage()]
    assert "data.image_size=160" in line and "data.mean=[0.5, 0.5, 0.5]" in line


def test_set_data_settings_win_and_another_normalization_is_logged(tmp_path, weights, caplog):
    with caplog.at_level(logging.INFO, logger="litforge.backbones.timm"):
        cfg = configured(
            tmp_path,
            "data=image_folder",
            "data.root=x",
            "data.image_size=128",
            "data.mean=[0.4,0.4,0.4]",
            "data.std=[0.2,0.2,0.2]",
            "model.net.pretrained=true",
        )
    assert cfg.data.image_size == 128 and list(cfg.data.mean) == [0.4] * 3
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "data.mean=[0.4, 0.4, 0.4], data.std=[0.2, 0.2, 0.2]" in warning
    assert "mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5]" in warning


def test_gray_images_get_the_weights_normalization_averaged(tmp_path, weights):
    cfg = configured(
        tmp_path, "data=image_folder", "data.root=x", "data.channels=1", "model.net.pretrained=true"
    )
    assert (cfg.data.channels, list(cfg.data.mean), list(cfg.data.std)) == (1, [0.5], [0.5])


def test_the_interpolation_follows_the_weights_too(tmp_path):
    cfg = configured(tmp_path, "data=image_folder", "data.root=x", "model.net.pretrained=true")
    assert cfg.data.interpolation == "bilinear"  # test_resnet's; resnet18's: bicubic
    cfg = configured(
        tmp_path,
        "data=image_folder",
        "data.root=x",
        "data.interpolation=nearest",
        "model.net.pretrained=true",
    )
    assert cfg.data.interpolation == "nearest"


def test_from_scratch_and_in_memory_data_keep_their_settings(tmp_path):
    cfg = configured(tmp_path, "data=image_folder", "data.root=x")  # not pretrained
    assert cfg.data.image_size is None and cfg.data.mean is None
    before = compose_config("train", tmp_path, ["data=fashion_mnist"]).data
    cfg = configured(tmp_path, "data=fashion_mnist", "model.net.pretrained=true")  # no such keys
    assert cfg.data == before


def test_a_resumed_run_needs_no_weights_file(tmp_path):
    gone = tmp_path / "gone.safetensors"
    cfg = configured(
        tmp_path,
        "data=image_folder",
        "data.root=x",
        f"model.net.pretrained_file={gone}",
        f"ckpt_path={tmp_path / 'last.ckpt'}",
    )
    assert cfg.model.net.pretrained_file is None and not cfg.model.net.pretrained
    assert cfg.data.image_size == 160  # the same data settings as the run it resumes


def test_the_checks_run_before_any_data_is_read(tmp_path):
    with pytest.raises(UserError, match="model_name=resnet_18 is not a timm model"):
        configured(tmp_path, "model.net.model_name=resnet_18")
    with pytest.raises(UserError, match="no such file"):
        configured(tmp_path, f"model.net.pretrained_file={tmp_path / 'w.pth'}")


@pytest.mark.parametrize(
    "overrides",
    [["model=timm"], ["callbacks=freeze_backbone"], ["callbacks=[default,ema]"]],
    ids=["model=timm", "callbacks=freeze_backbone", "callbacks=ema"],
)
def test_the_options_compose_resolve_and_build(tmp_path, overrides):
    assert_option_builds(tmp_path, overrides)


def test_timm_is_imported_only_when_a_network_needs_it():
    import subprocess

    code = "import sys, litforge.pipeline, litforge.backbones.timm, litforge.backbones.finetuning\n"
    code += "print('timm' in sys.modules)"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert found.stdout.strip() == "False", found.stderr[-2000:]
