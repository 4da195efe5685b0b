"""The pieces of ``benchmarks/billion.py``: the disk estimate, the producer's part files, fresh
processes measured by their VmHWM, and the transform job watched and killed (the checks of v2
are ``_billion_checks.py``). Nothing here holds more than one part's rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
WIDTH = 8  # 8-d float16 rows: the per-row costs show, the bytes stay small
GUESS_BYTES_PER_ROW = 26  # 16 B of float16 vector + 8 B of int64 id + Parquet's own
# Delta export widens float16 to float32 (32 + 8 B raw), which its compression gives back:
# 19.4 B/row measured at 4M rows (billion_4m_cpu.json); a quarter more for the margin
EXPORT_BYTES_PER_ROW = 24
MARGIN_BYTES = 512 * 2**20  # records, logs, the transformation, temporary files
GALLERY = "bench"


@dataclass(frozen=True)
class Work:
    """The benchmark's folders under ``root``: the store, the producer's table (adopted as
    v1, outside the store), the fitted map, the export, the index's table, the logs."""

    root: Path

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def table(self) -> Path:
        return self.root / "table_v1"

    @property
    def h(self) -> Path:
        return self.root / "h"

    @property
    def delta(self) -> Path:
        return self.root / "delta_v2"

    @property
    def index_table(self) -> Path:
        return self.root / "table_index"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def staging(self) -> Path:
        """Where the transform job writes v2's parts before its commit (the job's default
        staging name, ``transform-<source>``; ``raycompat/store/commit/staging.py``)."""
        return self.store / GALLERY / "_data" / "v2" / "transform-v1"


def need_bytes(rows: int, bytes_per_row: float, copies: int = 2, extra: int = 0) -> int:
    """Disk for ``copies`` versions of ``rows`` rows, plus ``extra`` and the margin. A version
    the store writes takes about 9% more than the producer's Parquet (22.0 against 20.3 B/row
    at 4M rows), hence the 1.15."""
    return int(rows * bytes_per_row * copies * 1.15) + extra + MARGIN_BYTES


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def refusal(rows: int, need: int, free: int, where: Path, basis: str) -> str:
    """The one line the benchmark exits with (status 2) when the disk is too small."""
    return (
        f"billion.py: {rows:,} rows need about {need / 1e9:,.1f} GB on disk ({basis}), but "
        f"{where} has {free / 1e9:,.1f} GB free; give --root on a larger disk or fewer --rows"
    )


def write_part(task: tuple[str, int, int, int]) -> int:
    """Write one part as a user's producer would (plain pyarrow Parquet, its defaults): rows
    ``start .. start + rows - 1`` as int64 ids, unit Gaussian directions as float16. The file
    appears under its name only when complete. Returns its bytes."""
    path, start, rows, seed = task
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, WIDTH), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    flat = pa.array(x.astype(np.float16).reshape(-1))
    table = pa.table(
        {
            "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, WIDTH),
        }
    )
    tmp = f"{path}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return os.path.getsize(path)


def part_path(table: Path, index: int) -> str:
    return str(table / f"part-{index:05d}.parquet")


def tree(path: Path) -> tuple[int, int]:
    """``(files, bytes)`` under ``path`` (0, 0 when absent)."""
    files = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(folder, name)).st_size
                files += 1
            except FileNotFoundError:
                continue
    return files, size


def hwm_mb(pid: int) -> float | None:
    """VmHWM of process ``pid`` in MB (what it ever held resident), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            line = next(x for x in handle if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) / 1024


def child_env() -> dict[str, str]:
    """The environment of every command run here: a private local Ray per command (as a user
    on one machine gets), never a cluster named by ``RAY_ADDRESS``."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


# A fresh process running one `raycompat` command as its console script does (`main(argv)`),
# then writing its exit status, seconds and VmHWM to argv[1].
CLI = """
import json, sys, time
start = time.perf_counter()
from raycompat.cli.app import main
code = main(sys.argv[2:])
seconds = time.perf_counter() - start
with open("/proc/self/status") as handle:
    hwm = int(next(x for x in handle if x.startswith("VmHWM:")).split()[1]) / 1024
with open(sys.argv[1], "w") as handle:
    json.dump({"rc": code, "seconds": seconds, "driver_peak_rss_mb": hwm}, handle)
sys.exit(code)
"""


