"""`python -m litforge.data_tools`: fetch a built-in dataset before training (or say how to get
it), and write one out as an image folder."""

import subprocess

from helpers import go_offline, run_in_process, write_idx_dataset

from litforge.data_tools import __main__ as data_cli


def data_tools(*args):
    return run_in_process("-m", "litforge.data_tools", *args)


def test_fetch_reports_where_the_files_are(tmp_path, monkeypatch):
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=10, n_test=10)
    go_offline(monkeypatch)
    result = data_tools("fetch", "mnist", "--root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"mnist: files in {tmp_path / 'MNIST' / 'raw'}"


def test_fetch_offline_fails_in_one_line_leaving_nothing(tmp_path, monkeypatch):
    go_offline(monkeypatch)
    result = data_tools("fetch", "mnist", "--root", str(tmp_path / "d"))
    assert result.returncode == 1
    assert result.stderr.startswith("error: mnist not found in ")
    assert "its download failed" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()


def test_unknown_dataset_is_named():
    result = data_tools("fetch", "imagenet")
    assert result.returncode == 1
    assert "unknown dataset 'imagenet'" in result.stderr


def test_export_images_writes_each_split_and_class_as_png(tmp_path, monkeypatch):
    from PIL import Image

    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=30, n_test=10)
    go_offline(monkeypatch)
    target = tmp_path / "images"
    result = data_tools("export-images", "mnist", str(target), "--root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    pictures = sorted(target.glob("*/*/*.png"))
    assert len(pictures) == 40 and {p.parts[-3] for p in pictures} == {"train", "test"}
    with Image.open(pictures[0]) as image:
        assert image.size == (28, 28) and image.mode == "L"
    assert not target.with_name("images.partial").exists()
    again = data_tools("export-images", "mnist", str(target), "--root", str(tmp_path))
    assert again.returncode == 1 and "exists and is not empty" in again.stderr


def test_apt_prints_the_command_when_not_root(monkeypatch, capsys):
    monkeypatch.setattr(data_cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(data_cli.os, "geteuid", lambda: 1000)
    assert data_cli.install_debian_package("dataset-fashion-mnist") is False
    assert "sudo apt-get install -y dataset-fashion-mnist" in capsys.readouterr().out


def test_apt_installs_as_root_and_says_so(monkeypatch, capsys):
    commands = []

    def fake_run(command, **kwargs):  # records instead of touching the machine's packages
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(data_cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(data_cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(data_cli.subprocess, "run", fake_run)
    assert data_cli.install_debian_package("dataset-fashion-mnist") is True
    assert commands == [["apt-get", "install", "-y", "-q", "dataset-fashion-mnist"]]
    assert "Installing Debian's package dataset-fashion-mnist" in capsys.readouterr().out


def test_fetch_asks_apt_only_for_a_dataset_debian_packages(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(data_cli, "install_debian_package", asked.append)
    write_idx_dataset(tmp_path / "MNIST" / "raw", n_train=10, n_test=10)
    go_offline(monkeypatch)
    data_cli.fetch("mnist", str(tmp_path), apt=True)
    assert asked == []
