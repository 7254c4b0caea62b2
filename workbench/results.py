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


# The operators' names before variants were axes of one family (``softmax_fp16`` is ``softmax[fp16]``):
# records made under an old name are read under the new one, so that no figure is lost, and the CLI
# answers an old name with the new one.
_ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")
RENAMED = {
    "reduce_max": "reduction[max]", "reduce_min": "reduction[min]", "reduce_mean": "reduction[mean]",
    "reduce_sumsq": "reduction[sumsq]", "sum_rows": "reduction[rows]", "sum_cols": "reduction[cols]",
    **{f"{short}_{axis}": f"reduction[{combine},{axis}]" for short, combine in
       (("amax", "max"), ("amin", "min"), ("mean", "mean")) for axis in ("rows", "cols")},
    "gelu_fp16": "elementwise[fp16]", "gelu_bf16": "elementwise[bf16]",
    **{f"act_{f}": f"activation[{f}]" for f in _ACTIVATIONS},
    **{f"act_{f}_{d}": f"activation[{f},{d}]" for f in _ACTIVATIONS for d in ("fp16", "bf16")},
    **{f"{op}_{d}": f"{op}[{d}]" for op in ("softmax", "layernorm", "rmsnorm", "attention") for d in ("fp16", "bf16")},
    "bias_relu_layernorm": "layernorm[bias_relu]", "residual_layernorm": "layernorm[residual]",
    "gemm_bias_gelu": "gemm[bias_gelu]", "gemm_batched": "gemm[batched]",
    "hgemm": "gemm[fp16]", "hgemm_bf16": "gemm[bf16]", "int8_gemm": "gemm[int8]",
    "rope_interleaved": "rope[interleaved]", "attention_rope": "attention[rope]",
    "conv2d_general": "conv2d[general]", "conv2d_bias_relu": "conv2d[bias_relu]",
    "conv2d_bias_add_relu": "conv2d[bias_add_relu]", "conv_bn_folded": "conv2d[bn_folded]",
    "depthwise3x3_nhwc": "depthwise3x3[nhwc]",
    "maxpool2d": "pool2d[max]", "avgpool2d": "pool2d[mean]", "global_avgpool": "pool2d[mean,global]",
    "batchnorm_train": "batchnorm[train]", "batchnorm_infer": "batchnorm[infer]",
    "allreduce_rmsnorm": "allreduce[rmsnorm]",
}


def renamed_records(records: list[dict]) -> list[dict]:
    """Records with each old operator name replaced by its name today (RENAMED)."""
    for r in records:
        if r.get("op") in RENAMED:
            r["op"] = RENAMED[r["op"]]
    return records


def empty(device_name: str) -> dict:
    return {"schema": SCHEMA, "device": device_name, "peaks": {}, "records": []}


def load(path: Path) -> dict:
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, this workbench reads schema {SCHEMA}")
    renamed_records(data.get("records", []))
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
