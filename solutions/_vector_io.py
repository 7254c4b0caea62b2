"""16-byte loads and stores of four 4-byte elements, which numba does not emit on its own.

A CUDA C++ kernel reads a ``float4`` with one ``ld.global.v4.f32`` instruction: 16 bytes, four
elements, one instruction and one address computation. numba has no float4 array, and the compiler
will not merge four neighbouring ``x[i]``, ``x[i + 1]``, ... loads into one vector load either: it
cannot prove that ``x[i]`` sits on a 16-byte boundary (a misaligned vector access is an error on a
GPU, so it does not guess). :func:`load4` and :func:`store4` say it for the compiler: they are
numba intrinsics (``numba.cuda.extending.intrinsic``, the public way to add an operation) that emit
one LLVM ``load <4 x float>, align 16`` (``store``), which becomes ``ld.global.v4.f32``
(``st.global.v4.f32``).

The caller promises what the instruction needs: ``i`` is a multiple of 4 and the array's first
element is 16-byte aligned (:func:`aligned16` checks the second on the host; a fresh device
allocation always is, a view that starts mid-buffer may not be). In numba's CUDA simulator, which
runs kernels as Python, the two are plain element-by-element functions with the same meaning, and
every array counts as aligned. :func:`load2` and :func:`store2` are the same for two elements, one 8-byte
``ld.global.v2.f32`` (``i`` even, the array 8-byte aligned, which a 16-byte aligned one is).

:func:`load8` and :func:`store8` are the same 16-byte access for arrays of 2-byte elements (fp16 or bf16
bits): eight halves in one instruction, handed over as four 32-bit words of two halves each (element
``i`` in the low 16 bits of the first word: little-endian). numba-cuda 0.30 has no half2 type, so a
kernel takes a word apart with :func:`low_half` / :func:`high_half` and puts one together with
:func:`pack`; the conversions between the two 16-bit formats and float32 (:func:`f16_to_float`,
:func:`float_to_f16`, :func:`bf16_to_float`, :func:`float_to_bf16`) are a few PTX instructions each.

The row helpers at the end (:func:`flat_view`, :func:`rows_fit_vectors`, :func:`load_chunk`,
:func:`store_chunk`, :func:`expect_row_width`, :func:`capped`) serve the kernels that hold a matrix row in
registers (softmax's and the norms' ``by_shape`` stages); the shared-row helpers after them
(:func:`copy_row_to_shared`, :func:`launch_shared_row`) serve the same stages' kernel for rows too wide for
registers, which holds the row in shared memory instead.

Shared by ``activations``, ``reductions`` and other ladders; not a ladder (its name starts with ``_``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int16, int32, uint16, uint32, uint64
from numba.cuda import libdevice

from solutions._ptx import (cp_async_chunk4_s32, cp_async_chunk16_s32, cp_async_commit, cp_async_wait_pending,
                            shared_address32)
from workbench.device import is_simulator
from workbench.simulator.counters import vector_access
from workbench.ladder import InputError

VECTOR_BYTES = 16
HALVES_PER_VECTOR = 8  # 2-byte elements in one 16-byte access (load8 / store8)
LOW = uint32(0xFFFF)
SIXTEEN = uint32(16)


def aligned16(*arrays) -> bool:
    """Do all these device arrays start on a 16-byte boundary (so that :func:`load4` may read them)?

    In the simulator, always: its load4 reads element by element, which any address allows, and where
    a simulated array starts is host memory that a stage may not look at (the grader refuses it)."""
    if is_simulator():
        return True
    return all(a.__cuda_array_interface__["data"][0] % VECTOR_BYTES == 0 for a in arrays)


if is_simulator():
    @vector_access
    @cuda.jit(device=True)
    def load4(a, i):
        """Elements i, i + 1, i + 2, i + 3 of a 1-D array of 4-byte elements (i a multiple of 4)."""
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    @vector_access
    @cuda.jit(device=True)
    def store4(a, i, v0, v1, v2, v3):
        """a[i], ..., a[i + 3] = v0, ..., v3 (i a multiple of 4)."""
        a[i] = v0
        a[i + 1] = v1
        a[i + 2] = v2
        a[i + 3] = v3

    @vector_access
    @cuda.jit(device=True)
    def load2(a, i):
        """Elements i, i + 1 of a 1-D array of 4-byte elements (i even)."""
        return a[i], a[i + 1]

    @vector_access
    @cuda.jit(device=True)
    def store2(a, i, v0, v1):
        """a[i], a[i + 1] = v0, v1 (i even)."""
        a[i] = v0
        a[i + 1] = v1

    @vector_access
    @cuda.jit(device=True)
    def load8(a, i):
        """Elements i .. i + 7 of a 1-D array of 2-byte elements (i a multiple of 8), as four 32-bit words
        of two elements each (the lower-indexed element in the low 16 bits)."""
        return (pack(a[i], a[i + 1]), pack(a[i + 2], a[i + 3]), pack(a[i + 4], a[i + 5]),
                pack(a[i + 6], a[i + 7]))

    @vector_access
    @cuda.jit(device=True)
    def store8(a, i, w0, w1, w2, w3):
        """a[i], ..., a[i + 7] = the halves of words w0, ..., w3 (i a multiple of 8), low half first."""
        for k, w in enumerate((w0, w1, w2, w3)):
            a[i + 2 * k] = low_half(w)
            a[i + 2 * k + 1] = high_half(w)

    # This numba's CUDA simulator leaves libdevice unimplemented (each function returns None): the
    # conversions are NumPy's, on the same bits.
    @cuda.jit(device=True)
    def f16_to_float(bits):
        """The fp16 whose 16 bits are the low half of ``bits``, as a float32."""
        return np.float32(np.uint16(int(bits) & 0xFFFF).view(np.float16))

    @cuda.jit(device=True)
    def float_to_f16(value):
        """float32 -> fp16 bits, rounded to nearest even (past 65504: inf), in a uint32."""
        with np.errstate(over="ignore"):
            return uint32(np.float16(np.float32(value)).view(np.uint16))

    @cuda.jit(device=True)
    def as_float32(bits):
        return np.uint32(int(bits) & 0xFFFFFFFF).view(np.float32)

    @cuda.jit(device=True)
    def shared_offset(words, i):
        """Where element i of a shared array of 4-byte words lies, in bytes (here: from the array's start)."""
        return uint32(4 * i)

    @cuda.jit(device=True)
    def shared_add_at(words, offset, value):
        """words[offset // 4] += value, atomically, the result not returned (offset from shared_offset)."""
        cuda.atomic.add(words, offset >> uint32(2), value)

    @cuda.jit(device=True)
    def as_bits32(value):
        return uint32(np.float32(value).view(np.uint32))

else:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    def _vector_pointer(context, builder, array_type, array, index, lanes=4):
        """The address of element ``index`` as a pointer to ``lanes`` elements (4: a 16-byte access, 2: 8)."""
        data = context.make_array(array_type)(context, builder, value=array).data
        element = builder.gep(data, [index])
        vector = ir.VectorType(context.get_value_type(array_type.dtype), lanes)
        return builder.bitcast(element, vector.as_pointer())

    def _vector_pointer_words(context, builder, array_type, array, index):
        """The address of 2-byte element ``index`` as a pointer to four 32-bit words (16 bytes)."""
        data = context.make_array(array_type)(context, builder, value=array).data
        element = builder.gep(data, [index])
        return builder.bitcast(element, ir.VectorType(ir.IntType(32), 4).as_pointer())

    def _check_halves(array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype.bitwidth == 16):
            raise TypingError(f"load8/store8 take a 1-D array of 2-byte elements, got {array}")
        if not isinstance(index, types.Integer):
            raise TypingError(f"load8/store8 take an integer index, got {index}")

    def _check(array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype.bitwidth == 32):
            raise TypingError(f"load4/store4/load2/store2 take a 1-D array of 4-byte elements, got {array}")
        if not isinstance(index, types.Integer):
            raise TypingError(f"load4/store4/load2/store2 take an integer index, got {index}")

    def _vector_load(array, index, lanes):
        """The typing and code of a ``lanes``-element vector load (load4, load2)."""
        _check(array, index)
        sig = types.UniTuple(array.dtype, lanes)(array, index)

        def codegen(context, builder, signature, args):
            pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1], lanes)
            vector = builder.load(pointer, align=4 * lanes)
            parts = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k)) for k in range(lanes)]
            return context.make_tuple(builder, signature.return_type, parts)

        return sig, codegen

    def _vector_store(array, index, values):
        """The typing and code of a vector store of ``values`` (store4, store2)."""
        _check(array, index)
        lanes = len(values)
        sig = types.void(array, index, *values)

        def codegen(context, builder, signature, args):
            element_type = signature.args[0].dtype
            pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1], lanes)
            vector = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k, (value, value_type) in enumerate(zip(args[2:], signature.args[2:])):
                value = context.cast(builder, value, value_type, element_type)
                vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), k))
            builder.store(vector, pointer, align=4 * lanes)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def load4(typingctx, array, index):
        """Elements i, i + 1, i + 2, i + 3 of a 1-D array of 4-byte elements, in one 16-byte load."""
        return _vector_load(array, index, 4)

    @intrinsic
    def store4(typingctx, array, index, v0, v1, v2, v3):
        """a[i], ..., a[i + 3] = v0, ..., v3 in one 16-byte store."""
        return _vector_store(array, index, (v0, v1, v2, v3))

    @intrinsic
    def load2(typingctx, array, index):
        """Elements i, i + 1 of a 1-D array of 4-byte elements (i even), in one 8-byte load."""
        return _vector_load(array, index, 2)

    @intrinsic
    def store2(typingctx, array, index, v0, v1):
        """a[i], a[i + 1] = v0, v1 (i even) in one 8-byte store."""
        return _vector_store(array, index, (v0, v1))


    @intrinsic
    def load8(typingctx, array, index):
        """Elements i .. i + 7 of a 1-D array of 2-byte elements, in one 16-byte load, as four 32-bit words
        of two elements each (the lower-indexed element in the low 16 bits)."""
        _check_halves(array, index)
        sig = types.UniTuple(types.uint32, 4)(array, index)

        def codegen(context, builder, signature, args):
            pointer = _vector_pointer_words(context, builder, signature.args[0], args[0], args[1])
            vector = builder.load(pointer, align=VECTOR_BYTES)
            parts = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, parts)

        return sig, codegen

    @intrinsic
    def store8(typingctx, array, index, w0, w1, w2, w3):
        """a[i], ..., a[i + 7] = the halves of words w0, ..., w3, in one 16-byte store."""
        _check_halves(array, index)
        sig = types.void(array, index, w0, w1, w2, w3)

        def codegen(context, builder, signature, args):
            pointer = _vector_pointer_words(context, builder, signature.args[0], args[0], args[1])
            vector = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k, (value, value_type) in enumerate(zip(args[2:], signature.args[2:])):
                value = context.cast(builder, value, value_type, types.uint32)
                vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), k))
            builder.store(vector, pointer, align=VECTOR_BYTES)
            return context.get_dummy_value()

        return sig, codegen

    def _asm(builder, text, constraints, args, result=ir.VoidType()):
        fty = ir.FunctionType(result, [a.type for a in args])
        return builder.call(ir.InlineAsm(fty, text, constraints, side_effect=True), list(args))

    @intrinsic
    def shared_offset(typingctx, words, index):
        """Where element ``index`` of a shared array of 4-byte words lies in the block's shared memory, in
        bytes (``cvta.to.shared``, then 32 bits of it): a 32-bit address to which a kernel adds byte offsets itself."""
        _check(words, index)

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
            generic = builder.ptrtoint(builder.gep(data, [args[1]]), ir.IntType(64))
            return _asm(builder, "{ .reg .u64 s; cvta.to.shared.u64 s, $1; cvt.u32.u64 $0, s; }", "=r,l", [generic],
                        ir.IntType(32))

        return types.uint32(words, index), codegen

    @intrinsic
    def shared_add_at(typingctx, words, offset, value):
        """Add ``value`` to the 4-byte word at shared address ``offset`` (from shared_offset plus whole
        words), atomically, its old value not asked for: one ``red.shared.add.u32`` on an address the
        kernel computed, where ``cuda.atomic.add(words, i, value)`` makes the compiler scale i by 4 and
        add the array's base again at every update. ``words`` is only for the simulator."""
        def codegen(context, builder, signature, args):
            at = context.cast(builder, args[1], signature.args[1], types.uint32)
            v = context.cast(builder, args[2], signature.args[2], types.uint32)
            _asm(builder, "red.shared.add.u32 [$0], $1;", "r,r,~{memory}", [at, v])
            return context.get_dummy_value()

        return types.void(words, offset, value), codegen

    @cuda.jit(device=True, inline=True)
    def f16_to_float(bits):
        """The fp16 whose 16 bits are the low half of ``bits``, as a float32: one ``cvt.f32.f16``."""
        return libdevice.half2float(int16(bits & LOW))

    @cuda.jit(device=True, inline=True)
    def float_to_f16(value):
        """float32 -> fp16 bits (round to nearest even, subnormals kept, past 65504 inf): ``cvt.rn.f16.f32``."""
        return uint32(uint16(libdevice.float2half_rn(value)))

    @cuda.jit(device=True, inline=True)
    def as_float32(bits):
        return libdevice.int_as_float(int32(bits))

    @cuda.jit(device=True, inline=True)
    def as_bits32(value):
        return uint32(libdevice.float_as_int(value))


