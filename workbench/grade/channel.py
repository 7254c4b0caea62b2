"""The grader's channel to its worker: a socket pair, never stdout.

A message is a JSON header and the raw bytes of numpy arrays, framed with a magic word and lengths,
so that a submission printing (with or without a newline) cannot touch it, and anything else on it
is recognised as not the grader's. Nothing read from it is ever unpickled or executed: the grader
reads numbers (dtypes of plain numeric kinds, shapes, bytes) and strings.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time

import numpy as np

MAGIC = b"WBG1"
MAX_HEADER_BYTES = 16 << 20
MAX_ARRAY_BYTES = 64 << 30
# The slowest a host under load moves an array's bytes (through the socket, to and from the GPU): a
# message's arrays may arrive this much later than its deadline, so that moving gigabytes on a busy
# machine is never taken for a call that does not return (an H200 grading four processes at once timed
# out 1-GB calls that take seconds alone). A trickle slower than this still times out.
SLOW_HOST_BYTES_PER_S = 100e6
NUMERIC_KINDS = "biufc"
EXTRA_DTYPES = ("bfloat16",)  # ml_dtypes' formats, sent by name (their numpy type string is only "V2")


def dtype_name(dtype: np.dtype) -> str:
    return dtype.name if dtype.name in EXTRA_DTYPES else dtype.str


def dtype_from_name(name: str) -> np.dtype:
    """A dtype of a plain numeric kind (or one of ml_dtypes' by name); ChannelGarbage otherwise."""
    if name in EXTRA_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise ChannelGarbage(f"an array of dtype {name!r:.40}") from None
    if dtype.kind not in NUMERIC_KINDS:
        raise ChannelGarbage(f"an array of dtype {dtype}")
    return dtype


class ChannelClosed(EOFError):
    """The other end closed the channel (the worker exited or died)."""


class ChannelTimeout(TimeoutError):
    """Nothing (or not all of a message) arrived before the deadline."""


class ChannelGarbage(ValueError):
    """Bytes that are not a message of the grader's arrived on the channel."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, header: dict, arrays=()) -> None:
        arrays = [np.asarray(a, order="C") for a in arrays]  # (ascontiguousarray makes 0-d arrays 1-d)
        header = dict(header, arrays=[{"dtype": dtype_name(a.dtype), "shape": list(a.shape)} for a in arrays])
        data = json.dumps(header).encode()
        self.sock.sendall(MAGIC + struct.pack("<Q", len(data)) + data)
        for a in arrays:
            if a.nbytes:
                self.sock.sendall(memoryview(a.reshape(-1).view(np.uint8)))

    def ready(self, deadline: float) -> bool:
        """Has something (a message, or the other end closing) arrived by ``deadline``? Reads nothing, so
        waiting in steps never cuts a message in two."""
        left = max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([self.sock], [], [], left)
        return bool(readable)

    def receive(self, deadline: float | None = None) -> tuple[dict, list[np.ndarray]]:
        """The next message: (header, arrays). Raises ChannelClosed, ChannelTimeout or ChannelGarbage."""
        head = self._read(len(MAGIC) + 8, deadline)
        if head[:len(MAGIC)] != MAGIC:
            raise ChannelGarbage(f"{bytes(head)[:12]!r} where a message should start")
        (length,) = struct.unpack("<Q", head[len(MAGIC):])
        if length > MAX_HEADER_BYTES:
            raise ChannelGarbage(f"a message header of {length} bytes")
        try:
            header = json.loads(bytes(self._read(length, deadline)))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ChannelGarbage(f"a message header that is not JSON ({exc})") from None
        if not isinstance(header, dict) or not isinstance(header.get("arrays", []), list):
            raise ChannelGarbage("a message header that is not an object")
        metas = [self._array_meta(meta) for meta in header.pop("arrays", [])]
        if deadline is not None:  # the arrays' bytes: time to move them, beyond the deadline for the message
            deadline += sum(nbytes for _, _, nbytes in metas) / SLOW_HOST_BYTES_PER_S
        return header, [self._read_array(meta, deadline) for meta in metas]

    def _array_meta(self, meta) -> tuple[np.dtype, tuple, int]:
        try:
            dtype = dtype_from_name(str(meta["dtype"]))
            shape = tuple(int(n) for n in meta["shape"])
        except (KeyError, TypeError, ValueError):
            raise ChannelGarbage(f"an array description {meta!r:.100}") from None
        if any(n < 0 for n in shape):
            raise ChannelGarbage(f"an array of shape {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > MAX_ARRAY_BYTES:
            raise ChannelGarbage(f"an array of {nbytes} bytes")
        return dtype, shape, nbytes

    def _read_array(self, meta: tuple, deadline) -> np.ndarray:
        dtype, shape, nbytes = meta
        buf = self._read(nbytes, deadline)
        return np.frombuffer(buf, dtype=dtype).reshape(shape) if nbytes else np.empty(shape, dtype)

    def _read(self, n: int, deadline: float | None) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout()
                self.sock.settimeout(min(left, 5.0))
            try:
                count = self.sock.recv_into(view[got:])
            except socket.timeout:
                continue
            except (ConnectionError, OSError) as exc:
                raise ChannelClosed(str(exc)) from None
            if count == 0:
                raise ChannelClosed("the other end closed the channel")
            got += count
        return buf
