"""`trainer=`: the GPU settings of `trainer=gpu`, the CPU ones left as they were, the matmul
precision set before the Trainer is built, and precisions a machine cannot run refused."""

import pytest
import torch
from helpers import compose_config

from litforge.checks import check_config, check_precision
from litforge.errors import UserError
from litforge.pipeline import build_trainer


@pytest.fixture
def matmul_precision():
    """torch's float32 matmul precision put back after the test (it is process-wide)."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_gpu_settings(tmp_path):
    trainer = compose_config("train", tmp_path, ["trainer=gpu"]).trainer
    assert (trainer.accelerator, trainer.precision) == ("gpu", "bf16-mixed")
    assert (trainer.float32_matmul_precision, trainer.benchmark) == ("high", True)


@pytest.mark.parametrize("option", ["default", "cpu"])
def test_cpu_settings_leave_torch_as_it_is(tmp_path, matmul_precision, option):
    torch.set_float32_matmul_precision("highest")
    cfg = compose_config("train", tmp_path, [f"trainer={option}", "trainer.accelerator=cpu"])
    trainer = build_trainer(cfg)
    assert trainer.precision == "32-true" and cfg.trainer.benchmark is None
    assert torch.get_float32_matmul_precision() == "highest"


def test_matmul_precision_is_set_before_the_trainer_is_built(tmp_path, matmul_precision):
    overrides = ["trainer.accelerator=cpu", "trainer.float32_matmul_precision=medium"]
    build_trainer(compose_config("train", tmp_path, overrides))  # not a Trainer argument
    assert torch.get_float32_matmul_precision() == "medium"


def test_unknown_matmul_precision_is_refused(tmp_path):
    cfg = compose_config("train", tmp_path, ["trainer.float32_matmul_precision=tf32"])
    with pytest.raises(UserError, match="float32_matmul_precision=tf32: must be one of: highest"):
        check_config(cfg)


def test_bf16_on_a_gpu_without_bf16_units_asks_for_16_mixed(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    cfg = compose_config("train", tmp_path, ["trainer=gpu"])
    with pytest.raises(
        UserError, match=r"\(Tesla T4\) has no bfloat16 .* trainer.precision=16-mixed"
    ):
        check_precision(cfg)
