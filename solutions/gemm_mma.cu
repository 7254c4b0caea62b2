// Tensor-core and async-copy helpers for solutions/gemm.py (stage "tensor_core"), linked into numba kernels with
// cuda.declare_device(..., link=this file). numba compiles this file with NVRTC; with link-time
// optimisation (numba-cuda's default where nvJitLink is installed) the calls are inlined.
//
// numba's ABI for a foreign device function: return int (0: no Python exception), the result through
// the first argument, a pointer. A numba UniTuple(float32, 4) is laid out as four floats in a row.

struct float4_result { float x, y, z, w; };

// d = a @ b + c for one m16n8k8 tile per warp: A 16x8 (row-major), B 8x8 (column-major), TF32 inputs,
// float32 accumulators. Lane l, with g = l / 4 and q = l % 4, holds
//   a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4], a3 = A[g+8][q+4]
//   b0 = B[q][g], b1 = B[q+4][g]
//   c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q], c3 = C[g+8][2q+1]   (and d likewise)
// (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32). The inputs are float32 bit patterns: the
// tensor core reads them as TF32, ignoring their low 13 mantissa bits.
extern "C" __device__ int mma_tf32_m16n8k8(float4_result* d, float a0, float a1, float a2, float a3,
                                           float b0, float b1, float c0, float c1, float c2, float c3)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d->x), "=f"(d->y), "=f"(d->z), "=f"(d->w)
        : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)),
          "r"(__float_as_uint(a3)), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)),
          "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    return 0;
}

// Asynchronous copies global -> shared (sm_80+): the copy engine moves the bytes while the threads
// go on computing; no registers hold them on the way. Addresses come from numba as integers
// (array.ctypes.data + byte offset); the shared one is a generic address, converted here.
// src_bytes < size fills the rest with zeros: 0 for a chunk outside the matrix.
extern "C" __device__ int cp_async16(int* result, unsigned long long shared_dst,
                                     unsigned long long global_src, int src_bytes)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared((void*)shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(global_src), "r"(src_bytes));
    *result = 0;
    return 0;
}

extern "C" __device__ int cp_async4(int* result, unsigned long long shared_dst,
                                    unsigned long long global_src, int src_bytes)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared((void*)shared_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(global_src), "r"(src_bytes));
    *result = 0;
    return 0;
}

// Close this thread's group of copies and wait until all its groups have landed in shared memory
// (a __syncthreads() after it makes every thread's copies visible to every thread).
extern "C" __device__ int cp_async_wait_all(int* result)
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    *result = 0;
    return 0;
}