if is_simulator():
    @cuda.jit(device=True)
    def byte_of(word, k):
        """Byte k (0: the lowest) of a 32-bit word, zero-extended."""
        return uint32((uint32(word) >> uint32(8 * k)) & uint32(0xFF))
else:
    @cuda.jit(device=True, inline=True)
    def byte_of(word, k):
        """Byte k (0: the lowest) of a 32-bit word, zero-extended: one PRMT (byte permute; selector 0x444k:
        byte k of the word, then three bytes of the zero word). Written as a shift and a mask, the byte
        is merged by the compiler with what is done to it next (a shift left: (w >> 1) & 0x7F80), which
        leaves an add for later; a PRMT's result is shifted and added by one LEA."""
        return uint32(libdevice.byte_perm(int32(word), int32(0), int32(0x4440 + k)))


# -- load4 / store4 with a cache-policy qualifier on the instruction -------------------------------------------

_HINTED = {}  # (load or store, qualifier) -> its intrinsic: one per qualifier, shared by every kernel


def load4_hinted(qualifier: str):
    """load4 as ``ld.global{qualifier}.v4.f32``: e.g. ``.cs`` (streaming: the line is first to be evicted),
    ``.lu`` (last use); ``""`` gives load4 itself. LLVM has no way to say these, so it is inline PTX on
    the element's generic address (a device allocation's generic address is its global one). In the
    simulator: load4 (a hint changes no value)."""
    if is_simulator() or not qualifier:
        return load4
    key = ("load", qualifier)
    if key not in _HINTED:
        text = "ld.global" + qualifier + ".v4.f32 {$0, $1, $2, $3}, [$4];"

        @intrinsic
        def hinted_load4(typingctx, array, index):
            _check(array, index)

            def codegen(context, builder, signature, args):
                data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
                address = builder.ptrtoint(builder.gep(data, [args[1]]), ir.IntType(64))
                four = ir.LiteralStructType([ir.FloatType()] * 4)
                vector = _asm(builder, text, "=f,=f,=f,=f,l", [address], four)
                parts = [builder.extract_value(vector, k) for k in range(4)]
                return context.make_tuple(builder, signature.return_type, parts)

            return types.UniTuple(types.float32, 4)(array, index), codegen
        _HINTED[key] = hinted_load4
    return _HINTED[key]


