"""What `plots/mistakes.png` costs the test stage: `trainer.test` of the same model and data
with the plots callback keeping the 16 most confident mistakes (`callbacks.plots.mistakes=16`,
the default) and with it off (`mistakes=0`), alternating, in one process:

- Fashion-MNIST's 10,000 test images in memory (28×28 grayscale, `data=fashion_mnist`, the
  default MLP), or the same count of random images where the dataset is not installed;
- an image folder of 512 RGB 160×128 images tested at 128×128 (`data=image_folder`, the CNN),
  which reads the mistakes' files back at the end.

The first round of each warms up; the median of `--rounds` more is reported, and the ratio.

    python benchmarks/mistakes_cost.py [--rounds 5]
"""

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]


def timed_tests(overrides: list[str], rounds: int, folder: Path) -> dict[int, float]:
    from helpers import compose_config

    from litforge.pipeline import build_datamodule, build_model, build_trainer, start

    quiet = [
        "logger=none",
        "callbacks.rich_progress_bar=null",
        "+trainer.enable_progress_bar=false",
    ]
    cfg = compose_config("train", folder, [*overrides, *quiet, "trainer.max_epochs=1"])
    start(cfg)
    datamodule, model = build_datamodule(cfg), build_model(cfg, build_datamodule(cfg))
    times: dict[int, list[float]] = {16: [], 0: []}
    for round_ in range(rounds + 1):
        for count in (16, 0):
            trainer = build_trainer(cfg)
            plots = [c for c in trainer.callbacks if type(c).__name__ == "ClassificationPlots"]
            plots[0].mistakes = count
            began = time.perf_counter()
            trainer.test(model, datamodule=datamodule, verbose=False)
            if round_:  # (the first: warm-up)
                times[count].append(time.perf_counter() - began)
    return {count: statistics.median(t) for count, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from helpers import fashion_mnist_dir, write_idx_dataset, write_image_folder

    print(f"{platform.node()} {platform.processor() or platform.machine()}, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_dir = fashion_mnist_dir()
        if data_dir is None:
            write_idx_dataset(tmp / "data" / "FashionMNIST" / "raw", n_train=2000, n_test=10000)
            data_dir = tmp / "data"
        root = write_image_folder(
            tmp / "photos", {"train": {"a": 64, "b": 64}, "test": {"a": 256, "b": 256}}, (128, 160)
        )
        workloads = {
            "fashion_mnist (10,000 28x28 gray, MLP)": [
                "data=fashion_mnist", f"paths.data_dir={data_dir}",
            ],
            "image_folder (512 128x128 RGB, CNN)": [
                "data=image_folder", f"data.root={root}", "data.image_size=128", "model=cnn",
                "data.num_workers=2",
            ],
        }  # fmt: skip
        print(f"{'workload':42} {'mistakes=16 s':>14} {'off s':>8} {'ratio':>7}")
        for name, overrides in workloads.items():
            found = timed_tests(overrides, args.rounds, tmp / name.split()[0])
            print(f"{name:42} {found[16]:14.3f} {found[0]:8.3f} {found[16] / found[0]:7.3f}")


if __name__ == "__main__":
    main()
