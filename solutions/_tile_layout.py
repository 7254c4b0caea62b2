"""Where a tile's bytes go in shared memory, shared by the tensor-core GEMMs (``gemm[fp16]``, ``gemm[int8]``).

A ladder module may not import another ladder (the exercise generator refuses a module that imports an
answer key), so the two pieces both GEMMs use live here: :func:`chunk_offset`, the XOR swizzle of a
tile's 16-byte chunks, and :func:`aligned`, the launchers' test that their operands start where
``cp.async`` (16 bytes) or a word view (4 bytes) may read them. Not a ladder: its name starts with
``_``, so the registry skips it.
"""

from numba import cuda

from workbench.device import is_simulator


# forceinline=True: NVVM inlines the compiled function into each kernel (see the note in hgemm.py on why
# the tensor-core kernels use it rather than numba's inline=True).
@cuda.jit(device=True, forceinline=True)
def chunk_offset(row, chunk, chunks_per_row, swizzle):
    """Byte offset of 16-byte chunk ``chunk`` of tile row ``row``. Swizzled, the chunk index is XORed
    with bits of the row: rows of >= 8 chunks (128 bytes) XOR the low 3 bits with row % 8; rows of 4
    chunks (two rows share a 128-byte line) XOR with (row // 2) % 4. Either way the 8 rows one
    ldmatrix phase reads, at the same logical chunk, sit in 8 different 16-byte bank groups."""
    if swizzle:
        if chunks_per_row >= 8:
            chunk = chunk ^ (row % 8)
        else:
            chunk = chunk ^ ((row // 2) % 4)
    return (row * chunks_per_row + chunk) * 16


def aligned(nbytes, *arrays) -> bool:
    """Do all these device arrays start on an ``nbytes`` boundary?

    In the simulator, always, as ``_vector_io.aligned16`` answers: where a simulated array starts is
    host memory that a launcher may not look at (the grader refuses ``.ctypes`` of a device array on
    the host), and the emulated ``cp.async`` and word loads read any address."""
    if is_simulator():
        return True
    return all(a.__cuda_array_interface__["data"][0] % nbytes == 0 for a in arrays)
