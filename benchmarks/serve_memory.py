"""Memory of `serve.py` under concurrent uploads of large images: idle, at its peak, and after.

The server runs an untrained CNN for RGB images of 224 px (the size does not matter: uploads are
decoded, then fitted, in the HTTP process). `--uploads` clients (24) each send at once a blank
9000x9000 RGB PNG: 236 KB, under `server.max_image_pixels`, 243 MB once decoded. Memory is the
proportional set size (PSS, /proc/<pid>/smaps_rollup) summed over the server's processes (main,
HTTP, model), sampled every 50 ms: pages shared by the forked processes are counted once.
Without a bound on the pixels decoded at once, the 24 uploads took a server from 1.9 to 7.6 GB.

    python benchmarks/serve_memory.py                  # 24 uploads, the default budget
    python benchmarks/serve_memory.py --uploads 8 server.max_decode_pixels=89478485
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # helpers.write_cnn_checkpoint: an untrained checkpoint


def group_pss_mb(pgid: int) -> float:
    """The PSS of the live processes of process group `pgid`, in MB."""
    total_kb = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":  # pgrp; zombies hold no memory
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return total_kb / 1024


def blank_png(side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side)).save(buffer, "PNG")
    return buffer.getvalue()


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body)
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def wait_healthy(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening, or not ready (503)
        if process.poll() is not None:
            raise SystemExit(f"serve.py exited with status {process.returncode}")
        time.sleep(0.5)  # polling a starting server
    raise SystemExit("serve.py did not become healthy in 5 minutes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uploads", type=int, default=24, help="concurrent uploads")
    parser.add_argument("--side", type=int, default=9000, help="the PNGs' width and height")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("overrides", nargs="*", help="serve.py overrides, e.g. server.workers=2")
    args = parser.parse_args()

    from helpers import photo, write_cnn_checkpoint

    body = blank_png(args.side)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_cnn_checkpoint(Path(tmp) / "cnn_224.ckpt", 224)
        command = [
            sys.executable, "serve.py", f"ckpt_path={checkpoint}", f"server.port={args.port}",
            "server.accelerator=cpu", "server.timeout=600", "extras.print_config=false",
            f"hydra.run.dir={tmp}/serve", *args.overrides,
        ]  # fmt: skip
        server = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        url = f"http://127.0.0.1:{args.port}"
        try:
            wait_healthy(url, server)
            assert post(f"{url}/predict", photo(0)) == 200  # a first request: warm
            time.sleep(1)  # settled
            idle = group_pss_mb(server.pid)
            peak, stop = [idle], threading.Event()

            def sample() -> None:
                while not stop.wait(0.05):
                    peak[0] = max(peak[0], group_pss_mb(server.pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.uploads) as pool:
                statuses = list(
                    pool.map(lambda _: post(f"{url}/predict", body), range(args.uploads))
                )
            seconds = time.perf_counter() - start
            stop.set()
            sampler.join()
            after = group_pss_mb(server.pid)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)

    answered = {status: statuses.count(status) for status in sorted(set(statuses))}
    print(
        f"\n{args.uploads} concurrent {args.side}x{args.side} RGB PNGs of {len(body) / 1e3:.0f} KB"
    )
    print(f"answers: {answered} in {seconds:.1f} s")
    print(f"server PSS: idle {idle:,.0f} MB, peak {peak[0]:,.0f} MB ({peak[0] / idle:.2f}x idle), "
          f"after {after:,.0f} MB")  # fmt: skip
    print(f"within 2x idle: {'yes' if peak[0] <= 2 * idle else 'NO'}")


if __name__ == "__main__":
    main()
