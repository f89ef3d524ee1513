"""Test helpers: dataset files in their real on-disk formats, and Hydra configs for tmp dirs."""

from __future__ import annotations

import gzip
import hashlib
import os
import signal as signal_module
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torchvision
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.core.saving import CHECKPOINT_PAST_HPARAMS_KEYS
from omegaconf import DictConfig, open_dict

from litforge.data.cifar10 import CIFAR10DataModule

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write `array` (uint8) as an IDX file, written out by hand from the format's spec."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(">u1").tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def learnable_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28×28 images whose class is a bright horizontal band at row 2·label, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 2 * label + 4 : 2 * label + 6, 4:24] = 250
    return images, labels


def write_idx_dataset(directory: Path, n_train=600, n_test=200, gz=False) -> Path:
    """A small MNIST-format dataset (all four files) in `directory`."""
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        images, labels = learnable_images(n, seed)
        write_idx(directory / IDX_FILES[split][0], images, gz)
        write_idx(directory / IDX_FILES[split][1], labels, gz)
    return directory


def compose_config(
    name: str, tmp_path: Path, overrides: list[str] = (), keep_hydra: bool = False
) -> DictConfig:
    """Compose `conf/<name>.yaml` as `@hydra.main` would, with outputs under `tmp_path`
    (`keep_hydra`: with Hydra's own node, as a sweep composes it)."""
    from litforge.runs import register_resolvers

    register_resolvers()  # as the entry points do
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name=name,
            return_hydra_config=True,
            overrides=[
                f"hydra.run.dir={tmp_path / 'run'}",
                f"paths.root_dir={tmp_path}",
                "extras.print_config=false",
                *overrides,
            ],
        )
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")  # set by @hydra.main normally
        cfg.hydra.runtime.cwd = str(ROOT)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def pythonpath(*folders: str | Path) -> str:
    """PYTHONPATH for a child process: `folders` first, then this process's (a lean copy's CI
    run sets it to the copy's src/, which its child processes must import too)."""
    return os.pathsep.join(filter(None, [*map(str, folders), os.environ.get("PYTHONPATH")]))


def child_env(env: dict | None) -> dict[str, str]:
    """This process's environment with `env` added; a PYTHONPATH in `env` goes before this
    process's (callers pass only their own folders)."""
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    if env and "PYTHONPATH" in env:
        full_env["PYTHONPATH"] = pythonpath(env["PYTHONPATH"])
    return full_env


