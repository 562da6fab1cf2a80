"""What a timing was measured on, recorded beside it: the CPU model, the cores this process may
use, memory, the load average and the thread pools of the numeric libraries. Timings on the
shared, noisy machines this project runs on mean little without it (CONTRIBUTING: read
``/proc/cpuinfo`` before explaining a timing)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["describe"]


def _proc_field(path: str, key: str) -> str | None:
    """The first ``key: value`` line of a ``/proc`` file, or None off Linux."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def describe() -> dict[str, Any]:
    """This machine and process, now: JSON-ready."""
    affinity = getattr(os, "sched_getaffinity", None)
    memory = _proc_field("/proc/meminfo", "MemTotal")
    out: dict[str, Any] = {
        "cpu": _proc_field("/proc/cpuinfo", "model name")
        or platform.processor()
        or platform.machine(),
        "cores_usable": len(affinity(0)) if affinity else os.cpu_count(),
        "cores": os.cpu_count(),
        "memory_gb": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "load_avg": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if "torch" in sys.modules:  # only a script that already uses torch pays for its import
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    return out
