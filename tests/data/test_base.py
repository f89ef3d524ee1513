"""What the pipeline asks of a datamodule: `ImageClassificationData`, which a plain
LightningDataModule of a user's own meets (docs/data.md, "A datamodule of your own")."""

from pathlib import Path

import lightning as L
import pytest
from helpers import BandPhotos, compose_config

from litforge.data.base import ImageClassificationData, model_arguments
from litforge.errors import UserError
from litforge.pipeline import train


def test_a_plain_lightning_datamodule_of_128px_photos_trains_through_the_pipeline(tmp_path):
    assert isinstance(BandPhotos(), ImageClassificationData)
    cfg = compose_config(
        "train",
        tmp_path,
        [
            "~data",
            "+data={_target_:helpers.BandPhotos,size:128}",
            "model.net.hidden_sizes=[32]",
            "trainer.max_epochs=3",
            "trainer.accelerator=cpu",
        ],
    )
    metrics = train(cfg)
    assert metrics["test/acc"] > 0.9
    assert (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").is_file()
    arguments = model_arguments(BandPhotos())
    assert arguments["input_shape"] == (3, 128, 128) and arguments["num_classes"] == 3


def test_a_datamodule_without_what_the_pipeline_reads_is_one_line(tmp_path):
    class Bare(L.LightningDataModule):
        class_names = ("a", "b")

    with pytest.raises(UserError, match="Bare has no input_shape, mean, std: the pipeline"):
        model_arguments(Bare())
