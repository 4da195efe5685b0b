"""Training input on CPU: each reader's delivery rate, its scaling with loader workers, and what
the training loop adds on top of it (issue 38, measurements (a) and (b)).

    .venv/bin/python benchmarks/train_input.py --out benchmarks/results/train_input_cpu.json

(a) ``readers``: for each reader (synthetic identities, an image folder of JPEGs, CASIA-style
identity folders, an insightface RecordIO file), 112 px RGB, batches of 64: images per second
that :class:`raycompat.train.loader.BatchLoader` delivers with 0 loader workers (decoded in the
measuring process: the per-core rate), 1 and 2 workers, and the 2-worker / 1-worker ratio
(goal >= 1.7 on a machine with 2 free cores). The baseline is what a user writes without us:
a torch ``DataLoader`` over the same files decoding image by image (``torchvision.io.decode_jpeg``
for the JPEG readers, the generator's own ``dataset[i]`` for synthetic) with the same number
of workers.
(b) ``loop``: the project's training loop (``raycompat.cluster.train.worker.train_epoch`` with a
``StepGuard``, the ``sampler`` loader and a model whose step costs nothing: a global average pool
and a 3 -> 8 linear layer) against the same loader iterated alone, 2 loader workers; the ratio
is loop / loader (goal >= 0.9: the loop adds nothing). Both at two epoch sizes, reporting the
time per image of the larger over the smaller (flat is the goal) and this process's peak RSS.

Each figure is the median over ``--pairs`` interleaved runs. The machine is named in the JSON.
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit, machine_info  # noqa: E402

from raycompat.data import create_dataset  # noqa: E402
from raycompat.data.recordio import IRHeader, pack_record, write_recordio  # noqa: E402
from raycompat.train.loader import BatchLoader, BatchSpec  # noqa: E402

SIZE = 112
BATCH = 64
CPU = torch.device("cpu")


def jpeg_bytes(rng: np.random.Generator) -> bytes:
    """A 112 px JPEG with some structure (smooth noise), about what a face crop weighs."""
    low = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)
    image = Image.fromarray(low).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_readers(root: Path, images: int) -> dict:
    """``{name: (dataset, [jpeg file or record bytes per row] or None)}``."""
    rng = np.random.default_rng(0)
    payloads = [jpeg_bytes(rng) for _ in range(images)]
    classes = 10
    folder = root / "folder"
    for i, data in enumerate(payloads):
        path = folder / f"id{i % classes:03d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    records = [
        (i, pack_record(IRHeader(0, float(i % classes), i, 0), data))
        for i, data in enumerate(payloads)
    ]
    write_recordio(root / "train.rec", root / "train.idx", records)
    per_class = max(1, images // classes)
    return {
        "synthetic": create_dataset(
            "synthetic", num_classes=classes, images_per_class=per_class, image_size=SIZE
        ),
        "image_folder": create_dataset("image_folder", root=folder),
        "casia_folders": create_dataset("casia_webface", root=folder, image_size=SIZE),
        "casia_recordio": create_dataset("casia_webface", root=root / "train.rec"),
    }


class PlainItems(torch.utils.data.Dataset):
    """What a user writes without us: one image per item (torchvision's JPEG decoder on the
    file's bytes, or the generator's ``dataset[i]``), batched by the DataLoader."""

    def __init__(self, dataset, name: str) -> None:
        self.dataset, self.name = dataset, name
        self.paths = getattr(dataset, "paths", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.name in ("image_folder", "casia_folders"):
            from torchvision.io import decode_jpeg

            data = Path(self.paths[i]).read_bytes()
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8)).float() / 255
        return self.dataset[i][0]


def specs(rows: int) -> list[BatchSpec]:
    order = np.random.default_rng(1).permutation(rows)
    return [BatchSpec(order[i : i + BATCH]) for i in range(0, rows, BATCH)]


def ours(dataset, workers: int, rows: int) -> float:
    loader = BatchLoader(dataset, "none", workers, CPU)
    list(loader.images(specs(min(rows, 4 * BATCH))))  # workers started, files warm
    began = time.perf_counter()
    count = sum(len(images) for images in loader.images(specs(rows)))
    return count / (time.perf_counter() - began)


def plain(dataset, name: str, workers: int, rows: int) -> float:
    loader = torch.utils.data.DataLoader(
        PlainItems(dataset, name),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    for _ in loader:  # a first pass starts the workers and warms the files
        pass
    began = time.perf_counter()
    count = sum(len(images) for images in loader)
    return count / (time.perf_counter() - began)


def measure_readers(readers: dict, pairs: int) -> dict:
    out = {}
    for name, dataset in readers.items():
        runs: dict[str, list[float]] = {}
        for _ in range(pairs):
            for workers in (0, 1, 2):
                runs.setdefault(f"ours_{workers}", []).append(ours(dataset, workers, len(dataset)))
                if workers:
                    key = f"plain_{workers}"
                    runs.setdefault(key, []).append(plain(dataset, name, workers, len(dataset)))
        rates = {key: statistics.median(values) for key, values in runs.items()}
        out[name] = {
            "images_per_s": {k: round(v, 1) for k, v in rates.items()},
            "per_core_images_per_s": round(rates["ours_0"], 1),
            "scaling_2_over_1_workers": round(rates["ours_2"] / rates["ours_1"], 3),
            "ours_over_plain_2_workers": round(rates["ours_2"] / rates["plain_2"], 3),
        }
    return out


class FreeModel(torch.nn.Module):
    """A step that costs nothing: global average pool, then 3 -> 8."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 8)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(images.mean(dim=(2, 3)))


