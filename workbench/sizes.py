"""Problem sizes typed by a person: parsed, and checked against the operator before anything runs.

``1000``, ``2**20``, ``2^20``, ``1e6`` and ``32768x4096`` parse; a size of the wrong form for the
operator, a zero or negative dimension, or one too large for the device (or for the simulator) is
refused with one line that names the operator's size form and the limit.
"""

from __future__ import annotations

import math

import numpy as np

from .ladder import InputError, Operator, Size, as_size, size_label, to_device

SIM_MAX_BYTES = 1 << 30  # the simulator keeps every array in host memory and runs a thread at a time
SIM_SLOW_ELEMENTS = 1 << 18  # above this many output or input elements the simulator takes minutes
SIM_ELEMENTS_PER_S = 20_000.0  # roughly what the simulator gets through (one Python thread per element)


class SizeError(ValueError):
    """A size that cannot be run; the message is one line for the user."""


def eval_int(text: str) -> int:
    """'4096', '2**28', '2^28', '1e6' -> int, without eval."""
    text = text.strip()
    for power in ("**", "^"):
        if power in text:
            base, _, exp = text.partition(power)
            return int(base) ** int(exp)
    if "e" in text:
        value = float(text)
        if not value.is_integer():
            raise ValueError(text)
        return int(value)
    return int(text)


def parse_size(text: str) -> Size:
    """'32768x4096' -> (32768, 4096); raises SizeError with the accepted forms."""
    try:
        return tuple(eval_int(part) for part in text.lower().replace("×", "x").split("x"))
    except (ValueError, OverflowError):
        raise SizeError(f"size must look like 1000, 2**20, 1e6 or 32768x4096; got {text!r}") from None


def size_arg(text: str) -> Size:
    """The argparse type of every command's ``--size``: one parser, one message for a malformed size."""
    import argparse

    try:
        return parse_size(text)
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seed_arg(text: str) -> int:
    """The argparse type of ``--seed``: numpy's generators take a whole number from 0 up."""
    import argparse

    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"seed must be a whole number from 0 up; got {text!r}")
    return seed


def _elements(size: Size) -> int:
    return math.prod(size)


def device_limit_bytes() -> tuple[int, str]:
    """The most bytes one run may move, and where that limit comes from."""
    from . import device

    if device.is_simulator():
        return SIM_MAX_BYTES, "the simulator's limit"
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return int(total * 0.45), f"45% of this GPU's {total / 2**30:.0f} GiB (inputs, output and their copies)"


VALIDATE_BYTES = 1 << 20  # sizes this small are built and validated before anything runs
# A size a person typed is built and validated up to this many bytes (a fraction of a second): a head size
# of 100000 moves 1.2 MB and must be refused up front, not fail every stage with an infinite error.
TYPED_VALIDATE_BYTES = 64 << 20


def check_size(op: Operator, size: Size) -> Size:
    """Return ``size`` if ``op`` can run it here, else raise SizeError naming what was expected."""
    size = accepted_size(op, size, build_up_to=TYPED_VALIDATE_BYTES)
    limit, why = device_limit_bytes()
    need = int(op.bytes_moved(size))
    if need > limit:
        from . import device

        example = op.sim_sizes[-1] if device.is_simulator() else op.headline_size
        raise SizeError(f"{op.name} at {size_label(size)} moves {need / 2**30:.1f} GiB, more than {why} "
                        f"({limit / 2**30:.1f} GiB); try {size_label(tuple(example) if not isinstance(example, int) else (example,))} "
                        "or smaller")
    return size


def accepted_size(op: Operator, size: Size, build_up_to: int = VALIDATE_BYTES) -> Size:
    """Return ``size`` if it has ``op``'s form and ``op``'s own validation accepts it, whatever the
    machine (``check_size`` adds this machine's memory), else raise SizeError naming what was expected.
    The validation runs on inputs built at ``size`` when it moves at most ``build_up_to`` bytes."""
    size = tuple(size)
    form = op.size_form
    if len(size) != len(op.dims):
        raise SizeError(f"{op.name} takes {form} ({len(op.dims)} number{'s' * (len(op.dims) > 1)}, e.g. "
                        f"{size_label(op.headline_size)}); got {size_label(size)}")
    # A field the operator itself declares as 0 somewhere (attention's CAUSAL flag) may be 0; any other
    # must be at least 1.
    declared = [as_size(s) for s in (*op.sim_sizes, *op.check_sizes, *op.bench_sizes, op.headline_size)]
    flags = {i for i in range(len(op.dims)) if any(s[i] == 0 for s in declared)}
    bad = [f"{name}={n}" for i, (name, n) in enumerate(zip(op.dims, size)) if n < (0 if i in flags else 1)]
    if bad:
        zero = f" ({', '.join(op.dims[i] for i in sorted(flags))} at least 0)" if flags else ""
        raise SizeError(f"{op.name} takes {form} with every number at least 1{zero}; got {', '.join(bad)}")
    # Such a field declared only as 0 or 1 is a switch (CAUSAL): 2 would run as 1 and be recorded as 2.
    switches = [i for i in flags if all(s[i] in (0, 1) for s in declared)]
    not_01 = [f"{op.dims[i]}={size[i]}" for i in switches if size[i] not in (0, 1)]
    if not_01:
        raise SizeError(f"{op.name} takes {form} with {', '.join(op.dims[i] for i in switches)} 0 or 1 "
                        f"(off or on); got {', '.join(not_01)}")
    try:
        need = int(op.bytes_moved(size))
    except InputError as exc:  # a size the operator's own model refuses (spmv's pattern code, ...)
        raise SizeError(str(exc)) from None
    if need <= build_up_to:  # small enough to build: the operator's own validation has the last word
        try:  # (pool2d[max] refuses a plane under 2x2, which its bytes model cannot know)
            inputs = [to_device(a) for a in op.make_inputs(size, np.random.default_rng(0))]
            op.validate(*inputs, to_device(op.make_output(size)))
        except InputError as exc:
            raise SizeError(f"{op.name} at {size_label(size)}: {exc}") from None
    return size


def simulator_warning(op: Operator, size: Size) -> str | None:
    """A warning with an estimate when the simulator will be slow at this size, else None."""
    from . import device

    if not device.is_simulator():
        return None
    work = max(_elements(size), int(op.bytes_moved(size)) // 4)
    if work <= SIM_SLOW_ELEMENTS:
        return None
    minutes = work / SIM_ELEMENTS_PER_S / 60
    return (f"{op.name} at {size_label(size)} in the simulator: about {work:,} elements, roughly "
            f"{minutes:.0f} minute(s) per stage (the simulator runs one Python thread per GPU thread); "
            f"sizes up to {SIM_SLOW_ELEMENTS:,} elements take seconds")
