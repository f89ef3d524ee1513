"""The proof on real data (benchmarks/few_shot.py): a timm network pretrained by hand on
Fashion-MNIST classes 0-4, fine-tuned through litforge on 30 images per class of classes 5-9,
beats the same network trained from scratch on them."""

import importlib.util

import pytest
from helpers import NO_FASHION_MNIST, ROOT, fashion_mnist_dir


def few_shot():
    spec = importlib.util.spec_from_file_location("few_shot", ROOT / "benchmarks" / "few_shot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason=NO_FASHION_MNIST)
def test_pretrained_backbone_beats_scratch_on_a_few_shot_folder(tmp_path):
    # Shorter pretraining than the script's default (30 k images, 3 epochs: 0.842 vs 0.752).
    args = ["--pretrain-images", "10000", "--pretrain-epochs", "2", "--work-dir", str(tmp_path)]
    results = few_shot().main(args)
    assert results["pretrained"] > results["scratch"] + 0.05, results
    assert results["pretrained"] > 0.8, results  # 5 classes: chance is 0.2
    assert (tmp_path / "test_resnet-classes0-4.pth").is_file()