def loop_rate(dataset, rows: np.ndarray, loader: BatchLoader) -> float:
    """Images per second through the project's epoch loop (worker.train_epoch)."""
    from raycompat.cluster.train.worker import EpochTraining, WorkerTask, train_epoch
    from raycompat.config.train import TrainConfig
    from raycompat.engine import StepGuard
    from raycompat.parallel import create_strategy
    from raycompat.train.data import sampler_batches
    from raycompat.train.schedule import optimizer_factory

    cfg = TrainConfig()
    prepared = create_strategy("ddp").setup(
        FreeModel(), optimizer_factory(cfg.optim), CPU, precision="fp32", channels_last=False
    )
    targets = torch.from_numpy(dataset.labels)

    class FreeStep(WorkerTask):
        name, epochs, checked = "bench", 1, True

        def batches(self, epoch):
            no_replay = rows[:0]
            batch = sampler_batches(
                dataset, targets, rows, no_replay, BATCH, epoch, 0, 0, 1, "none", loader
            )
            return batch, None

        def loss(self, batch, poison):
            out = prepared.module(prepared.prepare_inputs(batch.images))
            loss = torch.nn.functional.cross_entropy(out, batch.targets % 8)
            return loss, {"loss": loss}

    trained = EpochTraining(0, time.perf_counter())
    train_epoch(FreeStep(), prepared, cfg, StepGuard(), trained, 0, None)
    trained.finish()
    return trained.trained_rows() / (time.perf_counter() - trained.began)


def measure_loop(dataset, sizes: list[int], pairs: int) -> dict:
    loader = BatchLoader(dataset, "none", 2, CPU)
    list(loader.images(specs(min(len(dataset), 4 * BATCH))))
    out = {}
    for size in sizes:
        rows = np.arange(size)
        alone, looped = [], []
        for _ in range(pairs):
            began = time.perf_counter()
            count = sum(len(images) for images in loader.images(specs(size)))
            alone.append(count / (time.perf_counter() - began))
            looped.append(loop_rate(dataset, rows, loader))
        out[str(size)] = {
            "loader_images_per_s": round(statistics.median(alone), 1),
            "loop_images_per_s": round(statistics.median(looped), 1),
            "loop_over_loader": round(statistics.median(looped) / statistics.median(alone), 3),
        }
    small, large = (out[str(s)] for s in (sizes[0], sizes[-1]))
    out["time_per_image_largest_over_smallest"] = round(
        small["loop_images_per_s"] / large["loop_images_per_s"], 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1536, help="rows per reader")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        readers = make_readers(Path(root), args.images)
        result = {
            "benchmark": "train_input",
            "machine": machine_info(),
            "image_size": SIZE,
            "batch_size": BATCH,
            "images_per_reader": args.images,
            "pairs": args.pairs,
            "readers": measure_readers(readers, args.pairs),
            "loop": measure_loop(
                readers["synthetic"],
                [len(readers["synthetic"]) // 4, len(readers["synthetic"])],
                args.pairs,
            ),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "goals": {"scaling_2_over_1_workers": 1.7, "loop_over_loader": 0.9},
        }
    emit(result, args.out)


if __name__ == "__main__":
    main()
