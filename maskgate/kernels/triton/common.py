"""Triton device helpers shared by the sampling kernels: order keys and keyed noise.

Bit-for-bit twins of maskgate/kernels/order.py and maskgate/kernels/noise.py, so a seeded row
draws the same token here (Triton interpreter included) as on the torch path.
"""

from __future__ import annotations

import triton
import triton.language as tl

MASK32 = tl.constexpr(0xFFFFFFFF)
MUL_A = tl.constexpr(0x7FEB352D)
MUL_B = tl.constexpr(0x045D9F3B)
STEP_SALT = tl.constexpr(0x2545F491)
ROW_SALT = tl.constexpr(0x68E31DA4)
U_SCALE = tl.constexpr(2.0**-23)
GREEDY_T = tl.constexpr(1e-6)
# An empty candidate slot: below every real key.
EMPTY_KEY = tl.constexpr(-(2**63))
INT32_MAX = tl.constexpr(2**31 - 1)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def mix32(x):
    """Bijective 32-bit finaliser on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * MUL_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL_B) & MASK32
    return x ^ (x >> 16)


@triton.jit
def row_keys(seed, step):
    """int64 seed, step -> two int64 key words in [0, 2**32)."""
    s_lo = seed & MASK32
    s_hi = (seed >> 32) & MASK32
    t_lo = step & MASK32
    t_hi = (step >> 32) & MASK32
    k0 = mix32(s_lo ^ mix32(t_lo ^ STEP_SALT))
    k1 = mix32(s_hi ^ mix32(t_hi ^ mix32(k0 ^ ROW_SALT)))
    return k0, k1


@triton.jit
def gumbel(k0, k1, ids):
    """Gumbel noise (float32) for int64 token ids."""
    h = mix32(mix32(ids ^ k0) ^ k1)
    u = ((h >> 9).to(tl.float32) + 0.5) * U_SCALE
    return -tl.log(-tl.log(u))


@triton.jit
def race_step(z, ids, sel, k0, k1, best, best_key):
    """One block of a Gumbel-max race into per-lane (score, key): the selected
    finite tokens run with score z + g, and a lane keeps the larger score, ties to the larger
    (z, id) key, which is the earlier in design order. int64 ids."""
    sel = sel & (z > float("-inf"))
    score = tl.where(sel, z + gumbel(k0, k1, ids), float("-inf"))
    key = tl.where(sel, pack_key(z, ids), EMPTY_KEY)
    first = (score > best) | ((score == best) & (key > best_key))
    return tl.where(first, score, best), tl.where(first, key, best_key)


@triton.jit
def race_winner(best, best_key):
    """The winner's key over race_step's lanes (or over races run apart: the same rule)."""
    top = tl.max(best, axis=0)
    return tl.max(tl.where(best == top, best_key, EMPTY_KEY), axis=0)


@triton.jit
def untruncated(k, top_p, min_p, temp, vocab):
    """Nothing truncates the row (top-k off or >= V, top-p 1, min-p 0) and it is not greedy:
    its support is every finite token."""
    k_on = (k > 0) & (k < vocab)
    greedy = temp.to(tl.float64) < GREEDY_T
    return ~k_on & ~(top_p < 1.0) & ~(min_p > 0.0) & ~greedy


@triton.jit
def scale(x, temp):
    """z = x / T (IEEE round-to-nearest), x unscaled on greedy rows, -0.0 folded to +0.0."""
    return exact_z(x, scale_temp(temp))


@triton.jit
def scale_temp(temp):
    """The temperature scale() divides by: T, or 1 on greedy rows."""
    return tl.where(temp.to(tl.float64) < GREEDY_T, 1.0, temp)


@triton.jit
def exact_z(x, t):
    """scale() with the greedy rows' t = 1 already applied."""
    z = tl.math.div_rn(x, t)
    return tl.where(z == 0.0, 0.0, z)