def store4_hinted(qualifier: str):
    """store4 as ``st.global{qualifier}.v4.f32``: e.g. ``.cs`` (streaming: written once, not read again
    soon, so the L2 evicts it first); ``""`` gives store4 itself. In the simulator: store4."""
    if is_simulator() or not qualifier:
        return store4
    key = ("store", qualifier)
    if key not in _HINTED:
        text = "st.global" + qualifier + ".v4.f32 [$0], {$1, $2, $3, $4};"

        @intrinsic
        def hinted_store4(typingctx, array, index, v0, v1, v2, v3):
            _check(array, index)

            def codegen(context, builder, signature, args):
                data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
                address = builder.ptrtoint(builder.gep(data, [args[1]]), ir.IntType(64))
                values = [context.cast(builder, v, t, types.float32) for v, t in zip(args[2:], signature.args[2:])]
                _asm(builder, text, "l,f,f,f,f,~{memory}", [address] + values)
                return context.get_dummy_value()

            return types.void(array, index, v0, v1, v2, v3), codegen
        _HINTED[key] = hinted_store4
    return _HINTED[key]


# -- 32-bit words of two halves, and the two 16-bit formats (the same code in the simulator) -----------

@cuda.jit(device=True, inline=True)
def pack(low, high):
    """Two halves' bits in one 32-bit word, ``low`` first in memory (little-endian): ``mov.b32 {lo, hi}``."""
    return uint32(uint32(low) | (uint32(high) << SIXTEEN))