def run_script(
    script: str, *args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run `python <script> args...` as a user would; return the finished process."""
    full_env = child_env(env)
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_in_process(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python <script> args...` (or `python -m <package> args...`) run inside this test
    process, for single-process runs that no test signals or kills: the same entry point,
    command line and output, without another interpreter's start (~6 s of importing torch and
    Lightning on 2 cores). `env` is added to `os.environ` for the run; what Python or torch read
    only when they start (PYTHONPATH, OMP_NUM_THREADS, TORCHINDUCTOR_*) needs `run_script`.
    What a run changes in the process (the environment, the working folder, `sys.argv`,
    `sys.excepthook`, the root logger, torch's determinism flag, the SIGTERM handler) is put
    back; the root logger starts empty, as in a fresh interpreter."""
    import contextlib
    import io
    import logging
    import runpy

    import torch

    environ, argv, hook, cwd = dict(os.environ), sys.argv, sys.excepthook, os.getcwd()
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    deterministic = torch.are_deterministic_algorithms_enabled()
    on_sigterm = signal_module.getsignal(signal_module.SIGTERM)
    stdout, stderr = io.StringIO(), io.StringIO()
    status, imported_main = 0, None
    try:
        sys.argv = [script, *args] if script != "-m" else list(args)  # runpy sets argv[0]
        os.chdir(ROOT)
        os.environ.pop("HYDRA_FULL_ERROR", None)  # as run_script: the user's view
        os.environ.update(env or {})
        root.handlers = []
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                if script == "-m":  # as `python -m package`, which runs a fresh __main__
                    imported_main = sys.modules.pop(f"{args[0]}.__main__", None)
                    runpy.run_module(args[0], run_name="__main__", alter_sys=True)
                else:  # as `python script`
                    runpy.run_path(str(ROOT / script), run_name="__main__")
            except SystemExit as exit:
                status = exit.code if isinstance(exit.code, int | None) else 1
            except Exception as err:  # what the interpreter would hand its excepthook
                sys.excepthook(type(err), err, err.__traceback__)
                status = 1
    finally:
        if imported_main is not None:
            sys.modules[imported_main.__name__] = imported_main
        os.chdir(cwd)
        sys.argv, sys.excepthook = argv, hook
        os.environ.clear()
        os.environ.update(environ)
        for handler in [h for h in root.handlers if h not in root_handlers]:
            handler.close()
        root.handlers = root_handlers
        root.setLevel(root_level)
        torch.use_deterministic_algorithms(deterministic)
        signal_module.signal(signal_module.SIGTERM, on_sigterm)
    status = status or 0  # sys.exit() and sys.exit(None): success
    output = stdout.getvalue(), stderr.getvalue()
    return subprocess.CompletedProcess([script, *args], status, *output)


def run_train_killing(
    args: list[str], marker: str, rank: int | None, env: dict | None = None, timeout: float = 120
) -> tuple[int, str, dict[int, int]]:
    """Run `python train.py args`; at the first output line containing `marker`, SIGKILL the
    process it started for LOCAL_RANK `rank` (None: none), then let the run end (bounded: no
    hang until a timeout). Returns its exit status, all its output, and its processes' pids
    by local rank."""
    process = subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, children = [], {}
    for line in process.stdout:
        output.append(line)
        if marker in line:
            children = children_by_local_rank(process.pid)
            if rank is not None:
                os.kill(children[rank], signal_module.SIGKILL)
            break
    rest, _ = process.communicate(timeout=timeout)
    return process.returncode, "".join(output) + rest, children


def children_by_local_rank(pid: int) -> dict[int, int]:
    """The processes a launcher started, by their LOCAL_RANK."""
    ranks = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        local = next(v for v in environ if v.startswith(b"LOCAL_RANK="))
        ranks[int(local.split(b"=")[1])] = int(child)
    return ranks


def offline_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess in which every network connection fails (`no_network`)."""
    site = tmp_path / "offline_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import no_network\n\nno_network.disable()\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parent)])}


def go_offline(monkeypatch) -> None:
    """This test process without network (`no_network`), until the test ends."""
    import no_network

    for owner, name, replacement in no_network.REPLACEMENTS:
        monkeypatch.setattr(owner, name, replacement)


class WrittenCIFAR10(torchvision.datasets.CIFAR10):
    """torchvision's CIFAR10 whose checksum tables hold the MD5 sums of the files `write_cifar10`
    wrote (its own hold the originals'): the reading is torchvision's, unchanged."""

    def __init__(self, root: str, *args, **kwargs) -> None:
        def md5(name: str) -> str:
            path = Path(root) / self.base_folder / name
            return hashlib.md5(path.read_bytes()).hexdigest() if path.is_file() else ""

        self.train_list = [[name, md5(name)] for name, _ in self.train_list]
        self.test_list = [[name, md5(name)] for name, _ in self.test_list]
        self.meta = {**self.meta, "md5": md5(self.meta["filename"])}
        super().__init__(root, *args, **kwargs)


class WrittenCIFAR10DataModule(CIFAR10DataModule):
    """`data=cifar10 data._target_=helpers.WrittenCIFAR10DataModule`: the files `write_cifar10`
    wrote, in a subprocess too (`PYTHONPATH=tests`)."""

    dataset = WrittenCIFAR10


def write_cifar10(directory: Path, per_batch: int = 40, n_test: int = 40) -> Path:
    """A small `cifar-10-batches-py` folder in the data root `directory` (read by
    `WrittenCIFAR10`): five training batches, `test_batch` and
    `batches.meta`, pickled dicts of a uint8 N×3072 array (1024 red, 1024 green, 1024 blue values
    per image) and a list of labels, as the original files hold them."""
    import pickle

    folder = directory / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        n = n_test if name == "test_batch" else per_batch
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 80, (n, 3, 32, 32)).astype(np.uint8)
        for i, label in enumerate(labels):  # class = which of ten bands is bright, in red
            images[i, 0, 3 * label : 3 * label + 3, :] = 255
        batch = {
            "batch_label": f"{name} of 6",
            "labels": labels.tolist(),
            "data": images.reshape(n, 3072),
            "filenames": [f"{i}.png" for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {
        "num_cases_per_batch": per_batch,
        "num_vis": 3072,
        "label_names": list(CIFAR10DataModule.class_names),
    }
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


_ports_given: set[int] = set()


def free_port() -> int:
    """A TCP port nobody listens on now, for one multi-process run: never one this process gave
    before, and from a range of its own under pytest-xdist (workers start runs at the same
    time). Below the kernel's ephemeral range (32768-60999), where `bind(..., 0)` and outgoing
    connections take theirs: a port from there can be taken by another process before the run
    binds it (torchrun's rendezvous then joins whatever listens there instead of failing)."""
    import random
    import socket

    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    span = (32768 - 20000) // max(workers, 1)
    low = 20000 + worker % max(workers, 1) * span
    while True:
        port = random.SystemRandom().randrange(low, low + span)  # not the seeded generator
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port


def tiny_run_args(
    data_dir: Path, run_dir: Path | None, *extra: str, progress_bar: bool = False
) -> list[str]:
    """Overrides for a seconds-long CPU run on the small MNIST files in `data_dir`; `run_dir`
    None leaves the folder to Hydra (sweeps, runs pinned to a cluster job id). The progress bar
    is off unless asked for (its output would fill the captured logs)."""
    return [
        "data=mnist",
        f"paths.data_dir={data_dir}",
        "data.val_size=100",
        "data.batch_size=50",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "extras.print_config=false",
        *([] if progress_bar else ["callbacks.rich_progress_bar=null"]),
        *([f"hydra.run.dir={run_dir}"] if run_dir is not None else []),
        *extra,
    ]


# Dropout and random crops/flips, deterministic: a resumed run must also restore the random
# generators to end where an uninterrupted one does.
RESUMABLE = [
    "trainer.max_epochs=3",
    "trainer.deterministic=true",
    "data.batch_size=10",
    "data.crop_padding=2",
    "data.horizontal_flip=true",
    "model.net.dropout=0.3",
]


class SendSignal(L.Callback):
    """Fault injection for subprocess tests (`+callbacks.fault._target_=helpers.SendSignal`,
    with PYTHONPATH=tests): the run sends itself `signal` after batch `batch` of epoch `epoch`
    in `stage` ("train", "validate" or "test"), as a scheduler would at that moment; with `rank`,
    only the process of that rank does."""

    def __init__(
        self, signal: str, epoch: int, batch: int, stage: str = "train", rank: int | None = None
    ) -> None:
        self.signal, self.epoch, self.batch, self.stage = signal, epoch, batch, stage
        self.rank = rank

    def _maybe_send(self, trainer, stage: str, batch_idx: int) -> None:
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if (stage, trainer.current_epoch, batch_idx) == (self.stage, self.epoch, self.batch):
            os.kill(os.getpid(), getattr(signal_module, self.signal))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe_send(trainer, "train", batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if not trainer.sanity_checking:
            self._maybe_send(trainer, "validate", batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._maybe_send(trainer, "test", batch_idx)


class RecordPlacements(L.Callback):
    """For model-parallel subprocess tests (`+callbacks.placements._target_=helpers.
    RecordPlacements +callbacks.placements.path=...`, PYTHONPATH=tests): how rank 0 holds each
    parameter of the network before any step (the sanity check's too), as JSON: per parameter
    `{"placements": [...], "mesh": [dimension names]}` for a DTensor, null for a plain tensor."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        import json

        from torch.distributed.tensor import DTensor

        held = {}
        for name, param in pl_module.net.named_parameters():
            if isinstance(param, DTensor):
                held[name] = {
                    "placements": [str(p) for p in param.placements],
                    "mesh": list(param.device_mesh.mesh_dim_names or []),
                }
            else:
                held[name] = None
        Path(self.path).write_text(json.dumps(held, indent=1))


class RecordValidationSamples(L.Callback):
    """For subprocess tests (`+callbacks.samples._target_=helpers.RecordValidationSamples
    +callbacks.samples.directory=...`, PYTHONPATH=tests): after each epoch's validation (not the
    sanity check), every process adds a JSON line to `directory/<pid>.jsonl`: the epoch, its
    rank, the world size, and how many validation samples it saw."""

    def __init__(self, directory: str) -> None:
        self.directory, self.samples = Path(directory), 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self.samples += len(batch[1])

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        samples, self.samples = self.samples, 0
        if trainer.sanity_checking:
            return
        import json

        self.directory.mkdir(parents=True, exist_ok=True)
        line = {
            "epoch": trainer.current_epoch,
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "samples": samples,
        }
        with open(self.directory / f"{os.getpid()}.jsonl", "a") as file:
            file.write(json.dumps(line) + "\n")


def band_image(label: int, rng: np.random.Generator, size=(20, 24), color=True) -> np.ndarray:
    """An image whose class is a bright horizontal band at row 3·label, plus noise."""
    height, width = size
    image = rng.integers(0, 70, (height, width, 3) if color else (height, width))
    image[3 * label + 1 : 3 * label + 3] = 250
    return image.astype(np.uint8)


def write_image_folder(
    root: Path,
    counts: dict[str, dict[str, int]],
    size=(20, 24),
    color: bool = True,
    seed: int = 0,
) -> Path:
    """`root/<split>/<class>/<n>.png|.jpg` with `counts[split][class]` images of `band_image`,
    alternately PNG and (high-quality) JPEG files, as a camera or a web scrape leaves them."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    classes = sorted({c for per_class in counts.values() for c in per_class})
    for split, per_class in counts.items():
        for name, n in per_class.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                image = Image.fromarray(band_image(classes.index(name), rng, size, color))
                if i % 2:
                    image.save(folder / f"{i:04d}.jpg", quality=95)
                else:
                    image.save(folder / f"{i:04d}.png")
    return root


def small_cnn_args(images: Path) -> list[str]:
    """Overrides that train a small CNN for 3 epochs on a `write_image_folder` folder of 20×24
    band images (fitted to 20×20) until it knows the classes, without logger or progress bar."""
    return [
        "data=image_folder",
        f"data.root={images}",
        "data.image_size=20",
        "data.num_workers=0",
        "model=cnn",
        "model.net.channels=[8]",
        "model.net.hidden_size=16",
        "model.net.pool_size=10",  # the whole map: a band's row is its class
        "trainer.max_epochs=3",
        "logger=none",
        "callbacks.rich_progress_bar=null",
    ]


def final_state(run: Path):
    """A finished run's last step, weights (last.ckpt) and final metrics (metrics.json)."""
    import json

    import torch

    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    metrics = json.loads((run / "metrics.json").read_text())
    return checkpoint["global_step"], checkpoint["state_dict"], metrics


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    """The two runs ended at the same step with the same weights and metrics."""
    import pytest
    import torch

    step, weights, metrics = final_state(resumed)
    step_ref, weights_ref, metrics_ref = final_state(uninterrupted)
    assert step == step_ref
    for name, value in weights_ref.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=1e-6, msg=name)
    differ = {
        name: (metrics.get(name), metrics_ref.get(name))
        for name in metrics.keys() | metrics_ref.keys()
        if metrics.get(name) != pytest.approx(metrics_ref.get(name), abs=1e-6)
    }
    assert not differ, f"metrics that differ (resumed, uninterrupted): {differ}"


def write_numbered_folder(root: Path, n: int, classes: int = 2) -> Path:
    """`root/train/c<k>/<id>.png`: n grayscale 8×8 images whose first two pixels spell their id
    (id // 256, id % 256), for tests that check which samples a run saw (`RecordSamples`)."""
    from PIL import Image

    for i in range(n):
        image = np.full((8, 8), 40 * (i % classes), np.uint8)
        image[0, 0], image[0, 1] = divmod(i, 256)
        folder = root / "train" / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:05d}.png")
    return root


class RecordSamples(L.Callback):
    """For subprocess tests on `write_numbered_folder` images (`+callbacks.samples._target_=
    helpers.RecordSamples +callbacks.samples.path=DIR`, PYTHONPATH=tests): the ids of the
    training samples each process trains on, one JSON line per batch in `DIR/rank<r>.jsonl`."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import json

        images = batch[0]
        datamodule = trainer.datamodule
        pixels = images[:, 0, 0, :2].double() * datamodule.std[0] + datamodule.mean[0]
        high, low = (pixels * 255).round().long().unbind(1)
        ids = (high * 256 + low).tolist()
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / f"rank{trainer.global_rank}.jsonl", "a") as out:
            out.write(json.dumps({"epoch": trainer.current_epoch, "ids": ids}) + "\n")


def fashion_mnist_dir() -> Path | None:
    """The data root of the real Fashion-MNIST (./data): its files there, or Debian's package to
    unpack there (apt-get install dataset-fashion-mnist); None without either."""
    from litforge.data.fashion_mnist import DEBIAN_DIR
    from litforge.data.fashion_mnist import FashionMNISTDataModule as FashionMNIST

    raw = ROOT / "data" / FashionMNIST.folder
    debian = Path(DEBIAN_DIR)
    files = [name for name, _ in FashionMNIST.dataset.resources]
    if all(
        (raw / name.removesuffix(".gz")).is_file() or (debian / name).is_file() for name in files
    ):
        return ROOT / "data"
    return None


NO_FASHION_MNIST = (
    "Fashion-MNIST not found in ./data/FashionMNIST/raw: apt-get install -y dataset-fashion-mnist"
)


def export_images(datamodule: CIFAR10DataModule, folder: Path) -> Path:
    """A built-in dataset as an image folder, `folder/<split>/<class>/<n>.png`, written whole
    (through `<folder>.partial`): the photos a user's own folder holds."""
    from PIL import Image

    datamodule.place_files()
    partial = folder.with_name(f"{folder.name}.partial")
    for split in ("train", "test"):
        images, labels = datamodule.read(train=split == "train")
        for i, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
            name = datamodule.class_names[label].replace("/", "_")
            path = partial / split / name / f"{i:05d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.permute(1, 2, 0).squeeze(2).numpy()).save(path)
    partial.rename(folder)
    return folder


class RecordConfusion(L.Callback):
    """`+callbacks.confusion._target_=helpers.RecordConfusion +callbacks.confusion.path=FILE`:
    the test confusion matrix (rows: true class, columns: predicted) as JSON, after testing."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_test_end(self, trainer, pl_module) -> None:
        import json

        if trainer.is_global_zero:
            self.path.write_text(json.dumps(pl_module.test_confusion_matrix.tolist()))


def train_recording_samples(tmp_path: Path, *data_overrides: str) -> dict[tuple[int, int], list]:
    """Train for 2 epochs with DDP on 2 CPU processes, batches of 8, on `write_numbered_folder`
    data; returns the sample ids each process trained on, by (epoch, rank) (`RecordSamples`)."""
    import json

    seen = tmp_path / "seen"
    result = run_script(
        "train.py",
        *data_overrides,
        "data.batch_size=8",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=2",
        "test=false",
        "callbacks.model_checkpoint=null",
        "callbacks.rich_progress_bar=null",
        "+callbacks.samples._target_=helpers.RecordSamples",
        f"+callbacks.samples.path={seen}",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT / "tests")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    per_rank: dict[tuple[int, int], list] = {}
    for rank in (0, 1):
        for line in (seen / f"rank{rank}.jsonl").read_text().splitlines():
            batch = json.loads(line)
            per_rank.setdefault((batch["epoch"], rank), []).extend(batch["ids"])
    return per_rank


class RecordTestProbabilities(L.Callback):
    """`+callbacks.record._target_=helpers.RecordTestProbabilities +callbacks.record.path=FILE`:
    the class probabilities the model gives each test image, in the test loader's order, as the
    test loop ran it (torch.save'd N×K tensor)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.batches: list = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        import torch

        with torch.no_grad():
            self.batches.append(pl_module(batch[0]).softmax(dim=1).cpu())

    def on_test_end(self, trainer, pl_module) -> None:
        import torch

        torch.save(torch.cat(self.batches), self.path)


def predicted_accuracy(model_file: Path, mnist_dir: Path) -> float:
    """The accuracy on the MNIST test files under the data root `mnist_dir` of the model in
    `model_file`, loaded as predict.py, export.py and serve.py load it
    (`litforge.deploy.inference`)."""
    from litforge.data.mnist import MNISTDataModule
    from litforge.deploy.inference import load_classifier

    images, labels = MNISTDataModule(root=str(mnist_dir), download=False).read(train=False)
    logits = load_classifier(model_file).logits(images)
    return (logits.argmax(dim=1) == labels).float().mean().item()


def write_cnn_checkpoint(
    path: Path,
    size: int,
    channels: tuple[int, ...] = (8, 16),
    kernel_size: int = 3,
    class_names: tuple[str, ...] = ("bird", "cat", "dog"),
    mirror_average: bool = False,
) -> Path:
    """A Lightning checkpoint (as train.py's ModelCheckpoint writes it) of an untrained CNN for
    RGB images of `size`×`size`: what serving needs of a trained one, in a fraction of a second."""
    net = {
        "_target_": "litforge.models.cnn.CNN",
        "channels": list(channels),
        "kernel_size": kernel_size,
        "hidden_size": 16,
        "mirror_average": mirror_average,
    }
    return write_checkpoint(path, size, net, class_names)


def write_checkpoint(
    path: Path, size: int, net: dict, class_names: tuple[str, ...] = ("bird", "cat", "dog")
) -> Path:
    """A checkpoint, as train.py writes it, of the untrained network `net` (a config) for RGB
    images of `size`×`size`."""
    from litforge.checkpoints import ResumeState
    from litforge.models import ClassificationModule

    module = ClassificationModule(
        net=net,
        input_shape=[3, size, size],
        num_classes=len(class_names),
        optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
        class_names=list(class_names),
        channels_last=True,
        mean=[0.48, 0.45, 0.4],
        std=[0.23, 0.22, 0.22],
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[ResumeState()],  # the module's class, which serve.py rebuilds it from
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.strategy.connect(module)
    trainer.save_checkpoint(path)
    return path


class SlowNet(torch.nn.Module):
    """A test network for serving (a checkpoint builds it only where a test trusts its
    package: `TEST_PACKAGES`): the channels' means through a linear layer, each forward
    `seconds` long; with `gate` (a port on 127.0.0.1), the first forward connects there and
    waits for a byte, so that a test decides when it ends. `calls` counts the forwards."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        seconds: float = 0.0,
        gate: int | None = None,
    ) -> None:
        super().__init__()
        self.seconds, self.gate, self.calls = seconds, gate, 0
        self.head = torch.nn.Linear(input_shape[0], num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        import socket
        import time

        self.calls += 1
        if self.gate is not None:
            with socket.create_connection(("127.0.0.1", self.gate)) as gate:
                gate.recv(1)
            self.gate = None
        time.sleep(self.seconds)  # deterministically slower than a timeout below `seconds`
        return self.head(images.mean(dim=(2, 3)))


# For tests to add to the packages whose classes a checkpoint may build
# (litforge.checkpoints.TRUSTED_PACKAGES): SlowNet's.
TEST_PACKAGES = ("helpers",)


def photo(seed: int, width: int = 640, height: int = 480, file_format: str = "JPEG") -> bytes:
    """A camera-sized RGB image file (smooth colour gradients and noise), encoded in memory."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    pixels = base + rng.normal(0, 20, (height, width, 3)) + rng.integers(0, 50, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, file_format)
    return buffer.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A valid grayscale PNG of zeros: ~1 KB per million pixels, which unpack into a byte each."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    compressor, row = zlib.compressobj(9), bytes(width + 1)  # a filter byte, then the pixels
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit gray
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def process_group(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command's parentheses: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def assert_dead_rank_named(tmp_path: Path, data_dir: Path, *strategy: str) -> None:
    """A 2-process run whose rank 1 is killed once training: rank 0 ends it in one line that
    names the dead process."""
    args = tiny_run_args(
        data_dir,
        tmp_path / "run",
        *strategy,
        "trainer.devices=2",
        "trainer.max_epochs=100",  # far from done when rank 1 dies
        "data.batch_size=10",
    )
    # Once both ranks are training (rank 0 wrote its first checkpoint), rank 1 is killed.
    status, text, children = run_train_killing(
        args, "last.ckpt (epoch 0,", 1, env={"MASTER_PORT": str(free_port())}
    )
    assert "Traceback" not in text
    named = f"process of rank 1 (pid {children[1]}) died (killed by SIGKILL)"
    # Logged at the death; then this process ends the job in one line, exit 1, unless Lightning's
    # watch (every 5 s) SIGKILLs it first.
    assert f"The {named}: the job stops." in text, text[-3000:]
    if status != 1:
        assert status == -signal_module.SIGKILL, (status, text[-3000:])
        assert "Forcefully terminating all other processes" in text, (status, text[-3000:])
        return
    assert text.strip().splitlines()[-1] == (
        f"error: the {named}, so the job stopped. Its own output above says why; to resume, run "
        f"the same command with hydra.run.dir=<its run folder> ckpt_path=last."
    ), text[-3000:]


SLURM = {  # one task of a job of two on one node, as srun starts them
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NAME": "litforge",
    "SLURM_NODELIST": "127.0.0.1",
    "SLURM_JOB_NUM_NODES": "1",
}
LAUNCHER_VARIABLES = [
    *SLURM,
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "GROUP_WORLD_SIZE",
]


def feature_paths() -> list[str]:
    """The paths of the feature folders (pyproject.toml's manifest, which scripts/lean.py
    reads): folders end in "/"."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {})
    features = manifest.get("litforge", {}).get("features", {})  # none in a lean copy
    return [path for feature in features.values() for path in feature["paths"]]


def assert_option_builds(tmp_path: Path, overrides: list[str]):
    """The train config with `overrides` composes, resolves (Hydra's own node too) and builds
    the datamodule, model and trainer it lists, and nothing else; returns the resolved config
    (None where a GPU-only option is refused on this machine)."""
    import torch
    from hydra.utils import get_class
    from omegaconf import OmegaConf, open_dict

    from litforge.callbacks import LearningRateMonitor
    from litforge.checkpoints import AtomicCheckpointIO
    from litforge.errors import UserError
    from litforge.pipeline import build_datamodule, build_model, build_trainer, start

    def targets(group) -> set[type]:
        return {get_class(entry._target_) for entry in (group or {}).values() if entry}

    cfg = compose_config("train", tmp_path, overrides, keep_hydra=True)
    # Every interpolation has a value, Hydra's run and sweep folders and sweeper included.
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    # ??? is left only where the pipeline or Hydra fills it in
    assert OmegaConf.missing_keys(resolved) <= {
        "callbacks.log_run_config.run_config",
        "hydra.job.id",
        "hydra.hydra_help.hydra_help",
    }
    assert resolved.hydra.run.dir.startswith(str(tmp_path))
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        start(cfg)
    except UserError as err:  # GPU-only options (fsdp, trainer=gpu), refused on a CPU machine
        assert not torch.cuda.is_available() and "GPU" in str(err)
        return None
    datamodule = build_datamodule(cfg)
    model = build_model(cfg, datamodule)
    trainer = build_trainer(cfg)
    assert type(datamodule) is get_class(cfg.data._target_)
    assert type(model.net) is get_class(cfg.model.net._target_)
    expected = targets(cfg.get("callbacks"))
    if not trainer.loggers:  # Lightning's monitor needs one (see pipeline.build_trainer)
        expected.discard(LearningRateMonitor)
    assert expected <= {type(cb) for cb in trainer.callbacks}
    if not cfg.trainer.fast_dev_run:  # which replaces the loggers by a dummy
        assert {type(lg) for lg in trainer.loggers} == targets(cfg.get("logger"))
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    return resolved


CRAFTED = {  # (hyper-parameter, value): what a crafted checkpoint asks to build
    "nested in the network": ("net", {"dropout": {"_target_": "tempfile.mkdtemp", "dir": "{d}"}}),
    "a network not listed": ("net", {"_target_": "pathlib.Path"}),
    "torch.load in the network": (
        "net",
        {"hidden_sizes": [{"_target_": "torch.load", "f": "{d}"}]},
    ),
    "an interpolation": ("net", {"dropout": "${oc.decode:'{_target_: tempfile.mkdtemp}'}"}),
    "another optimizer": ("optimizer", {"_target_": "tempfile.mkdtemp", "dir": "{d}"}),
    # Names that start like torch.optim's and resolve, through its modules' imports, to code.
    "torch.load through torch.optim": (
        "optimizer",
        {
            "_target_": "torch.optim.optimizer.torch.load",
            "_partial_": False,
            "_args_": ["{p}"],  # a pickle that makes a folder in {d}
            "weights_only": False,
        },
    ),
    "os.system through torch.optim": (
        "scheduler",
        {
            "_target_": "torch.optim.optimizer.torch.serialization.os.system",
            "_partial_": False,
            "_args_": ["touch {d}/ran"],
        },
    ),
    "Hydra's _args_ on a listed optimizer": (
        "optimizer",
        {"_target_": "torch.optim.SGD", "_partial_": True, "_args_": ["{d}"]},
    ),
    "weights named in a checkpoint": ("net", {"pretrained_file": "{d}/weights.safetensors"}),
    # Settings that are values, not configs: Hydra would build what they hold if passed on.
    "torch.load in input_shape": (
        "input_shape",
        [{"_target_": "torch.load", "f": "{p}", "weights_only": False}, 28, 28],
    ),
    "open in mean": ("mean", [{"_target_": "builtins.open", "file": "{d}/opened", "mode": "w"}]),
    "a setting no module takes": ("on_load", {"_target_": "os.mkdir", "path": "{d}/made"}),
}


# Each key besides hyper_parameters from which Lightning's loading takes the module's arguments,
# with crafts to put there: `hparams_name` wraps them all as one argument (a network here).
LEGACY_CRAFTS = [
    (under, craft)
    for under in CHECKPOINT_PAST_HPARAMS_KEYS
    for craft in ("nested in the network", "another optimizer", "open in mean")
] + [("hparams_name", "nested in the network"), ("hparams_name", "a network not listed")]

# What the refusals say.
REFUSED = (
    r"is not allowed|is an interpolation|has _args_|names no weights"
    r"|is no \(channels, height, width\)|is no list of numbers|keys of Lightning before 1.0"
)


def crafted_checkpoint(
    checkpoint_path: Path, craft: str, tmp_path: Path, under: str = "hyper_parameters"
) -> tuple[Path, Path]:
    """A copy of a checkpoint whose hyper-parameters ask to build `CRAFTED[craft]`, and the
    empty folder what it asks for would be made in. `under`: the key that holds the crafted
    setting, one Lightning also merges into the module's arguments (`hparams`,
    `module_arguments`; it is then left out of `hyper_parameters`), or `hparams_name`: the
    crafted `net` config becomes all of `hyper_parameters`, which Lightning passes as `net`."""
    import json
    import os
    import pickle

    import torch

    class Payload:  # unpickled, it makes a folder in `made`
        def __reduce__(self):
            return os.mkdir, (str(made / "unpickled"),)

    made = tmp_path / "made"
    made.mkdir()
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(pickle.dumps(Payload()))
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    key, value = CRAFTED[craft]
    crafted = json.loads(json.dumps(value).replace("{d}", str(made)).replace("{p}", str(payload)))
    old = checkpoint["hyper_parameters"].get(key)
    merged = isinstance(old, dict) and isinstance(crafted, dict)
    crafted = {**old, **crafted} if merged else crafted
    if under == "hyper_parameters":
        checkpoint["hyper_parameters"][key] = crafted
    elif under == "hparams_name":
        assert key == "net", "hparams_name makes all settings one: a crafted network"
        checkpoint["hyper_parameters"], checkpoint["hparams_name"] = crafted, "net"
    else:  # a legacy key: Lightning merges it under hyper_parameters
        del checkpoint["hyper_parameters"][key]
        checkpoint[under] = {key: crafted}
    path = tmp_path / "crafted.ckpt"
    torch.save(checkpoint, path)
    return path, made


def _dict_step_module():
    from torchmetrics.classification import MulticlassAccuracy

    from litforge.models import ClassificationModule

    class DictStepModule(ClassificationModule):
        """A fork's own training step, as Lightning allows one: it returns a dict with its
        logits in it and logs a metric of its own (top-2 accuracy)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.train_top2 = MulticlassAccuracy(self.hparams.num_classes, top_k=2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            loss = self.loss(logits, y)
            self.train_top2(logits, y)
            self.log("train/top2", self.train_top2, on_step=False, on_epoch=True)
            return {"loss": loss, "logits": logits.detach()}

    return DictStepModule


DictStepModule = _dict_step_module()


def _nan_on_rank_one():
    from litforge.models import ClassificationModule

    class NaNOnRankOne(ClassificationModule):
        """Its training loss is NaN at step 5 on rank 1 only (a bad batch of one process)."""

        def loss(self, logits, y):
            loss = super().loss(logits, y)
            bad = self.training and self.global_rank == 1 and self.global_step == 5
            return loss * float("nan") if bad else loss

    return NaNOnRankOne


NaNOnRankOne = _nan_on_rank_one()


class SignSGD(torch.optim.Optimizer):
    """An optimizer from outside torch.optim, as a fork might write one: steps by the sign."""

    def __init__(self, params, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])
        return loss


def model_weights(state_dict: dict) -> dict:
    """A checkpoint's state_dict less the training statistics' counts, which are each process's
    own (a checkpoint holds rank 0's): what runs on other numbers of processes share."""
    return {k: v for k, v in state_dict.items() if not k.startswith(("train_loss.", "train_acc."))}


class BandPhotos(L.LightningDataModule):
    """A datamodule of a user's own, as docs/data.md writes one: a plain LightningDataModule with
    the four attributes the pipeline reads, torch DataLoaders, batches it normalizes itself. Its
    photos: `band_image`s of `size` px, RGB, in memory."""

    class_names = ("low", "middle", "high")
    mean, std = (0.2, 0.2, 0.2), (0.3, 0.3, 0.3)

    def __init__(self, size: int = 128, per_class: int = 24, batch_size: int = 16) -> None:
        super().__init__()
        self.input_shape = (3, size, size)
        self.size, self.per_class, self.batch_size = size, per_class, batch_size

    def split(self, seed: int) -> torch.utils.data.TensorDataset:
        rng = np.random.default_rng(seed)
        images, labels = [], []
        for label in range(len(self.class_names)):
            for _ in range(self.per_class):
                pixels = torch.from_numpy(band_image(label, rng, (self.size, self.size)))
                images.append(pixels.permute(2, 0, 1).float() / 255)
                labels.append(label)
        mean, std = torch.tensor(self.mean).view(3, 1, 1), torch.tensor(self.std).view(3, 1, 1)
        images = (torch.stack(images) - mean) / std
        return torch.utils.data.TensorDataset(images, torch.tensor(labels))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.split(0), self.batch_size, shuffle=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.split(1), self.batch_size)

    def test_dataloader(self):
        return torch.utils.data.DataLoader(self.split(2), self.batch_size)
