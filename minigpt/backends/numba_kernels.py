"""numba kernels for the non-matmul ops of the numba backend, and the zeroing of a causal product's future (native
has its own, in C: native/mgk_ops.c).
numpy_ops.py holds the NumPy specification of each one (tests/test_ops.py compares them); numba_ops.py calls
these with contiguous arrays. The first module of the backend to import numba: it sets numba's environment first.

Every kernel compiles for float32 (training) and float64; tests/test_ops.py holds the float64 ones to the
float64 specification (to 1e-12), the one the finite-difference tests check. numba here has no SVML: np.exp/np.tanh
in @njit are scalar libm calls that also stop vectorisation, so float32 exp is inline (_exp32: range reduction +
polynomial); float64 keeps libm's math.exp/math.tanh.
fastmath stays off (sums stay plain IEEE, as everywhere in minigpt), so a loop carrying a running sum never
vectorises: row sums go through _sum8 (8 interleaved lanes), and wide loops are written as axpys over a
contiguous last axis.
"""
import math
import os
import sys

import numpy as np


def _configure_numba():
    """Environment numba reads once, at import: only applied if numba is not loaded yet and the user set nothing."""
    if "numba" in sys.modules:
        return
    # GNU OpenMP (numba's default threading layer here) spin-waits by default and steals the cores that the
    # products' BLAS, the native pool and other processes need; PASSIVE makes idle workers sleep.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # LLVM tunes AVX-512 CPUs to prefer 256-bit vectors; with 512-bit ones config S's GELU and softmax kernels run
    # faster (at config M they are memory-bound: reports/benchmarks.md, numba's LLVM flags). Same host features
    # numba would use, minus that tuning flag.
    if "NUMBA_CPU_FEATURES" not in os.environ and "NUMBA_CPU_NAME" not in os.environ:
        try:
            import llvmlite.binding as llb
            features = llb.get_host_cpu_features().flatten()
        except Exception:                  # noqa: BLE001  (no llvmlite: the import below reports it)
            return
        if "+avx512f" in features.split(","):
            os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"


_configure_numba()
from llvmlite import ir                                    # noqa: E402
from numba import njit, prange, types                      # noqa: E402
from numba.extending import intrinsic, overload            # noqa: E402

_JIT = dict(cache=True, fastmath=False, error_model="numpy")     # x / 0 is inf, not an exception
F32 = np.float32
GELU_C, GELU_A = math.sqrt(2.0 / math.pi), 0.044715


# ----------------------------------------------------------------------------
# scalar helpers: one implementation per dtype, picked at compile time by @overload

