// Tensor-core, ldmatrix and cp.async helpers for the half-precision GEMM ladder (solutions/hgemm.py),
// the int8 GEMM (solutions/int8_gemm.py) and the deep-pipeline TF32 stage of solutions/gemm.py,
// linked into numba kernels with cuda.declare_device(..., link=this file). numba compiles this file
// with NVRTC and, with link-time optimisation (nvJitLink), inlines every call: each helper costs what
// its one PTX instruction costs.
//
// numba's ABI for a foreign device function: return int (0: no Python exception), the result through
// the first argument, a pointer. A numba UniTuple(T, n) is laid out as n values of T in a row.
// Shared-memory addresses arrive as generic addresses (array.ctypes.data + byte offset) and are
// converted here; global ones are generic addresses used as they are.
//
// Fragment layouts are documented once, in solutions/hgemm.py (and checked on the CPU by
// tests/test_hgemm.py); the names below follow the PTX ISA, "Matrix Fragments for mma.m16n8k16".

#include <cuda_fp16.h>
#include <cuda_bf16.h>

struct f32x4 { float x, y, z, w; };
struct u32x4 { unsigned x, y, z, w; };
struct s32x4 { int x, y, z, w; };

// d = a @ b + c for one m16n8k16 tile per warp: A 16x16 (row-major fragments), B 16x8 (column-major
// fragments), half inputs packed two to a 32-bit register, float32 accumulators.
extern "C" __device__ int mma_f16_m16n8k16(f32x4* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                           unsigned b0, unsigned b1, float c0, float c1, float c2, float c3)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d->x), "=f"(d->y), "=f"(d->z), "=f"(d->w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    return 0;
}

extern "C" __device__ int mma_bf16_m16n8k16(f32x4* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1, float c0, float c1, float c2, float c3)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d->x), "=f"(d->y), "=f"(d->z), "=f"(d->w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    return 0;
}

// Four 8x8 matrices of 16-bit elements from shared memory, one 32-bit register of each per lane.
// Lane l gives the address of row l % 8 of matrix l / 8 (16 bytes); lane t receives, of matrix j,
// the two elements at row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1. With .trans it receives them
// from the transposed matrix: stored rows 2 (t % 4) and 2 (t % 4) + 1, column t / 4.
extern "C" __device__ int ldmatrix_x4(u32x4* r, unsigned long long shared_row)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared((void*)shared_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r->x), "=r"(r->y), "=r"(r->z), "=r"(r->w) : "r"(addr));
    return 0;
}

extern "C" __device__ int ldmatrix_x4_trans(u32x4* r, unsigned long long shared_row)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared((void*)shared_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r->x), "=r"(r->y), "=r"(r->z), "=r"(r->w) : "r"(addr));
    return 0;
}

// One 16-byte asynchronous copy global -> shared (sm_80+), bypassing L1 (.cg). src_bytes < 16 fills
// the rest of the 16 bytes with zeros: 0 for a chunk outside the matrix.
extern "C" __device__ int cp_async_chunk16(int* result, unsigned long long shared_dst,
                                           unsigned long long global_src, int src_bytes)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared((void*)shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(global_src), "r"(src_bytes));
    *result = 0;
    return 0;
}

// Close this thread's current group of copies (a pipeline stage).
extern "C" __device__ int cp_async_commit(int* result)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    *result = 0;
    return 0;
}

// Wait until at most `pending` of this thread's most recent groups are still in flight. The count is
// an immediate in PTX, so each value is its own instruction; called with a constant, the switch folds
// away after inlining. A __syncthreads() after it makes every thread's landed copies visible to all.
extern "C" __device__ int cp_async_wait_pending(int* result, int pending)
{
    switch (pending) {
        case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;  // more: wait for all
    }
    *result = 0;
    return 0;
}

// Two float32 values rounded (to nearest even) to two halves, packed in 32 bits: lo in the low 16.
extern "C" __device__ int pack_f16x2(unsigned* r, float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    *r = *reinterpret_cast<unsigned*>(&h);
    return 0;
}

extern "C" __device__ int pack_bf16x2(unsigned* r, float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    *r = *reinterpret_cast<unsigned*>(&h);
    return 0;
}

// -- for the tuned tensor-core attention (solutions/attention_tc.py) ---------------------------------

// 2^x by the special-function unit alone (MUFU.EX2, about 2 ulp; subnormal inputs and results flushed
// to zero). libdevice's exp2f without fast-math adds a test and two multiplies around it, for
// subnormal results, which a softmax weight below 2^-126 never needs (it is ~0 next to the maximum's 1).
extern "C" __device__ int ex2_approx_ftz(float* r, float x)
{
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(*r) : "f"(x));
    return 0;
}

// A shared-memory generic address as a 32-bit shared-window address (cvta.to.shared): offsets added
// to it stay 32-bit and fold into the instructions' immediates, where 64-bit generic sums cost an
// add-with-carry pair and a conversion per access.
extern "C" __device__ int shared_address32(unsigned* r, unsigned long long generic)
{
    *r = (unsigned)__cvta_generic_to_shared((void*)generic);
    return 0;
}

