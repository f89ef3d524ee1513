"""CPU inference speed of a trained checkpoint, four ways, and of `serve.py` under concurrent
clients.

Models (the workloads): `model=mlp` and `model=cnn` as configured (the defaults), trained by
`train.py` on Fashion-MNIST for 50 steps (speed does not depend on the accuracy), or your own
with `--ckpt`. Inputs: Fashion-MNIST test images, uint8 1×28×28, normalization inside the model.

Runners, each timed on the same images in this process:

- eager: the checkpoint's network (`litforge.deploy.inference`, what predict.py runs);
- compiled: the same under `torch.compile` (the compile time is its own column);
- pt2: `model.pt2` from `export.py`, run by `torch.export.load(...).module()`;
- onnxruntime: `model.onnx` from `export.py`, on onnxruntime's CPU provider.

Latency: batch 1, p50 and p99 over `--requests` calls after a warm-up. Throughput: images per
second in batches of 64. Then the server: `serve.py` on the CNN checkpoint, clients sending a
Fashion-MNIST PNG each (keep-alive connections, `--clients` of them at once), with dynamic
batching (server.max_batch_size=16) and without it (1); requests per second and p50 latency.
Clients and server share this machine's cores.

    python benchmarks/inference.py                 # both models, 1/8/32 clients
    python benchmarks/inference.py --ckpt logs/train/runs/<run>/checkpoints/last.ckpt
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str]) -> None:
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def train(model: str, out: Path) -> Path:
    run_dir = out / f"train_{model}"
    run(
        [
            sys.executable, "train.py", f"model={model}", "trainer.max_epochs=1",
            "trainer.limit_train_batches=50", "logger=none", "extras.print_config=false",
            "callbacks.rich_progress_bar=null", f"hydra.run.dir={run_dir}",
        ]
    )  # fmt: skip
    return next((run_dir / "checkpoints").glob("epoch_*.ckpt"))


def export(ckpt: Path, file_format: str, out: Path) -> Path:
    run_dir = out / f"export_{file_format}_{ckpt.parent.parent.name}"
    run(
        [
            sys.executable, "export.py", f"ckpt_path={ckpt}", f"format={file_format}",
            "extras.print_config=false", f"hydra.run.dir={run_dir}",
        ]
    )  # fmt: skip
    return run_dir / f"model.{file_format}"


def test_images() -> torch.Tensor:
    from litforge.data.fashion_mnist import FashionMNISTDataModule

    datamodule = FashionMNISTDataModule(root=str(ROOT / "data"))
    datamodule.prepare_data()
    return datamodule.read(train=False)[0]


def latency_ms(call, images: torch.Tensor, requests: int) -> tuple[float, float]:
    for i in range(20):
        call(images[i : i + 1])
    times = []
    for i in range(requests):
        one = images[i % len(images)].unsqueeze(0)
        start = time.perf_counter()
        call(one)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


def throughput(call, images: torch.Tensor, batches: int = 40) -> float:
    call(images[:64])
    start = time.perf_counter()
    for i in range(batches):
        first = (i * 64) % (len(images) - 63)
        call(images[first : first + 64])
    return batches * 64 / (time.perf_counter() - start)


def runners(ckpt: Path, out: Path) -> dict[str, tuple]:
    """{name: (uint8 batch -> logits, seconds from file to the first answers, the file)}: the
    loading, and for `compiled` the compilation (batch 1 and 64)."""
    from litforge.deploy.inference import load_classifier

    files = {"pt2": export(ckpt, "pt2", out), "onnxruntime": export(ckpt, "onnx", out)}
    made = {}
    for name, path, options in (
        ("eager", ckpt, {}),
        ("compiled", ckpt, {"compile": True}),
        ("pt2", files["pt2"], {}),
        ("onnxruntime", files["onnxruntime"], {}),
    ):
        start = time.perf_counter()
        loaded = load_classifier(path, **options)
        shape = loaded.contract.to_dict()["shape"][1:]
        for n in (1, 64):
            loaded.logits(torch.zeros(n, *shape, dtype=torch.uint8))
        made[name] = (loaded.logits, time.perf_counter() - start, path)
    return made


def inputs_for(made: dict, images: torch.Tensor) -> torch.Tensor:
    """Fashion-MNIST's test images, or random ones where a `--ckpt` model takes another shape."""
    from litforge.deploy.inference import load_classifier

    shape = tuple(load_classifier(made["pt2"][2], key="model_path").contract.to_dict()["shape"][1:])
    if shape == tuple(images.shape[1:]):
        return images
    print(f"(random uint8 images {shape}: the model does not take Fashion-MNIST's 1x28x28)")
    return torch.randint(0, 256, (1024, *shape), dtype=torch.uint8)