@cuda.jit(device=True, inline=True)
def low_half(word):
    return uint32(word) & LOW


@cuda.jit(device=True, inline=True)
def high_half(word):
    return uint32(word) >> SIXTEEN


@cuda.jit(device=True, inline=True)
def bf16_to_float(bits):
    """The bf16 in the low half of ``bits`` as a float32: its 16 bits become a float32's top half."""
    return as_float32(uint32(bits) << SIXTEEN)


@cuda.jit(device=True, inline=True)
def float_to_bf16(value):
    """float32 -> bf16 bits, rounded to nearest, ties to even: add 0x7FFF plus the lowest bit kept, then
    drop the low 16 bits (a carry rounds up, into the exponent if need be, up to inf). A NaN stays a
    NaN: rounding could carry its payload into inf."""
    bits = as_bits32(value)
    rounded = uint32(bits + uint32(0x7FFF) + ((bits >> SIXTEEN) & uint32(1)))
    return uint32(rounded >> SIXTEEN) if value == value else uint32(0x7FC0)


# -- rows held in registers: 16-byte chunks of a row of a row-major float32 matrix ---------------------------

def flat_view(a):
    """The matrix as one long vector (a view: no copy), as load4 takes it; torch/CuPy arrays via numba."""
    a = a if hasattr(a, "is_c_contiguous") else cuda.as_cuda_array(a)
    return a.reshape(a.size)