// ldmatrix_x4 / ldmatrix_x4_trans / cp_async_chunk16 (above) taking a shared-window address (from
// shared_address32, plus offsets) in 64 bits and using its low 32: after inlining, the truncation
// lets the compiler do the sums in 32 bits (the simulator's process addresses need all 64).
extern "C" __device__ int ldmatrix_x4_s32(u32x4* r, unsigned long long window_addr)
{
    unsigned addr = (unsigned)window_addr;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r->x), "=r"(r->y), "=r"(r->z), "=r"(r->w) : "r"(addr));
    return 0;
}

extern "C" __device__ int ldmatrix_x4_trans_s32(u32x4* r, unsigned long long window_addr)
{
    unsigned addr = (unsigned)window_addr;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r->x), "=r"(r->y), "=r"(r->z), "=r"(r->w) : "r"(addr));
    return 0;
}

extern "C" __device__ int cp_async_chunk16_s32(int* result, unsigned long long window_dst,
                                               unsigned long long global_src, int src_bytes)
{
    unsigned dst = (unsigned)window_dst;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(global_src), "r"(src_bytes));
    *result = 0;
    return 0;
}

// A 4-byte asynchronous copy global -> shared (sm_80+) to a shared-window address, as
// cp_async_chunk16_s32; through L1 (.ca: .cg takes 16 bytes only). src_bytes: 4 copies the float,
// 0 writes a zero instead (a gathered element outside the image).
extern "C" __device__ int cp_async_chunk4_s32(int* result, unsigned long long window_dst,
                                              unsigned long long global_src, int src_bytes)
{
    unsigned dst = (unsigned)window_dst;
    // src_bytes is 4 or 0: as the ignore-src predicate rather than a byte count, the compiler need not
    // adjust the address for a partial copy (it added 4 - src_bytes to it).
    asm volatile("{\n .reg .pred ignore;\n setp.eq.s32 ignore, %2, 0;\n"
                 " cp.async.ca.shared.global [%0], [%1], 4, ignore;\n}\n"
                 :: "r"(dst), "l"(global_src), "r"(src_bytes));
    *result = 0;
    return 0;
}

// -- for the float32 attention's 3xTF32 stage (solutions/_flash_mma.py, attention.tensor_cores) -------

struct f32x2 { float x, y; };

// x = big + small, both TF32 values (10 mantissa bits): big = x rounded to TF32 (cvt.rna), small = the
// remainder x - big (exact in float32) rounded to TF32 too. A tensor core reading x itself would drop
// its low 13 mantissa bits; big + small keeps about 21 of x's 24.
extern "C" __device__ int split_tf32(f32x2* r, float x)
{
    unsigned big, small;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    float rest = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
    r->x = __uint_as_float(big);
    r->y = __uint_as_float(small);
    return 0;
}

// The same for a float32 held as its bits (what ldmatrix hands back).
extern "C" __device__ int split_tf32_bits(f32x2* r, unsigned bits)
{
    return split_tf32(r, __uint_as_float(bits));
}

// d = a b + c to about float32 accuracy from three TF32 m16n8k8 mma (CUTLASS's "3xTF32", what torch's
// float32 SDPA runs on tensor cores): a b = (a_big + a_small)(b_big + b_small), less a_small b_small
// (2^-22 of the product); the small cross terms go first, so that they are not lost against the big
// one. Fragments as mma_tf32_m16n8k8 in gemm_mma.cu: lane l, g = l / 4, q = l % 4: a0 A[g][q],
// a1 A[g+8][q], a2 A[g][q+4], a3 A[g+8][q+4]; b0 B[q][g], b1 B[q+4][g]; c as the f16 mma's.
extern "C" __device__ int mma_3xtf32_m16n8k8(f32x4* d, float a0, float a1, float a2, float a3,
                                             float as0, float as1, float as2, float as3,
                                             float b0, float b1, float bs0, float bs1,
                                             float c0, float c1, float c2, float c3)
{
#define MMA_TF32(A0, A1, A2, A3, B0, B1)                                                                   \
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "                                              \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                               \
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)                                                           \
        : "r"(__float_as_uint(A0)), "r"(__float_as_uint(A1)), "r"(__float_as_uint(A2)),                   \
          "r"(__float_as_uint(A3)), "r"(__float_as_uint(B0)), "r"(__float_as_uint(B1)))
    MMA_TF32(as0, as1, as2, as3, b0, b1);   // a_small b_big
    MMA_TF32(a0, a1, a2, a3, bs0, bs1);     // a_big b_small
    MMA_TF32(a0, a1, a2, a3, b0, b1);       // a_big b_big
#undef MMA_TF32
    d->x = c0;
    d->y = c1;
    d->z = c2;
    d->w = c3;
    return 0;
}