@triton.jit
def logit_floor(t, temp):
    """(x_t, ok): for every float32 logit x, scale(x, temp) > t exactly when x >= x_t (NaN
    neither), if ok. z = RN(x / T) is monotone in x, so the tokens above t are the logits
    from one float up: x_t is found from RN(t * T) by a bisection over the 1024 floats
    around it (clipped to -inf .. +inf), each step one exact division (a scalar: ten a row).
    ok is False only when x_t lies further away, which takes a finite t near the float
    range's ends (|t * T| overflowing) or a denormal t * T with T over about 1000, and then
    no x_t is given."""
    tt = scale_temp(temp)
    y = tl.where(t == float("-inf"), -FLT_MAX, t) * tt
    o = ordered32(tl.minimum(tl.maximum(y, -FLT_MAX), FLT_MAX))
    lo = tl.maximum(o - 512, ordered32(tl.full([], float("-inf"), tl.float32)))  # no NaN
    hi = tl.minimum(o + 512, ordered32(tl.full([], float("inf"), tl.float32)))
    ok = (exact_z(from_ordered32(lo), tt) <= t) & (exact_z(from_ordered32(hi), tt) > t)
    for _ in tl.static_range(10):  # keeps z(lo) <= t < z(hi); 1024 floats apart, then 1
        mid = lo + ((hi - lo) >> 1)
        up = exact_z(from_ordered32(mid), tt) > t
        hi = tl.where(up, mid, hi)
        lo = tl.where(up, lo, mid)
    return from_ordered32(hi), ok


@triton.jit
def ordered32(z):
    """float32 -> int32 in the same order (negative floats get their magnitude bits flipped)."""
    bits = z.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def from_ordered32(o):
    """ordered32's inverse."""
    return (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def pack_key(z, ids):
    """float32 z, int64 ids -> int64 keys ordered as the mask semantics say (larger key first)."""
    return (ordered32(z).to(tl.int64) << 32) | (MASK32 - ids)


@triton.jit
def unpack_z(keys):
    """int64 keys -> float32 z (EMPTY_KEY decodes to NaN; callers mask it)."""
    return from_ordered32((keys >> 32).to(tl.int32))


@triton.jit
def unpack_id(keys):
    return MASK32 - (keys & MASK32)


# Combine functions for tl.reduce over tuples: one block-wide reduction carries several
# values, so independent sums and maxima share its shuffles and barriers. resolve_kernel is
# latency-bound (one program per row), and each separate reduction costs ~0.2 us of it.
@triton.jit
def max3(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), tl.maximum(a2, b2)


@triton.jit
def add2_max2(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, tl.maximum(a2, b2), tl.maximum(a3, b3)


@triton.jit
def add3_max3(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return (
        a0 + b0,
        a1 + b1,
        a2 + b2,
        tl.maximum(a3, b3),
        tl.maximum(a4, b4),
        tl.maximum(a5, b5),
    )


@triton.jit
def add3_max3_add3(a0, a1, a2, a3, a4, a5, a6, a7, a8, b0, b1, b2, b3, b4, b5, b6, b7, b8):
    a = add3_max3(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5)
    return a[0], a[1], a[2], a[3], a[4], a[5], a6 + b6, a7 + b7, a8 + b8


@triton.jit
def argmax_key_add(s0, p0, k0, a0, s1, p1, k1, a1):
    """The larger score (the lower position on ties) with its key, and a sum."""
    first = (s0 > s1) | ((s0 == s1) & (p0 < p1))
    return tl.where(first, s0, s1), tl.where(first, p0, p1), tl.where(first, k0, k1), a0 + a1


@triton.jit
def add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def add5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4


@triton.jit
def add6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5


@triton.jit
def max1_add1(a0, a1, b0, b1):
    return tl.maximum(a0, b0), a1 + b1


@triton.jit
def add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


# The quartering count search (resolve's tier pick and pass 1's band cut): each step counts
# at three thresholds in one reduction and keeps the quarter that crosses the limit.
@triton.jit
def quarters(lo, hi):
    q = (hi - lo) * 0.25
    return lo + q, lo + 2.0 * q, lo + 3.0 * q


@triton.jit
def keep_quarter(lo, hi, q1, q2, q3, c1, c2, c3, limit):
    """(lo, hi) narrowed to the quarter where the count falls from above limit to at most it
    (counts at lo > limit, at hi <= limit, and c1 >= c2 >= c3 at q1 < q2 < q3)."""
    new_lo = tl.where(c3 > limit, q3, tl.where(c2 > limit, q2, tl.where(c1 > limit, q1, lo)))
    new_hi = tl.where(c3 > limit, hi, tl.where(c2 > limit, q3, tl.where(c1 > limit, q2, q1)))
    return new_lo, new_hi
