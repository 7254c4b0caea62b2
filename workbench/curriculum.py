"""The course: Parts, and in each Part chapters; a chapter is a family of operators (its variants).

Chapter numbers are declared here, never derived from a listing order: Part p holds chapters p*10+1 to
p*10+9, so a family appended to a Part takes the next free number and renumbers nothing. Each chapter's
notebook is ``NN_<slug>.ipynb`` and its page ``docs/NN_<slug>.md``.

A chapter lists its operators, the first being the **primary** variant, whose ladder the chapter walks stage
by stage; the others are variants along the chapter's axes (a dtype, an activation's function, a reduction's
combine and axis) or fusions beside it, shown in a short section each. Every operator belongs to exactly one
chapter. A chapter walks ladders that fit one sitting; a family whose variants need ladders of their own (GEMM
on CUDA cores, on tensor cores, in int8; the sum's ladder and the other combines' and axes') spans chapters, and
each of them names the others (``registry.family_elsewhere``). An operator this file does not list (a ladder just written, or one from
``$WORKBENCH_SOLUTIONS_PATH``) still gets a notebook: it is *unfiled*, a chapter of its own numbered from
``UNFILED_FIRST`` in listing order, until it is added here (``unfiled_note`` says so).

This module is data and pure functions of operator names; ``registry`` applies it to the operators it finds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# 90 (grade yourself) and 99 (compare all) are the course's own notebooks; unfiled ladders sit before them.
UNFILED_FIRST = 81
UNFILED_LAST = 89
CURRICULUM_FILE = "workbench/curriculum.py"


@dataclass(frozen=True)
class Part:
    number: int
    title: str
    about: str  # one sentence: what the Part is for


@dataclass(frozen=True)
class Chapter:
    number: int  # p*10+k for Part p: stable, declared
    slug: str  # the notebook's and page's name after the number
    title: str
    operators: tuple[str, ...]  # the primary variant first
    teaches: tuple[str, str, str]  # the interview questions it answers
    minutes: int  # the estimated time of a sitting with its notebook
    prerequisites: tuple[int, ...] = ()
    core: bool = False  # on the marked core path
    axes: str = ""  # what its variants vary, in words ("" for a family of one)
    unfiled: bool = False

    @property
    def part(self) -> int:
        return self.number // 10

    @property
    def primary(self) -> str:
        return self.operators[0]

    @property
    def stem(self) -> str:
        return f"{self.number:02d}_{self.slug}"

    @property
    def notebook(self) -> str:
        return f"{self.stem}.ipynb"

    @property
    def page(self) -> str:
        return f"docs/{self.stem}.md"


PARTS = (
    Part(1, "Foundations", "One vector or matrix, one pass: coalescing, shared memory, warps, atomics."),
    Part(2, "Rows", "A reduction per row feeding an elementwise pass: the normalisations of a network."),
    Part(3, "Matrices", "Reuse in registers and shared memory, then tensor cores and low precision."),
    Part(4, "Transformers", "Attention from three kernels to FlashAttention, decoding, rotary positions."),
    Part(5, "Convolutions and pooling", "Stencils, convolutions as GEMMs, and the small layers of a CNN."),
    Part(6, "Sparse and selection", "Irregular work: sparse rows, conversions, the top k of a row."),
    Part(7, "Systems", "What surrounds a kernel: launch cost, graphs, streams, several GPUs."),
    Part(8, "Unfiled", "Ladders not yet placed in the curriculum (" + CURRICULUM_FILE + ")."),
)

_ACT_FUNCTIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")

CHAPTERS = (
    # -- Part 1: foundations ---------------------------------------------------------------------------
    Chapter(11, "reduction", "Reduction: the sum of a vector", ("reduction",),
            ("Why is a naive atomic sum slow, and what does coalescing change?",
             "How does a block reduce in shared memory, and what do warp shuffles save?",
             "How many kernels does a full reduction need, and how do you make it one?"),
            minutes=60, core=True),
    Chapter(12, "reductions", "Reductions beyond the sum: max, min, mean, sum of squares; rows and columns",
            ("reduction[max]", "reduction[min]", "reduction[mean]", "reduction[sumsq]")
            + tuple(f"reduction[{axis}]" for axis in ("rows", "cols"))
            + tuple(f"reduction[{combine},{axis}]" for combine in ("max", "min", "mean") for axis in ("rows", "cols")),
            ("What changes when the combine is max or min instead of +?",
             "Why is reducing along contiguous rows easy and along strided columns not?",
             "When is one pass enough, and when does a second kernel pay?"),
            minutes=40, prerequisites=(11,), axes="combine (sum, max, min, mean, sum of squares) x axis "
                                                  "(whole vector, rows, columns)"),
    Chapter(13, "elementwise", "Elementwise and fusion: GELU(x + bias) + residual",
            ("elementwise", "elementwise[fp16]", "elementwise[bf16]"),
            ("Why does fusing three elementwise kernels into one make it about three times faster?",
             "How do instruction-level parallelism and 16-byte loads reach the copy bandwidth?",
             "What do fp16 and bf16 inputs change when the arithmetic stays float32?"),
            minutes=45, prerequisites=(11,), core=True, axes="dtype (float32, fp16, bf16)"),
    Chapter(14, "activations", "Activations: ReLU, Leaky ReLU, Sigmoid, Tanh, GELU, SiLU",
            tuple(f"activation[{f}]" for f in _ACT_FUNCTIONS)
            + tuple(f"activation[{f},{d}]" for d in ("fp16", "bf16") for f in _ACT_FUNCTIONS),
            ("Why does every activation run at the same speed once it is memory-bound?",
             "When does the math (erf, exp, tanh) start to show, and what does fast math trade?",
             "How do you read and write half-precision vectors at full bandwidth?"),
            minutes=30, prerequisites=(13,), axes="function (7) x dtype (float32, fp16, bf16)"),
    Chapter(15, "transpose", "Transpose: coalescing both sides through shared memory", ("transpose",),
            ("Why can a naive transpose not coalesce both its reads and its writes?",
             "How does a shared-memory tile fix it, and why pad it by one column?",
             "What are shared-memory bank conflicts and how do you see them?"),
            minutes=40, prerequisites=(11,), core=True),
    Chapter(16, "scan", "Scan: the inclusive prefix sum", ("scan",),
            ("Why is Hillis-Steele work-inefficient, and when does that matter?",
             "How does reduce-then-scan split a scan across blocks?",
             "What is decoupled look-back, and why is it a single pass?"),
            minutes=50, prerequisites=(11,), core=True),
    Chapter(17, "histogram", "Histogram: atomics and privatisation", ("histogram",),
            ("What does contention on global atomics cost?",
             "How does privatising bins in shared memory (or per warp) remove it?",
             "How do you read bytes four at a time without breaking coalescing?"),
            minutes=30, prerequisites=(11,), core=True),
    Chapter(18, "argmax", "Argmax: a reduction that carries an index", ("argmax",),
            ("How do you reduce a (value, index) pair and keep the lowest index on ties?",
             "How do warp shuffles move two values at once?",
             "How do you finish in one pass without a second kernel?"),
            minutes=25, prerequisites=(11,)),
    # -- Part 2: rows ----------------------------------------------------------------------------------
    Chapter(21, "softmax", "Softmax over rows", ("softmax", "softmax[fp16]", "softmax[bf16]"),
            ("Why does a numerically safe softmax need the row's maximum first?",
             "How does one warp or one block own a row, and when is each the better shape?",
             "What do online (single-pass) max and sum save in memory traffic?"),
            minutes=60, prerequisites=(11, 13), core=True, axes="dtype (float32, fp16, bf16)"),
    Chapter(22, "layernorm", "LayerNorm over rows, and the fusions around it",
            ("layernorm", "layernorm[fp16]", "layernorm[bf16]", "layernorm[bias_relu]", "layernorm[residual]"),
            ("How do you compute a mean and a variance in one pass, stably (Welford)?",
             "Why does keeping the row in registers or L1 beat reading it twice?",
             "What does fusing the bias, ReLU or residual add before the norm save?"),
            minutes=60, prerequisites=(21,), core=True,
            axes="dtype (float32, fp16, bf16); fusions (bias + ReLU before, residual add before)"),
    Chapter(23, "rmsnorm", "RMSNorm over rows", ("rmsnorm", "rmsnorm[fp16]", "rmsnorm[bf16]"),
            ("How does RMSNorm differ from LayerNorm, and what does dropping the mean save?",
             "How do you keep a 16-bit row in registers between its two passes?",
             "Which shape of block suits short rows and which long ones?"),
            minutes=30, prerequisites=(22,), axes="dtype (float32, fp16, bf16)"),
    # -- Part 3: matrices ------------------------------------------------------------------------------
    Chapter(31, "gemm", "GEMM: from one thread per output to tensor cores",
            ("gemm", "gemm[bias_gelu]", "gemm[batched]"),
            ("Why is a naive GEMM memory-bound, and how do shared-memory tiles make it compute-bound?",
             "How do register tiles, vector loads and asynchronous copies raise the arithmetic per byte?",
             "When does split-K pay, and what does a fused epilogue or a batch change?"),
            minutes=90, prerequisites=(15,), core=True,
            axes="fusions (bias + GELU epilogue); batch (one launch for many products)"),
    Chapter(32, "matvec", "Matrix-vector product", ("matvec",),
            ("Why is a matrix-vector product memory-bound whatever you do?",
             "Why is a warp per row faster than a thread per row?",
             "How do 16-byte loads reach the read bandwidth?"),
            minutes=25, prerequisites=(11,)),
    Chapter(33, "hgemm", "Half-precision GEMM on tensor cores", ("gemm[fp16]", "gemm[bf16]"),
            ("How does mma.sync compute a tile, and how do ldmatrix and a swizzle feed it?",
             "Why does a pipeline of asynchronous copies hide the memory latency?",
             "What do fp16 and bf16 change (range against precision)?"),
            minutes=75, prerequisites=(31,), core=True, axes="dtype (fp16, bf16)"),
    Chapter(34, "quantize", "int8 quantization and dequantization", ("quantize", "dequantize"),
            ("How do you quantize a row symmetrically, and where does rounding bite?",
             "Why is a row's scale a reduction followed by an elementwise pass?",
             "How do you pack four int8 values into one 32-bit store?"),
            minutes=30, prerequisites=(21,), axes="direction (quantize, dequantize)"),
    Chapter(35, "int8_gemm", "int8 GEMM and the quantized linear layer", ("gemm[int8]", "qlinear"),
            ("What does dp4a compute, and what does int8 mma.sync add?",
             "Why does an int8 product accumulate in int32?",
             "What does fusing quantize, GEMM and dequantize into one linear layer save?"),
            minutes=40, prerequisites=(33, 34), axes="fusion (quantize + GEMM + dequantize)"),
    # -- Part 4: transformers --------------------------------------------------------------------------
    Chapter(41, "attention", "Attention: from three kernels to FlashAttention",
            ("attention", "attention[fp16]", "attention[bf16]"),
            ("Why does materialising the attention matrix cost memory, and how does FlashAttention avoid it?",
             "How does the online softmax let a block stream over the keys?",
             "What do tensor cores and skipping masked blocks (causal) add?"),
            minutes=90, prerequisites=(21, 31), core=True, axes="dtype (float32, fp16, bf16)"),
    Chapter(42, "decode_attention", "Decode attention: one query against a KV cache", ("decode_attention",),
            ("Why is decoding memory-bound, unlike prefill attention?",
             "How does split-KV put every SM to work on one token?",
             "How does grouped-query attention let heads share the keys they read?"),
            minutes=45, prerequisites=(41,)),
    Chapter(43, "rope", "RoPE: rotary positions", ("rope", "rope[interleaved]", "attention[rope]"),
            ("What does a rotary embedding compute, and in which two layouts?",
             "Table of angles or computed on the fly: which is faster, and why?",
             "What does rotating inside the attention kernel save?"),
            minutes=30, prerequisites=(13, 41), axes="layout (half-split, interleaved); fusion (into attention)"),
    # -- Part 5: convolutions and pooling -------------------------------------------------------------
    Chapter(51, "stencil", "Stencil: a 5x5 convolution of an image", ("stencil",),
            ("How does a shared-memory tile with a halo serve every neighbour once?",
             "Why does a missing barrier fail only sometimes?",
             "What does a register tile per thread add?"),
            minutes=30, prerequisites=(15,), core=True),
    Chapter(52, "conv2d", "Convolution: direct, im2col + GEMM, implicit GEMM, Winograd",
            ("conv2d", "conv2d[general]", "conv2d[bias_relu]", "conv2d[bias_add_relu]", "conv2d[bn_folded]"),
            ("How is a convolution a GEMM (im2col), and why is implicit GEMM better?",
             "What does Winograd trade for fewer multiplications?",
             "What do a fused epilogue and BatchNorm folded into the weights save?"),
            minutes=75, prerequisites=(31, 51), core=True,
            axes="shape (3x3, any filter/stride/padding/dilation); fusions (bias + ReLU, residual, BatchNorm)"),
    Chapter(53, "conv_transpose2d", "Transposed convolution", ("conv_transpose2d",),
            ("Why does a scatter need atomics and a gather not?",
             "How does the output's parity split a strided transposed convolution into GEMMs?",
             "How is it the gradient of a convolution?"),
            minutes=40, prerequisites=(52,)),
    Chapter(54, "conv2d_fft", "Large-filter convolution by FFT", ("conv2d_fft",),
            ("When does an FFT beat a direct convolution?",
             "What does the FFT's padding cost?",
             "Why do few channels favour it?"),
            minutes=25, prerequisites=(52,)),
    Chapter(55, "depthwise", "Depthwise convolution", ("depthwise3x3", "depthwise3x3[nhwc]"),
            ("Why is a depthwise convolution memory-bound, unlike a full one?",
             "How do strips and a window in flight reuse rows between outputs?",
             "What does a channels-last layout change?"),
            minutes=30, prerequisites=(51,), axes="layout (NCHW, NHWC)"),
    Chapter(56, "pooling", "Pooling: max, average, global average",
            ("pool2d[max]", "pool2d[mean]", "pool2d[mean,global]"),
            ("How do you keep the argmax indices training needs?",
             "What does keeping several outputs in flight per thread buy?",
             "Why is a global average a reduction per plane?"),
            minutes=30, prerequisites=(11, 51), axes="combine (max, average) x window (K x K, whole plane)"),
    Chapter(57, "batchnorm", "BatchNorm: training and inference", ("batchnorm[train]", "batchnorm[infer]"),
            ("Why are per-channel statistics over N, H and W awkward in NCHW?",
             "How do you split a channel over several blocks and combine their statistics?",
             "What does folding the running statistics into a scale save at inference?"),
            minutes=35, prerequisites=(22,), axes="mode (training, inference)"),
    # -- Part 6: sparse and selection -----------------------------------------------------------------
    Chapter(61, "spmv", "Sparse matrix times vector (CSR)", ("spmv",),
            ("Why does a thread per row stall on uneven rows?",
             "How does merge-path split the work evenly whatever the rows?",
             "Split the non-zeros evenly instead: how does a thread find its rows without searching?"),
            minutes=45, prerequisites=(11, 16)),
    Chapter(62, "coo_to_csr", "COO to CSR: count, scan, scatter", ("coo_to_csr",),
            ("How do a histogram and a scan build row offsets?",
             "Why does an atomic scatter lose the order, and a radix sort keep it?",
             "What does a stable conversion cost?"),
            minutes=30, prerequisites=(16, 17)),
    Chapter(63, "topk", "Top-k of each row", ("topk",),
            ("Why is sorting a whole row wasteful for a small k?",
             "How does a radix select find the k-th value in a few passes?",
             "How does a bitonic network select inside a block?"),
            minutes=40, prerequisites=(18,)),
    # -- Part 7: systems --------------------------------------------------------------------------------
    Chapter(71, "launch_overhead", "Launch overhead, CUDA graphs and streams", ("launch_overhead",),
            ("What does a kernel launch cost from Python, and where does that time go?",
             "How do prepared launches and CUDA graphs remove it?",
             "When is fusing the kernels the only real fix?"),
            minutes=40, prerequisites=(22,), core=True),
    Chapter(72, "allreduce", "AllReduce across GPUs", ("allreduce", "allreduce[rmsnorm]"),
            ("What bounds an all-reduce: the links, not the memory?",
             "One-shot, two-shot, ring: which for a small and which for a large buffer?",
             "How do flags and Lamport-style buffers remove the barriers, and what does fusing the norm add?"),
            minutes=60, prerequisites=(11, 23), axes="fusion (residual add + RMSNorm)"),
)


class CurriculumError(ValueError):
    """The declared curriculum contradicts itself (a number reused, an operator in two chapters, ...)."""


def part(number: int) -> Part:
    return next(p for p in PARTS if p.number == number)


def unfiled_chapter(name: str, number: int) -> Chapter:
    """The chapter of its own an operator this file does not list gets, until it is filed here."""
    return Chapter(number, name, f"{name} (unfiled)", (name,),
                   (f"A ladder not yet placed in the course: add it to a chapter in {CURRICULUM_FILE}.", "", ""),
                   minutes=0, unfiled=True)


def chapters_for(operator_names, declared: tuple[Chapter, ...] = CHAPTERS) -> list[Chapter]:
    """The declared chapters, each keeping only the operators that exist (a chapter with none is left
    out), then an unfiled chapter per operator no chapter lists, numbered from UNFILED_FIRST in the
    order given. Raises CurriculumError when the declaration contradicts itself."""
    names = list(operator_names)
    known = set(names)
    validate(declared)
    filed = {op for ch in declared for op in ch.operators}
    out = []
    for ch in declared:
        present = tuple(op for op in ch.operators if op in known)
        if present:
            out.append(ch if present == ch.operators else _with_operators(ch, present))
    unfiled = [n for n in names if n not in filed]
    if len(unfiled) > UNFILED_LAST - UNFILED_FIRST + 1:
        raise CurriculumError(f"{len(unfiled)} operators are in no chapter ({', '.join(unfiled)}): at most "
                              f"{UNFILED_LAST - UNFILED_FIRST + 1} may wait unfiled; add them to "
                              f"{CURRICULUM_FILE}")
    out += [unfiled_chapter(n, UNFILED_FIRST + i) for i, n in enumerate(unfiled)]
    return out


def _with_operators(ch: Chapter, operators: tuple[str, ...]) -> Chapter:
    return replace(ch, operators=operators)


def validate(declared: tuple[Chapter, ...] = CHAPTERS) -> None:
    """Numbers unique and inside their Part's range, slugs unique, each operator in one chapter,
    prerequisites declared and earlier."""
    numbers, slugs, owner = set(), set(), {}
    for ch in declared:
        where = f"chapter {ch.number} ({ch.slug}) in {CURRICULUM_FILE}"
        if ch.number in numbers:
            raise CurriculumError(f"{where}: the number {ch.number} is used twice")
        if not (1 <= ch.number % 10 <= 9) or ch.part not in {p.number for p in PARTS[:-1]}:
            raise CurriculumError(f"{where}: a number is p*10+k with Part p in 1..{len(PARTS) - 1}, k in 1..9")
        if ch.slug in slugs:
            raise CurriculumError(f"{where}: the slug {ch.slug!r} is used twice")
        for op in ch.operators:
            if op in owner:
                raise CurriculumError(f"{where}: {op!r} is already in chapter {owner[op]}")
            owner[op] = ch.number
        for pre in ch.prerequisites:
            if pre not in numbers:
                raise CurriculumError(f"{where}: prerequisite {pre} is not a chapter declared before it")
        if not ch.operators or len(ch.teaches) != 3 or ch.minutes <= 0:
            raise CurriculumError(f"{where}: a chapter needs operators, three questions it answers and a time")
        numbers.add(ch.number)
        slugs.add(ch.slug)


def unfiled_note(ch: Chapter) -> str:
    return (f"`{ch.primary}` is in no chapter of the course yet: add it to one in `{CURRICULUM_FILE}` "
            f"(its number {ch.number} is temporary).")
