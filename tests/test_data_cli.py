"""`python -m litforge.data fetch NAME`: pre-fetch a dataset, or say how to get it."""

import subprocess

from helpers import go_offline, run_in_process, write_idx_dataset

from litforge.data import __main__ as data_cli


def fetch(*args):
    return run_in_process("-m", "litforge.data", "fetch", *args)


def test_fetch_reports_where_the_files_are(tmp_path, monkeypatch):
    write_idx_dataset(tmp_path / "mnist", n_train=10, n_test=10)
    go_offline(monkeypatch)
    result = fetch("mnist", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"mnist: files in {tmp_path / 'mnist'}"


def test_fetch_offline_fails_with_the_places_tried(tmp_path, monkeypatch):
    go_offline(monkeypatch)
    result = fetch("mnist", "--data-dir", str(tmp_path / "d"), "--system-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.startswith("error: dataset 'mnist' not found")
    assert "Traceback" not in result.stderr


def test_unknown_dataset_is_named():
    result = fetch("imagenet")
    assert result.returncode == 1
    assert "unknown dataset 'imagenet'" in result.stderr


def test_apt_fallback_prints_the_command_when_not_root(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data_cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(data_cli.os, "geteuid", lambda: 1000)
    source = data_cli.builtin_datamodule("fashion_mnist").source
    assert data_cli.install_debian_package(source) is False
    assert "sudo apt-get install -y dataset-fashion-mnist" in capsys.readouterr().out


def test_apt_fallback_installs_as_root_and_says_so(monkeypatch, capsys):
    commands = []

    def fake_run(command, **kwargs):  # records instead of touching the machine's packages
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(data_cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(data_cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(data_cli.subprocess, "run", fake_run)
    assert (
        data_cli.install_debian_package(data_cli.builtin_datamodule("fashion_mnist").source) is True
    )
    assert commands == [["apt-get", "install", "-y", "-q", "dataset-fashion-mnist"]]
    assert "installing Debian's package dataset-fashion-mnist" in capsys.readouterr().out


def test_datasets_without_a_debian_package_skip_apt(monkeypatch):
    monkeypatch.setattr(data_cli.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert data_cli.install_debian_package(data_cli.builtin_datamodule("mnist").source) is False
