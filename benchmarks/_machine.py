"""Machine description attached to every benchmark's JSON (results are only comparable on the
same machine)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path


def machine_info() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def emit(result: dict, out: str | os.PathLike | None) -> None:
    """Print ``result`` as JSON and, when ``out`` is given, save the same text there."""
    text = json.dumps(result, indent=2) + "\n"
    sys.stdout.write(text)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


def store_parser(doc: str, rows: int, width: int) -> argparse.ArgumentParser:
    """The options every store benchmark shares (``--rows``, ``--width``, ``--pairs``,
    ``--store``, ``--out``); a benchmark adds its own to the parser it gets back."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--store", default=None, help="keep the store here (default: temporary)")
    parser.add_argument("--out", default=None)
    return parser


def store_root(store: str | None) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """``(root, handle)``: ``store`` itself, or a temporary folder that lives as long as the
    returned handle."""
    if store:
        return store, None
    temporary = tempfile.TemporaryDirectory()
    return temporary.name, temporary


class DriverRSS:
    """RSS of this process (the driver alone) when the block starts and its peak while it
    runs, sampled in a thread."""

    def __enter__(self):
        import psutil

        self.start = psutil.Process().memory_info().rss
        self.peak, self._stop = self.start, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while True:
            self.peak = max(self.peak, me.memory_info().rss)
            if self._stop.wait(0.1):
                return

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