def rows_fit_vectors(x, *others):
    """Can rows be read and written 16 bytes at a time? Every row must start on a 16-byte boundary:
    a width that is a multiple of 4 floats, and arrays that start on one (aligned16)."""
    return x.shape[1] % 4 == 0 and aligned16(x, *others)


def expect_row_width(cols, limit, kernel, held_in="registers"):
    if cols > limit:
        raise InputError(f"{kernel} holds rows of at most {limit} columns in {held_in}; got {cols} "
                         "(by_shape picks the kernel)")


_CAPPED = {}  # (kernel's Python function, registers) -> that kernel compiled with the cap


def capped(kernel, registers):
    """``kernel`` compiled with at most ``registers`` registers a thread (None: as ptxas chooses), so
    that more blocks, so more rows' loads, fit on an SM (65536 registers). Caps timed side by side on
    an H200: results/runs/gpu_half_norms.json."""
    if registers is None:
        return kernel
    key = (kernel.py_func, registers)
    if key not in _CAPPED:
        _CAPPED[key] = cuda.jit(max_registers=registers)(kernel.py_func)
    return _CAPPED[key]


@cuda.jit(device=True, inline=True)
def load_chunk(flat, base, c, cols, vector, fill):
    """Columns c .. c + 3 of the row that starts at flat[base] (c a multiple of 4): one 16-byte load
    where the row allows it, else one load per column; columns past the row's end read as ``fill``."""
    if vector and c < cols:  # a width that is a multiple of 4: the whole chunk is inside the row
        return load4(flat, base + c)
    one = uint64(1)
    return (flat[base + c] if c < cols else fill,
            flat[base + c + one] if c + one < cols else fill,
            flat[base + c + uint64(2)] if c + uint64(2) < cols else fill,
            flat[base + c + uint64(3)] if c + uint64(3) < cols else fill)


