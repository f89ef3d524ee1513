"""What the pipeline asks of a datamodule: `ImageClassificationData`, which a plain
LightningDataModule of a user's own meets (docs/data.md, "A datamodule of your own")."""

from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import BandPhotos, compose_config

from litforge.data.base import ImageClassificationData, model_arguments
from litforge.errors import UserError
from litforge.pipeline import evaluate, train


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


@pytest.mark.slow  # (DataLoader workers)
def test_the_datamodule_docs_data_md_shows_trains_on_a_folder_of_photos(tmp_path, monkeypatch):
    """The example of docs/data.md, as written, on 160x120 JPEG photos of three classes."""
    from helpers import ROOT, photo

    text = (ROOT / "docs" / "data.md").read_text()
    section = text.split("## A datamodule of your own", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "docs_photos.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    seeds = iter(range(1000))
    for split, count in (("train", 8), ("val", 2), ("test", 2)):
        for name in ("cat", "dog", "fox"):
            folder = tmp_path / "photos" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"{i}.jpg").write_bytes(photo(next(seeds), 160, 120))
    overrides = ["~data", f"+data={{_target_:docs_photos.MyPhotos,root:{tmp_path / 'photos'}}}"]
    overrides += ["model.net.hidden_sizes=[16]", "trainer.max_epochs=1", "trainer.accelerator=cpu"]
    cfg = compose_config("train", tmp_path / "run", overrides)
    metrics = train(cfg)
    assert "test/acc" in metrics
    checkpoint = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    assert checkpoint["hyper_parameters"]["class_names"] == ["cat", "dog", "fox"]
    # eval.py, given the same data (as the docs' command), tests the best checkpoint again.
    [best] = (Path(cfg.paths.output_dir) / "checkpoints").glob("epoch*.ckpt")
    again = evaluate(
        compose_config("eval", tmp_path / "eval", [*overrides[:2], f"ckpt_path={best}"])
    )
    assert again["test/acc"] == pytest.approx(metrics["test/acc"])
