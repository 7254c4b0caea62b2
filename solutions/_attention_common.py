"""What the float32 attention ladder (``attention.py``) and the tensor-core one (``attention_tc.py``) judge
and compare themselves by, written once: the float64 reference, the flop count, the K/V traffic of a
flash kernel, the adversarial logits (extreme and rising), torch SDPA as the peer and the formula as plain torch for
``torch.compile``; and RoPE's tables, which ``rope.py`` and the RoPE-fused attention in ``attention.py``
both build.

Not a ladder (its name starts with ``_``): a ladder that imports another ladder gets no exercise."""

import math

import numpy as np
from numba import cuda

from workbench import library_peers as peers


def reference(q, k, v, causal):
    """float64 attention of the inputs' exact values (half inputs are widened exactly)."""
    causal = bool(causal[0])
    B, H, S, D = q.shape
    out = np.empty((B, H, S, D))
    masked = np.triu(np.ones((S, S), bool), 1) if causal else None
    for b in range(B):  # head by head: the float64 scores of all heads at once would not fit
        for h in range(H):
            s = (q[b, h].astype(np.float64) @ k[b, h].astype(np.float64).T) / math.sqrt(D)
            if causal:
                s[masked] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, h] = (p @ v[b, h].astype(np.float64)) / p.sum(axis=1, keepdims=True)
    return out


# -- RoPE's tables (rope.py, and attention.py's RoPE-fused operator) -------------------------------

ROPE_BASE = 10000.0


def draw_rope_base(rng) -> float:
    """A base for the inputs, drawn across the range models use (10^4, the original and Llama 2's; 5 x 10^5,
    Llama 3's; 10^6, Qwen's), log-uniformly: no constant written into a kernel that rebuilds the frequencies
    instead of reading the inv_freq it is given matches a draw (three bases to choose from matched all of a
    grading run's few draws now and then)."""
    return float(np.exp(rng.uniform(np.log(1e4), np.log(1e6))))


def inverse_frequencies(D, base=ROPE_BASE):
    """The model's inv_freq in float32, as Hugging Face computes it: 1 / base^(2i / D)."""
    return (1.0 / (np.float32(base) ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)))).astype(np.float32)


def rope_angles(S, inv_freq):
    """float32(s) * inv_freq[i], rounded to float32 as the model computes it (S x D/2)."""
    return np.arange(S, dtype=np.float32)[:, None] * inv_freq[None, :]


def rope_tables(S, D, base=ROPE_BASE):
    """The cached cos and sin tables a model keeps (S x D/2 float32 each), of the float32 angles."""
    angles = rope_angles(S, inverse_frequencies(D, base)).astype(np.float64)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def attention_flops(size):
    """Useful work: Q K^T and P V, 2 D flops each per (query, key) pair a query attends to. Under the
    causal mask query i sees i + 1 keys, so S (S + 1) / 2 pairs, as FlashAttention's papers count it:
    a kernel that computes the masked half and throws it away gets no credit for it."""
    B, H, S, D, causal = size
    pairs = S * (S + 1) // 2 if causal else S * S
    return 4 * B * H * pairs * D


def kv_fetch_bytes(size, queries_per_fetch, skips_masked, itemsize):
    """Bytes of K and V a flash kernel fetches when every block of ``queries_per_fetch`` queries reads the
    keys it needs once: all S of them, or, when the kernel skips masked keys and the mask is on, those up
    to its last query (the causal skip stops at the diagonal tile). ``itemsize``: bytes an element."""
    B, H, S, D, causal = size
    causal = causal and skips_masked
    keys = 0
    for first in range(0, S, queries_per_fetch):
        keys += min(S, first + queries_per_fetch) if causal else S
    return B * H * keys * 2 * D * itemsize


def extreme_logits(q, k, D, rng):
    """float32 q and k made adversarial: the odd query rows get every score near -150, the even ones
    logits spread over hundreds.

    k points away from a direction that the odd rows of q point along: their scores are all about -150
    (an exponential that underflows to 0 in float32). A running maximum started at 0 instead of -inf
    (or the lowest float) then sees exp(score - 0) = 0 for every key, and 0 / 0 is NaN. The even rows:
    q scaled up, so their logits spread over hundreds. exp overflows float32 past 88, so a softmax that
    does not subtract the running maximum gets inf / inf = NaN, and one that does not rescale the output
    when the maximum grows keeps weights that are now exp(-100) too large. With the causal mask, query 0
    has a single key: its output is exactly v[0]."""
    direction = rng.normal(0.0, 1.0, D).astype(np.float32)
    direction /= np.linalg.norm(direction)
    reach = np.float32(math.sqrt(150.0 * math.sqrt(D)))  # q . k ~ -reach^2: a score of -150
    k = (k * np.float32(1.2) - reach * direction).astype(np.float32)
    q = q.copy()
    q[:, :, 1::2] = q[:, :, 1::2] * np.float32(0.1) + reach * direction
    q[:, :, 0::2] *= np.float32(12.0)
    return q, k


RISE = 30.0  # rising_logits: the scores go from about -RISE at the first key to +RISE at the last


def rising_logits(q, k, D, rng):
    """float32 q and k made adversarial for the online softmax: every score rises with the key's position,
    from about -30 at the first key to +30 at the last, so every query's running maximum grows at every
    key tile it sees.

    q and k point along one direction, k scaled by a ramp over the keys (plus a tenth of their random
    draws: the scores stay distinct). A flash kernel that does not rescale its running sum, or its output,
    by exp(m - m') when the maximum grows from m to m' is then off by O(1) in every query that sees more
    than one key tile, on every draw; with random scores the maximum grows past the first tile only now
    and then (in one query of 17 at 17 keys and tiles of 16), and such a bug passes most draws. Under the
    causal mask each query's largest score is its own key, the last one it sees."""
    B, H, S, _ = q.shape
    direction = rng.normal(0.0, 1.0, D).astype(np.float32)
    direction /= np.linalg.norm(direction)
    reach = np.float32(math.sqrt(RISE * math.sqrt(D)))  # q . k / sqrt(D) = RISE * ramp
    ramp = np.linspace(-1.0, 1.0, S, dtype=np.float32)[:, None]  # one value a key
    q = (q * np.float32(0.1) + reach * direction).astype(np.float32)
    k = (k * np.float32(0.1) + reach * ramp * direction).astype(np.float32)
    return q, k


def sdpa_peer(size):
    """torch's scaled_dot_product_attention on the same buffers, or None without torch."""
    torch = peers.torch()
    if torch is None:
        return None
    F = torch.nn.functional

    def sdpa(q, k, v, causal, out):
        # The flag is read once per buffer and cached with the views (as gemm's alpha and beta), so a
        # timed call never waits for a copy.
        is_causal = peers.cached("attention.causal", causal, lambda a: bool(cuda.as_cuda_array(a).copy_to_host()[0]))
        t = peers.as_torch
        return F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=is_causal)

    sdpa.returns_output = True  # SDPA has no out=: the bench compares what it returns
    return "torch SDPA", sdpa


def naive_expression(torch, size):
    """torch_expression: attention as its formula reads, scores materialised (what the naive stage
    does), for torch.compile to fuse what it can around the two matrix products (Inductor may also
    recognise the pattern and call SDPA itself). The mask comes from the size's causal field, fixed
    when the expression is traced; the softmax runs in float32 whatever the inputs' type."""
    B, H, S, D, causal = size

    def naive(q, k, v, causal_flag):
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        if causal:
            above_diagonal = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(above_diagonal, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
    return naive
