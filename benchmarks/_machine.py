"""Machine description attached to every benchmark's JSON (results are only comparable on the
same machine)."""

from __future__ import annotations

import json
import os
import platform
import sys
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