@cuda.jit(device=True, inline=True)
def store_chunk(flat, base, c, cols, vector, v0, v1, v2, v3):
    """The columns of c .. c + 3 that lie inside the row, written 16 bytes at once where possible."""
    if vector:
        if c < cols:
            store4(flat, base + c, v0, v1, v2, v3)
        return
    if c < cols:
        flat[base + c] = v0
    if c + uint64(1) < cols:
        flat[base + c + uint64(1)] = v1
    if c + uint64(2) < cols:
        flat[base + c + uint64(2)] = v2
    if c + uint64(3) < cols:
        flat[base + c + uint64(3)] = v3


# -- rows held in shared memory: a row too wide for registers, read from memory once ---------------------------
# A block per row copies its row into dynamic shared memory (cols rounded up to a whole chunk of 4 floats), each
# thread the chunks c = 4 * (t + threads * k) that it alone reads back later: no barrier between the copy and
# the sums. 16 bytes a copy (cp.async) where the row allows it, else a column at a time.

SHARED_ROW_FITS = 56 * 1024  # floats: 224 KiB, inside the 227 KiB an sm_90 block may opt in to (the sums' buffers too)
SHARED_ROW_STATIC_BYTES = 256  # the shared-row kernels' own shared buffers: at most two of 32 floats (the block sums)
SHARED_ALIGN16 = None if is_simulator() else 16  # the row's 16-byte alignment (numba's simulator takes no alignment=)


def shared_row_bytes(cols):
    """Bytes of dynamic shared memory that hold a row of ``cols`` floats, whole 16-byte chunks."""
    return 16 * ((cols + 3) // 4)


def shared_row_threads(cols, most, chunks=1):
    """Threads for a block that holds a row in shared memory: ``chunks`` chunks of 4 columns each at the least
    (fewer threads, so more blocks an SM, where rows are narrow), a whole number of warps, at most ``most``."""
    threads = -(-((cols + 3) // 4) // chunks)
    return min(most, 32 * max(1, (threads + 31) // 32))


def launch_shared_row(kernel, rows, threads, cols, *args):
    """kernel[rows, threads] with the row's shared memory: past 48 KiB (12288 columns) only once the kernel
    has opted in (set_max_dynamic_shared_memory), and with at most 65536 / threads registers a thread, so
    that a block of 1024 threads fits an SM's register file (ptxas would otherwise choose for itself)."""
    from workbench.shared_memory import set_max_dynamic_shared_memory

    kernel = capped(kernel, min(255, 65536 // threads))
    nbytes = shared_row_bytes(cols)
    # The opt-in covers the kernels' static buffers too (at most two of 32 floats): the GPU bounds only the dynamic
    # part by it, the simulator the sum.
    set_max_dynamic_shared_memory(kernel, args, nbytes + SHARED_ROW_STATIC_BYTES)
    kernel[rows, threads, 0, nbytes](*args)


@cuda.jit(device=True, inline=True)
def copy_row_to_shared(flat, base, cols, vector, row, fill):
    """row[:] = the row that starts at flat[base], columns past its end ``fill``: this thread's chunks
    c = 4 * (t + threads * k), all of them in flight at once (a cp.async does not wait for its data), then
    one wait for them to land. Only this thread may read its chunks before a barrier. Columns are counted
    in 32 bits (a row in shared memory is at most 57344 floats): fewer instructions than 64."""
    cols = uint32(cols)
    c = uint32(4) * uint32(cuda.threadIdx.x)
    step = uint32(4) * uint32(cuda.blockDim.x)
    row_at = uint64(shared_address32(row.ctypes.data))  # the shared window's 32-bit address, as the GEMMs'
    src_at = flat.ctypes.data + uint64(base) * uint64(4)
    while c < cols:
        if vector:  # a width that is a multiple of 4, rows on 16-byte boundaries
            cp_async_chunk16_s32(row_at + uint64(4 * c), src_at + uint64(4 * c), 16)
        else:
            for i in range(4):
                if c + uint32(i) < cols:
                    cp_async_chunk4_s32(row_at + uint64(4 * (c + uint32(i))), src_at + uint64(4 * (c + uint32(i))), 4)
                else:
                    row[c + uint32(i)] = fill
        c += step
    cp_async_commit()
    cp_async_wait_pending(0)