def model_table(ckpt: Path, images: torch.Tensor, requests: int, out: Path) -> None:
    print(f"\n{ckpt}")
    header = ("runner", "ready in s", "p50 ms", "p99 ms", "img/s b64", "x eager")
    print("{:<12} {:>10} {:>8} {:>8} {:>10} {:>7}".format(*header))
    base = None
    made = runners(ckpt, out)
    images = inputs_for(made, images)
    for name, (call, ready, _) in made.items():
        p50, p99 = latency_ms(call, images, requests)
        rate = throughput(call, images)
        base = base or rate
        row = (name, ready, p50, p99, rate, rate / base)
        print("{:<12} {:>10.2f} {:>8.3f} {:>8.3f} {:>10.0f} {:>7.2f}".format(*row))


def png_bytes(image: torch.Tensor) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[0].numpy()).save(buffer, format="PNG")
    return buffer.getvalue()


def start_server(ckpt: Path, port: int, max_batch_size: int, out: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable, "serve.py", f"ckpt_path={ckpt}", f"server.port={port}",
            f"server.max_batch_size={max_batch_size}", "server.accelerator=cpu",
            f"hydra.run.dir={out / f'serve_{max_batch_size}'}", "extras.print_config=false",
        ],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().read() == b"ok":
                return process
        except OSError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"serve.py exited with status {process.returncode}")
        time.sleep(0.5)  # polling a starting server
    raise SystemExit("serve.py did not become healthy in 3 minutes")


def load_test(port: int, bodies: list[bytes], clients: int, total: int) -> tuple[float, float]:
    """(requests per second, p50 latency ms) of `total` requests from `clients` at once."""

    def client(k: int) -> list[float]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        times = []
        for i in range(k, total, clients):
            start = time.perf_counter()
            connection.request("POST", "/predict", body=bodies[i % len(bodies)])
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            times.append((time.perf_counter() - start) * 1000)
        return times

    client(0)  # warm-up: one connection's first requests
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        times = [t for part in pool.map(client, range(clients)) for t in part]
    return len(times) / (time.perf_counter() - start), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, nargs="*", help="checkpoints (default: train both)")
    parser.add_argument("--requests", type=int, default=500, help="batch-1 calls per runner")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--server-requests", type=int, default=600)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}; {time.strftime('%Y-%m-%d')}"
    )
    images = test_images()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        checkpoints = args.ckpt or [train("mlp", out), train("cnn", out)]
        for ckpt in checkpoints:
            model_table(ckpt, images, args.requests, out)

        bodies = [png_bytes(image) for image in images[:256]]
        print(f"\nserve.py on {checkpoints[-1]}: POST /predict with a 28×28 PNG")
        print(f"{'batching':<16} {'clients':>7} {'req/s':>8} {'p50 ms':>8}")
        for max_batch_size in (16, 1):
            port = free_port()
            server = start_server(checkpoints[-1], port, max_batch_size, out)
            try:
                for n in args.clients:
                    rate, p50 = load_test(port, bodies, n, args.server_requests)
                    label = f"max_batch_size={max_batch_size}"
                    print(f"{label:<16} {n:>7} {rate:>8.0f} {p50:>8.1f}")
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=60)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