@intrinsic
def _f32_from_bits(typingctx, i):
    """The float32 whose bit pattern is the low 32 bits of the int64 i (LLVM bitcast, no conversion)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(types.int64), codegen


_LOG2E, _LN2_HI, _LN2_LO = F32(1.4426950408889634), F32(0.693359375), F32(-2.12194440e-4)
_E0, _E1, _E2 = F32(1.9875691500e-4), F32(1.3981999507e-3), F32(8.3334519073e-3)   # cephes expf
_E3, _E4, _E5 = F32(4.1665795894e-2), F32(1.6666665459e-1), F32(5.0000001201e-1)
_EXP_LO, _EXP_HI = F32(-87.33654), F32(88.72283)          # exp(LO) = FLT_MIN, exp(HI) = FLT_MAX


@njit(**_JIT)
def _exp32(x):
    """float32 e**x within 2 ulp: x = n ln2 + r (|r| <= ln2/2, ln2 split hi+lo so n ln2 is exact), e**r by
    the cephes polynomial, times 2**n built in the exponent field (two halves: both ends stay normal).
    Below LO it returns 0 (so -inf -> exactly 0), above HI inf; NaN stays NaN."""
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc
    n = np.floor(xc * _LOG2E + F32(0.5))
    r = xc - n * _LN2_HI - n * _LN2_LO
    p = ((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5
    p = p * r * r + r + F32(1.0)
    ni = np.int64(n)
    h = ni >> 1
    e = p * _f32_from_bits((h + 127) << 23) * _f32_from_bits((ni - h + 127) << 23)
    return F32(0.0) if x < _EXP_LO else (F32(np.inf) if x > _EXP_HI else e)


def _exp(x):
    """e**x in the precision of x (the overload below picks the implementation)."""
    return math.exp(x)


@overload(_exp)
def _exp_impl(x):
    if x == types.float32:
        return lambda x: _exp32(x)
    return lambda x: math.exp(x)


def _gelu(x):
    """(y, dy/dx) of y = 0.5 x (1 + tanh(u)), u = c (x + a x^3): one exp serves both."""


@overload(_gelu)
def _gelu_impl(x):
    if x == types.float32:                                 # 0.5 (1 + tanh u) = 1 / (1 + e^{-2u}): no cancellation
        c, c2, a, a3 = F32(GELU_C), F32(-2.0 * GELU_C), F32(GELU_A), F32(3.0 * GELU_A)

        def gelu32(x):
            e = _exp32(c2 * (x + a * x * x * x))           # e^{-2u}
            s = F32(1.0) / (F32(1.0) + e)                  # s = 0.5 (1 + t)
            sm = F32(1.0) - s if e > F32(1.0) else e * s   # 1 - s = 0.5 (1 - t), accurate when s ~ 1
            xk = x * s * sm                                # 0.5 (1 - t^2) = 2 s (1 - s), 0 for large |x|
            return x * s, s + F32(2.0) * c * (xk + a3 * x * (x * xk))   # x * (x * xk): no inf * 0 for big x
        return gelu32

    def gelu64(x):
        t = math.tanh(GELU_C * (x + GELU_A * x * x * x))
        return 0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * GELU_A * x * x)
    return gelu64


@njit(**_JIT)
def _sum8(a, n):
    """sum(a[:n]) of a 1-D array in 8 lanes of a's dtype: 8 independent adds per step instead of one
    dependent chain (fastmath is off, so LLVM may not reorder a plain running sum itself; the order is fixed)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = a.dtype.type(0.0)
    j = 0
    while j + 8 <= n:
        s0 += a[j]; s1 += a[j + 1]; s2 += a[j + 2]; s3 += a[j + 3]            # noqa: E702
        s4 += a[j + 4]; s5 += a[j + 5]; s6 += a[j + 6]; s7 += a[j + 7]        # noqa: E702
        j += 8
    s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    while j < n:
        s += a[j]
        j += 1
    return s


