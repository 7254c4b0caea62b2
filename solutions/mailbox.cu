// Mailbox loads and stores for the all-reduce's one-shot push stage (solutions/allreduce.py, "lamport"),
// linked into numba kernels with cuda.declare_device(..., link=this file) as hgemm_mma.cu is (see its
// header for numba's ABI: return int, the result through the first argument).
//
// A mailbox word is a float32 with its sign bit flipped: an empty word is all-zero bits, and no value
// ever written looks empty, because the writer first turns -0.0 (the one float whose flipped bits are
// zero) into +0.0 by adding +0.0. So a reader needs no flag and no fence: a word that is not zero has
// arrived, and a 4-byte word arrives whole.
//
// All three are volatile: the store goes out at once (over NVLink when the address is a peer's), and
// each load of the wait goes to memory. A plain load in a loop may be hoisted out of it by the compiler,
// or served from this SM's L1, which a peer's store never updates: the loop would spin forever. None
// orders other memory operations (no "memory" clobber): a word is its own signal, so nothing else
// needs to be ordered around it, and the compiler stays free to schedule the kernel's plain loads.

struct f32x5 { float x, y, z, w, gave_up; };

__device__ __forceinline__ unsigned mailbox_word(float v)
{
    return __float_as_uint(v + 0.0f) ^ 0x80000000u;  // -0.0 + 0.0 is +0.0: never the empty word
}

// Store four values (16 bytes, 16-byte aligned) into a mailbox, in this GPU's memory or a peer's.
extern "C" __device__ int mailbox_store_f32x4(int* result, unsigned long long address,
                                              float a, float b, float c, float d)
{
    asm volatile("st.volatile.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 :: "l"(address), "r"(mailbox_word(a)), "r"(mailbox_word(b)), "r"(mailbox_word(c)),
                    "r"(mailbox_word(d)));
    *result = 0;
    return 0;
}

// Empty four mailbox words (16 bytes) for a later call.
extern "C" __device__ int mailbox_clear_f32x4(int* result, unsigned long long address)
{
    asm volatile("st.volatile.global.v4.b32 [%0], {%1, %1, %1, %1};\n" :: "l"(address), "r"(0u));
    *result = 0;
    return 0;
}

// Wait until all four words at address have arrived and return their values; after max_polls loads
// that still find an empty word, give up (gave_up = 1: a peer that never wrote, which the host reports).
extern "C" __device__ int mailbox_wait_f32x4(f32x5* r, unsigned long long address, int max_polls)
{
    unsigned a, b, c, d;
    r->gave_up = 0.0f;
    for (int polls = 0;; ++polls) {
        asm volatile("ld.volatile.global.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(address));
        if (a != 0u && b != 0u && c != 0u && d != 0u)
            break;
        if (polls >= max_polls) {
            r->gave_up = 1.0f;
            break;
        }
    }
    r->x = __uint_as_float(a ^ 0x80000000u);
    r->y = __uint_as_float(b ^ 0x80000000u);
    r->z = __uint_as_float(c ^ 0x80000000u);
    r->w = __uint_as_float(d ^ 0x80000000u);
    return 0;
}