def run_cli(work: Work, name: str, argv: list[str], every_s: float = 10.0) -> dict:
    """``raycompat <argv>`` in a fresh process: wall seconds (the process, as a user waits
    for it), its own seconds after start-up, exit status, peak RSS, and its stdout (parsed
    when JSON); a line every ``every_s`` while it runs. Raises with its output when it fails."""
    work.logs.mkdir(parents=True, exist_ok=True)
    marks = work.logs / f"{name}.json"
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, str(marks), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=every_s)
            break
        except subprocess.TimeoutExpired:
            stderr_line(f"{name}: running, {time.perf_counter() - start:.0f} s")
    wall = time.perf_counter() - start
    (work.logs / f"{name}.log").write_text(stdout + stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"raycompat {' '.join(argv)} exited {proc.returncode}:\n{stderr}")
    out = json.loads(marks.read_text())
    try:
        out["output"] = json.loads(stdout)
    except ValueError:
        out["output"] = stdout.strip()
    return {"wall_s": wall, **out}


def run_script(work: Work, name: str, script: str, *args: str) -> dict:
    """``python -c script args`` in a fresh process; its last stdout line as JSON."""
    work.logs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=None,  # its progress lines reach the console
        text=True,
        cwd=REPO,
        env=child_env(),
        check=True,
    )
    return {"wall_s": time.perf_counter() - start, **json.loads(done.stdout.splitlines()[-1])}


def steady_rate(times: list[float], part_rows: int) -> float | None:
    """Rows/s between the first and the last part file seen (the parts after the first, at
    ``part_rows`` each): the job's rate once its actors run, without its start."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) * part_rows / (times[-1] - times[0])


def key_values(line: str) -> dict:
    """``a=1 b=x`` -> ``{"a": 1.0, "b": "x"}`` (the job's summary line)."""
    out: dict = {}
    for key, _, value in (item.partition("=") for item in line.split()):
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    return out


def stderr_line(text: str) -> None:
    print(f"[billion {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rate(rows: int, seconds: float) -> float | None:
    return rows / seconds if seconds > 0 else None


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def part_files(staging: Path) -> list[str]:
    """The complete part files in a staging area now (a part's file appears under its name
    only after its record: ``Staging.publish_part``); temporary and hidden entries skipped."""
    try:
        entries = list(os.scandir(staging))
    except FileNotFoundError:
        return []
    return [e.name for e in entries if e.name.endswith(".parquet") and e.name[0] not in "_."]


CHUNKS_LINE = re.compile(r"(\d+) of (\d+) chunks done, (\d+) to do")


class Job:
    """``python jobs/transform.py --config FILE`` as a user runs it, in a session of its own
    (so that its process group is its own to kill). Its output lines are kept with the time
    each arrived; its VmHWM is sampled while it runs (the last sample before it exits)."""

    def __init__(self, config: Path, log: Path) -> None:
        argv = [sys.executable, str(REPO / "jobs" / "transform.py"), "--config", str(config)]
        self.argv, self.log = argv, log
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=child_env(),
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.peak_rss_mb: float | None = None
        self.killed_pids = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log, "w") as log:
            for line in self.proc.stdout:
                self.lines.append((time.perf_counter() - self.start, line.rstrip("\n")))
                log.write(line)

    def sample(self) -> None:
        mb = hwm_mb(self.proc.pid)
        if mb is not None:
            self.peak_rss_mb = max(self.peak_rss_mb or 0.0, mb)

    def kill(self) -> None:
        """SIGKILL the job's process group and every process under it (Ray's workers sit in
        process groups of their own), as an OOM killer or a lost node would end it."""
        import psutil

        try:
            below = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            below = []
        os.killpg(self.proc.pid, signal.SIGKILL)
        for process in below:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(below, timeout=30)
        self.killed_pids = len(below) + 1

    def wait(self) -> tuple[int, float]:
        """``(exit status, seconds since start)`` once it has ended and its output is read."""
        code = self.proc.wait()
        seconds = time.perf_counter() - self.start
        self._reader.join()
        return code, seconds

    def first(self, pattern: str | re.Pattern) -> tuple[float, re.Match] | None:
        """``(seconds since start, match)`` of the first output line matching ``pattern``."""
        for at, line in self.lines:
            found = re.search(pattern, line)
            if found:
                return at, found
        return None


def watch(job: Job, staging: Path, stop_at: int | None, label: str, every_s: float) -> dict:
    """Poll the staging area until the job ends, or until ``stop_at`` part files are there
    (then kill it). Returns ``{file: seconds since the job's start when first seen}``."""
    seen: dict[str, float] = {name: 0.0 for name in part_files(staging)}
    before, last = len(seen), time.perf_counter()
    while job.proc.poll() is None:
        job.sample()
        now = time.perf_counter() - job.start
        for name in part_files(staging):
            seen.setdefault(name, now)
        if stop_at is not None and len(seen) >= stop_at:
            job.kill()
            break
        if time.perf_counter() - last >= every_s:
            last = time.perf_counter()
            stderr_line(f"{label}: {len(seen)} part files ({len(seen) - before} new), {now:.0f} s")
        time.sleep(0.05)
    end = time.perf_counter() - job.start
    for name in part_files(staging):  # what the last interval wrote
        seen.setdefault(name, end)
    return seen
