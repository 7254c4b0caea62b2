// Integer tensor-core and dot-product helpers for the int8 GEMM (solutions/int8_gemm.py), linked into
// numba kernels with cuda.declare_device(..., link=this file) beside hgemm_mma.cu (which supplies
// ldmatrix and cp.async). Same ABI as there: return 0, the result through the first argument.

struct s32x4 { int x, y, z, w; };

// d = a @ b + c for one m16n8k32 tile per warp: A 16x32 int8 (four to a 32-bit register), B 32x8
// int8 (column-major fragments: four consecutive k of one column per register), int32 accumulators.
// Lane l, g = l / 4, q = l % 4, holds (PTX ISA, "Matrix Fragments for mma.m16n8k32", .s8):
//   a0 = A[g][4q..4q+3], a1 = A[g+8][4q..4q+3], a2 = A[g][16+4q..], a3 = A[g+8][16+4q..]
//   b0 = B[4q..4q+3][g], b1 = B[16+4q..16+4q+3][g]
//   c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q], c3 = C[g+8][2q+1]
// .satfinite is left out: int32 sums of K products of int8 cannot overflow for K < 2^17.
extern "C" __device__ int mma_s8_m16n8k32(s32x4* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1, int c0, int c1, int c2, int c3)
{
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=r"(d->x), "=r"(d->y), "=r"(d->z), "=r"(d->w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
    return 0;
}

// c + the dot product of four signed bytes of a with four of b (one instruction, sm_61+).
extern "C" __device__ int dp4a_s8(int* r, unsigned a, unsigned b, int c)
{
    *r = __dp4a((int)a, (int)b, c);
    return 0;
}
