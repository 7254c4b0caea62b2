"""Recorded measurements: ``results/<device-model>.json``, schema-versioned, written atomically.

One file per device model, holding the measured peaks and one record per (op, stage, size, dtype).
A new measurement replaces the record with the same key and keeps every other. Files are written to
a temporary file and renamed over the old one, so an interrupted run never leaves half a file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import tempfile
from pathlib import Path

SCHEMA = 1

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_RESULTS", REPO_ROOT / "results"))


def slug(device_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown-device"


def path_for(device_name: str) -> Path:
    return results_dir() / f"{slug(device_name)}.json"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def environment() -> dict:
    """Device and versions, recorded with every figure."""
    import numba
    import numpy

    from . import device, library_peers

    env = {"python": platform.python_version(), "numba": numba.__version__, "numpy": numpy.__version__}
    try:
        from importlib.metadata import version

        env["numba_cuda"] = version("numba-cuda")
    except Exception:
        env["numba_cuda"] = "unknown"
    probe = device.probe()
    env["cuda_driver"] = probe.driver_version
    env["mode"] = device.mode()
    if not device.is_simulator() and device.mode() == "gpu":
        from numba import cuda

        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        env["device"] = name
        env["compute_capability"] = ".".join(map(str, dev.compute_capability))
        env["sm_count"] = dev.MULTIPROCESSOR_COUNT
        env["l2_bytes"] = dev.L2_CACHE_SIZE
        try:
            env["cuda_runtime"] = ".".join(map(str, cuda.runtime.get_version()))
        except Exception:
            pass
    else:
        env["device"] = "simulator"
    env.update(library_peers.versions())
    return env


def empty(device_name: str) -> dict:
    return {"schema": SCHEMA, "device": device_name, "peaks": {}, "records": []}


def load(path: Path) -> dict:
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, this workbench reads schema {SCHEMA}")
    return data


def load_all() -> list[dict]:
    """Every results file, newest records first within each."""
    out = []
    for p in sorted(results_dir().glob("*.json")):
        try:
            out.append(load(p))
        except (ValueError, json.JSONDecodeError):
            continue
    return out


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def record_key(r: dict) -> tuple:
    return (r["op"], r["stage"], tuple(r["size"]), r["dtype"])


def merge(data: dict, records: list[dict]) -> dict:
    new_keys = {record_key(r) for r in records}
    kept = [r for r in data["records"] if record_key(r) not in new_keys]
    data["records"] = kept + list(records)
    return data


def save_records(device_name: str, records: list[dict], peaks: dict | None = None) -> Path:
    """Add (or replace) records in this device's file, atomically."""
    path = path_for(device_name)
    data = load(path) if path.exists() else empty(device_name)
    merge(data, records)
    if peaks:
        data["peaks"] = peaks
    write_atomic(path, data)
    return path


def stored_peaks(device_name: str) -> dict | None:
    """The peaks recorded for this device model, if a run measured them (else None: measure them)."""
    path = path_for(device_name)
    if not path.exists():
        return None
    stored = load(path).get("peaks") or {}
    return stored if stored.get("copy_gbps") else None


def records_for(op: str, data: dict) -> list[dict]:
    return [r for r in data["records"] if r["op"] == op]


def headline(recs: list[dict], size) -> list[dict]:
    """The records at ``size`` (an operator's headline size); if none were taken there, at the largest
    size recorded."""
    import math

    size = [int(d) for d in (size if isinstance(size, (tuple, list)) else (size,))] if size is not None else None
    if size is None or not any(r["size"] == size for r in recs):
        size = max((r["size"] for r in recs), key=math.prod, default=None)
    return [r for r in recs if r["size"] == size]


def latest_file_with(op: str, files: list[dict] | None = None) -> dict | None:
    """The recorded file with the newest records for ``op`` (what plots show without a GPU), among
    ``files`` (default: ``load_all()``; a caller asking for every operator reads them once)."""
    best, best_date = None, ""
    for data in load_all() if files is None else files:
        recs = records_for(op, data)
        if recs:
            date = max(r["date"] for r in recs)
            if date > best_date:
                best, best_date = data, date
    return best