@njit(**_JIT)
def _max8(a, n):
    """max(a[:n]), n >= 1, in 8 lanes as _sum8 (a NaN in the row reaches the softmax through exp anyway)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = a[0]
    j = 0
    while j + 8 <= n:
        m0 = max(m0, a[j]); m1 = max(m1, a[j + 1]); m2 = max(m2, a[j + 2]); m3 = max(m3, a[j + 3])    # noqa: E702
        m4 = max(m4, a[j + 4]); m5 = max(m5, a[j + 5]); m6 = max(m6, a[j + 6]); m7 = max(m7, a[j + 7])  # noqa: E702
        j += 8
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    while j < n:
        m = max(m, a[j])
        j += 1
    return m


@njit(**_JIT)
def _exp32_array(x):                                       # tests: _exp32 over a 1-D float32 array
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = _exp32(x[i])
    return out


# ----------------------------------------------------------------------------
# LayerNorm: keep mean and rstd (N,), recompute xhat in backward

@njit(parallel=True, **_JIT)
def layernorm_fwd(x, w, b, eps, y, mean, rstd):            # x, y (N, C); w, b (C,); mean, rstd (N,)
    N, C = x.shape
    for i in prange(N):
        mean[i] = _sum8(x[i], C) / C
        mi = mean[i]                                        # in x's dtype: the row loops keep that precision
        for j in range(C):
            y[i, j] = (x[i, j] - mi) * (x[i, j] - mi)       # y as scratch for the variance
        rstd[i] = 1.0 / math.sqrt(_sum8(y[i], C) / C + eps)
        ri = rstd[i]
        for j in range(C):
            y[i, j] = (x[i, j] - mi) * ri * w[j] + b[j]     # y = xhat * w + b


@njit(parallel=True, **_JIT)
def layernorm_bwd(dy, x, w, mean, rstd, dx, acc):           # dy, x -> dx (N, C), written (acc: added into)
    N, C = x.shape
    for i in prange(N):
        mi, ri = mean[i], rstd[i]
        a, c = np.empty(C, x.dtype), np.empty(C, x.dtype)   # a: dxhat, c: dxhat * xhat
        for j in range(C):
            a[j] = dy[i, j] * w[j]                          # fwd: y = xhat * w + b
            c[j] = a[j] * ((x[i, j] - mi) * ri)
        ma, mc = x.dtype.type(_sum8(a, C) / C), x.dtype.type(_sum8(c, C) / C)   # mean(dxhat), mean(dxhat xhat)
        for j in range(C):                                  # fwd: xhat = (x - mean) * rstd ->
            v = ri * (a[j] - ma - (x[i, j] - mi) * ri * mc)   # dx = rstd (dxhat - ma - xhat mc)
            dx[i, j] = dx[i, j] + v if acc else v


@njit(**_JIT)
def layernorm_bwd_params(dy, x, mean, rstd, dw, db):        # dw, db (C,) += over the rows (serial: one sum)
    N, C = x.shape                                          # db of size 0: no bias
    for i in range(N):
        mi, ri = mean[i], rstd[i]
        for j in range(C):
            dw[j] += dy[i, j] * ((x[i, j] - mi) * ri)      # fwd: y = xhat * w + b
        if db.size:
            for j in range(C):
                db[j] += dy[i, j]


# ----------------------------------------------------------------------------
# GELU (tanh form) of x + b over (N, H) rows, b (H,) per column; the backward also sums db over the rows

@njit(parallel=True, **_JIT)
def gelu_fwd(x, b, y, dydx):                                # x, y, dydx (N, H), b (H,): y = gelu(x + b)
    N, H = x.shape                                          # dydx is kept for backward: dx = dy * dydx
    for i in prange(N):
        xi, yi, di = x[i], y[i], dydx[i]
        for j in range(H):
            yi[j], di[j] = _gelu(xi[j] + b[j])


@njit(parallel=True, **_JIT)
def gelu_fwd_inplace(y, b, dydx):                           # y (N, H): x in, gelu(x + b) out; dydx (N, H)
    N, H = y.shape                                          # its own kernel: with x and y one array, gelu_fwd's
    for i in prange(N):                                     # loop cannot prove them apart and runs much slower
        yi, di = y[i], dydx[i]
        for j in range(H):
            yi[j], di[j] = _gelu(yi[j] + b[j])


@njit(**_JIT)
def gelu_bwd(dy, dydx, dx, db):                             # dx = dy * dydx (N, H); db (H,) += sum over rows of dx
    N, H = dy.shape                                         # serial: db is one running sum per column
    for i in range(N):                                      # db of size 0: no bias
        for j in range(H):
            dx[i, j] = dy[i, j] * dydx[i, j]                # fwd: y = gelu(x + b) -> dx = dy gelu'(x + b)
        if db.size:
            for j in range(H):
                db[j] += dx[i, j]                           #                          db = sum_rows dx


# ----------------------------------------------------------------------------
# causal softmax over (L, T, Tk) rows, skipping the masked (future) half; query i sees keys 0..start+i

@njit(parallel=True, **_JIT)
def causal_softmax_fwd(att, scale, start):                 # scores -> probabilities, in place, (L, T, Tk)
    L, T, Tk = att.shape                                    # in place: no aliasing check, so the loops vectorise
    scale = att.dtype.type(scale)                          # float32 math stays float32 (and uses _exp32)
    for l in prange(L):
        for i in range(T):
            r, n = att[l, i], min(start + i + 1, Tk)        # query i sees keys 0..start+i (all, past Tk)
            m = _max8(r, n)                                 # max-subtracted: exp never overflows
            for j in range(n):
                r[j] = _exp((r[j] - m) * scale)
            inv = att.dtype.type(1.0 / _sum8(r, n))
            for j in range(n):
                r[j] *= inv
            r[n:] = 0.0                                     # the future gets exactly zero weight


@njit(parallel=True, **_JIT)
def zero_future(out, start):                                # causal bmm "out": row i's keys past start+i -> 0
    L, T, Tk = out.shape
    for l in prange(L):
        for i in range(T):
            out[l, i, min(start + i + 1, Tk):] = 0.0


@njit(parallel=True, **_JIT)
def causal_softmax_bwd(att, g, scale, start):              # g: d(att) -> d(scores), in place, (L, T, Tk)
    L, T, Tk = att.shape
    scale = att.dtype.type(scale)
    for l in prange(L):
        prod = np.empty(Tk, att.dtype)
        for i in range(T):
            a, r, n = att[l, i], g[l, i], min(start + i + 1, Tk)
            for j in range(n):
                prod[j] = r[j] * a[j]
            d = att.dtype.type(_sum8(prod, n))             # sum_j datt_j att_j
            for j in range(n):                              # fwd: att = softmax(scale s) -> ds = scale att (datt - d)
                r[j] = scale * a[j] * (r[j] - d)
            r[n:] = 0.0


# ----------------------------------------------------------------------------
# softmax cross-entropy: forward keeps the row log-sum-exp, backward writes (softmax - onehot) * scale

@njit(**_JIT)
def xent_fwd(logits, targets, lse):                        # logits (N, V), targets (N,) -> lse (N,); -> sum of losses
    N, V = logits.shape                                     # serial: (N, V) is small next to the matmuls
    e = np.empty(V, logits.dtype)
    total = 0.0
    for i in range(N):
        r = logits[i]
        m = _max8(r, V)                                     # max-subtracted: exp never overflows
        for j in range(V):
            e[j] = _exp(r[j] - m)
        lse[i] = m + math.log(_sum8(e, V))                  # log-sum-exp, never log(softmax)
        total += lse[i] - r[targets[i]]
    return total


@njit(**_JIT)
def xent_bwd(logits, targets, lse, scale, dlogits):        # dlogits (N, V) = (softmax - onehot) * scale
    N, V = logits.shape
    scale = logits.dtype.type(scale)
    for i in range(N):
        r, d, li = logits[i], dlogits[i], lse[i]
        for j in range(V):
            d[j] = _exp(r[j] - li) * scale
        d[targets[i]] -= scale


# ----------------------------------------------------------------------------
# embedding scatter-add and AdamW

@njit(**_JIT)
def scatter_add(g, idx, dout):                            # g[idx[n]] += dout[n]: g (V, C), idx (N,), dout (N, C)
    for n in range(idx.size):                               # serial: repeated ids must add up, in order
        r = idx[n]
        for j in range(g.shape[1]):
            g[r, j] += dout[n, j]


@njit(**_JIT)
def adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):     # all flat (n,), updated in place
    f = p.dtype.type                                        # coefficients in p's dtype: float32 math for float32
    a, rb, decay = f(lr / bc1), f(1.0 / math.sqrt(bc2)), f(1.0 - lr * wd)
    b1, c1, b2, c2, eps = f(b1), f(1.0 - b1), f(b2), f(1.0 - b2), f(eps)
    for i in range(p.size):                                 # serial: memory-bound, and a parallel launch costs
        gi = g[i]                                           # more than most parameters take
        m[i] = b1 * m[i] + c1 * gi                          # m = b1 m + (1 - b1) g
        v[i] = b2 * v[i] + c2 * (gi * gi)                   # v = b2 v + (1 - b2) g^2
        p[i] = p[i] * decay - a * m[i] / (np.sqrt(v[i]) * rb + eps)   # decoupled decay, then Adam


# ----------------------------------------------------------------------------
# dropout: numpy_ops.dropout_hash, element by element, in 64-bit integers kept to their low 32 bits

_M32, _MIX1, _MIX2 = np.uint64(0xFFFFFFFF), np.uint64(0x7FEB352D), np.uint64(0x846CA68B)
_GOLDEN = np.uint64(0x9E3779B9)


@njit(**_JIT)
def _mix32(x):                                             # x: uint64 < 2**32 -> numpy_ops.mix32 of it
    x ^= x >> np.uint64(16)
    x = (x * _MIX1) & _M32
    x ^= x >> np.uint64(15)
    x = (x * _MIX2) & _M32
    return x ^ (x >> np.uint64(16))


@njit(parallel=True, **_JIT)
def dropout(x, out, lo, hi, keep_from, scale):             # x, out (n,) flat: out = x * (0 or scale), element i by its
    k1 = _mix32(np.uint64(lo))                              # own hash; numpy_ops.dropout_keys
    k2 = _mix32(np.uint64(hi) ^ _mix32(k1 ^ _GOLDEN))
    keep_from, scale, zero = np.uint64(keep_from), x.dtype.type(scale), x.dtype.type(0.0)
    for i in prange(x.size):
        u = _mix32(_mix32(np.uint64(i) ^ k1) ^ k2)
        out[i] = x[i] * (scale if (u >> np.uint64(8)) >= keep_from else zero)
