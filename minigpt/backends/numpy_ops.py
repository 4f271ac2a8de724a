"""The numpy backend: every op of the interface in plain NumPy. This is the executable specification (attention
runs Ops' composition of these ops).

It is dtype-generic (the finite-difference tests run it in float64), and tests/test_ops.py compares every
other backend with it. The products are np.matmul on OpenBLAS, which reads any strided view. The rest is
written for reading first: each op is its formula, one ufunc per step, computed in place in the caller's
arrays and in scratch kept per shape (Ops._tmp). That is also what makes it fast: a fresh temporary of
activation size costs more than the arithmetic on it here (glibc hands freed blocks back to the OS, so each
new one is page-faulted in again). Scalars stay Python floats, so float32 is never computed in float64.
"""
import math

import numpy as np

from .interface import Ops, dropout_keep_from, future

GELU_C, GELU_A = math.sqrt(2.0 / math.pi), 0.044715


# dropout's random bits: a counter-based hash of (seed, element number), so that any backend and any thread
# draws the same mask. The mixer is a bijection of 32-bit words (xor-shifts and odd multipliers); its two
# multipliers are those of "lowbias32", found by Chris Wellons' hash-prospector search.
MIX = (np.uint32(0x7FEB352D), np.uint32(0x846CA68B))
GOLDEN = np.uint32(0x9E3779B9)                                    # 2**32 / the golden ratio
CHUNK = 1 << 16                                                  # elements hashed at once (in L2)
COUNT = np.arange(CHUNK, dtype=np.uint32)                         # 0, 1, ..., CHUNK - 1
COUNT.flags.writeable = False


def mix32(x, t):
    """x (uint32) <- a scramble of each element, in place; t: scratch of x's shape."""
    for shift, mul in ((16, MIX[0]), (15, MIX[1]), (16, None)):
        x ^= np.right_shift(x, shift, out=t)
        if mul is not None:
            x *= mul                                              # modulo 2**32
    return x


def dropout_keys(seed):
    """The two 32-bit keys of a 64-bit seed: k1 = mix32(lo), k2 = mix32(hi ^ mix32(k1 ^ GOLDEN)), lo and hi its low
    and high halves. A bijection of the seed with no shortcut between the keys (k2 = mix32(hi ^ k1) made element 0
    of every seed below 2**32 the same), so seeds that differ in a bit draw unrelated masks. (One-element arrays:
    numpy wraps uint32 arithmetic on arrays silently, and warns on scalars.)"""
    one = np.empty(1, np.uint32)
    k1 = mix32(np.array([seed & 0xFFFFFFFF], np.uint32), one)
    k2 = mix32(np.uint32(seed >> 32) ^ mix32(k1 ^ GOLDEN, one), one)
    return k1[0], k2[0]


def dropout_hash(keys, n, t):
    """The 32 random bits of element numbers n (uint32, overwritten) under a seed's keys: mix32(mix32(n ^ k1) ^ k2)."""
    n ^= keys[0]
    mix32(n, t)
    n ^= keys[1]
    return mix32(n, t)


def _t(x, flag):
    return x.swapaxes(-1, -2) if flag else x


def round_bf16(x, out, nan=None):
    """float32 x -> out: each value rounded to the nearest bfloat16 (8 significant bits, float32's exponent
    range), ties to even, kept as float32 whose low 16 bits are zero. A NaN stays NaN (made quiet), a finite
    value from halfway past the largest bf16 on (3.3962e38; the largest is 3.3895e38) rounds to inf; subnormals
    round like any other value (native's products round them to 0, as vcvtneps2bf16 does: README, bf16). nan:
    bool scratch of x's shape (a backend's, so that a step allocates nothing), else made here. Returns out."""
    u = x.view(np.uint32)                                           # the float's bits (a view: x may be strided)
    r = out.view(np.uint32)
    np.right_shift(u, 16, out=r)
    r &= 1                                                          # the lowest kept bit: a tie goes to even
    r += 0x7FFF                                                     # + half an ulp of bf16 (less, on even)
    r += u                                                          # carries into the kept bits when past half
    r &= 0xFFFF0000                                                 # truncate
    nan = np.isnan(x, out=nan)
    if nan.any():
        r[nan] = (u[nan] | 0x00400000) & 0xFFFF0000                 # quiet NaN, sign and top payload kept
    return out


def bf16_operands(ops, a, b):
    """(a, b) rounded to bf16 (round_bf16) into ops' contiguous scratch: the operands of a bf16 product on the
    numpy and numba backends."""
    rounded = (round_bf16(x, ops._tmp(f"bf16{k}", x.shape, x.dtype), ops._tmp("nan", x.shape, bool))
               for k, x in (("a", a), ("b", b)))
    return tuple(rounded)


def product(ops, a, b, ta, tb, out, acc, bf16):
    """out (+)= op(a) @ op(b) by np.matmul (BLAS), stacks too, scratch from ops: the specification's products,
    which the numba backend runs as well. Returns out."""
    if bf16:                                                        # a product of two bf16 values is exact in
        a, b = bf16_operands(ops, a, b)                             # float32, so only the sums round
    if acc:                                                         # numpy has no beta = 1: a product, then +=
        out += np.matmul(_t(a, ta), _t(b, tb), out=ops._tmp("acc", out.shape, out.dtype))
        return out
    return np.matmul(_t(a, ta), _t(b, tb), out=out)


class NumpyOps(Ops):
    name = "numpy"
    dtypes = frozenset({np.dtype(np.float32), np.dtype(np.float64)})

    # ---- products
    def _matmul(self, a, b, ta, tb, out, acc, bf16):
        return product(self, a, b, ta, tb, out, acc, bf16)

    _bmm = _matmul

    # ---- LayerNorm over the last axis: keep mean and rstd (N,), recompute xhat in backward
    def _layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):      # x (N, C) -> out (N, C)
        np.mean(x, axis=-1, out=mean)
        xc = np.subtract(x, mean[:, None], out=out)                 # x - mean, in out from here
        var = np.mean(np.square(xc, out=self._tmp("ln", x.shape, x.dtype)), axis=-1, out=rstd)
        np.divide(1.0, np.sqrt(var + eps), out=rstd)                # rstd = 1 / sqrt(var + eps), (N,)
        xc *= rstd[:, None]                                         # xhat
        xc *= w                                                     # y = xhat * w + b
        if b is not None:
            xc += b
        return out

    def _layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db, acc=False):   # dy (N, C) -> dx (+=)
        xhat = np.subtract(x, mean[:, None], out=self._tmp("xhat", x.shape, x.dtype))
        xhat *= rstd[:, None]                                       # recomputed, not stored
        prod = np.multiply(dy, xhat, out=self._tmp("prod", x.shape, x.dtype))
        dw += prod.sum(0)                                           # fwd: y = xhat * w + b
        if db is not None:
            db += dy.sum(0)
        dxhat = np.multiply(dy, w, out=self._tmp("dxhat", x.shape, x.dtype) if acc else dx)   # dx may be dy
        # fwd: xhat = (x - mean) * rstd  ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        mean_dxhat_xhat = np.multiply(dxhat, xhat, out=prod).mean(-1, keepdims=True)     # (N, 1)
        dxhat -= dxhat.mean(-1, keepdims=True)
        dxhat -= np.multiply(xhat, mean_dxhat_xhat, out=xhat)
        dxhat *= rstd[:, None]                                      # dx, in place
        if acc:
            dx += dxhat                                             # the residual stream's gradient: x's other use
        return dx

    # ---- GELU, tanh form as GPT-2: y = 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3), of x + b. Computed with
    #      s = 0.5 (1 + tanh u) = 1 / (1 + e^{-2u}): one exp (cheaper than np.tanh), and 1 - s = e^{-2u} s
    #      has no cancellation. -2u is clipped to the largest whole exponent with a finite e^{-2u} (88 in float32,
    #      709 in float64), where s is already 0 or 1 (up to 1e-38 or 1e-308).
    def _gelu(self, x, b, out, dgelu):                                # x (..., H), b (H,) or None
        if b is not None:
            np.add(x, b, out=out)
        elif out is not x:
            np.copyto(out, x)
        xb = out                                                    # x + b, in out (which may be x) from here
        x2 = np.square(xb, out=self._tmp("gelu x2", x.shape, x.dtype))
        e = np.multiply(x2, -2 * GELU_C * GELU_A, out=dgelu)       # in dgelu: e^{-2u}, 1 - s, then gelu'
        e -= 2 * GELU_C
        e *= xb                                                     # -2u = -2c (x + a x^3)
        lim = math.floor(math.log(np.finfo(e.dtype).max))
        np.clip(e, -lim, lim, out=e)
        np.exp(e, out=e)
        s = np.add(e, 1.0, out=self._tmp("gelu s", x.shape, x.dtype))
        np.divide(1.0, s, out=s)                                    # s = 0.5 (1 + tanh u)
        e *= s                                                      # 1 - s
        xb *= s                                                     # y = x s: xb holds y from here
        # gelu' = s + 0.5 x (1 - t^2) du/dx = s + x s (1 - s) * 2c (1 + 3a x^2), kept: backward is one multiply
        x2 *= 6 * GELU_C * GELU_A
        x2 += 2 * GELU_C                                            # 2 du/dx
        e *= xb                                                     # (1 - s) x s
        e *= x2
        e += s
        return out

    def _gelu_backward(self, dout, dgelu, dx, db):                  # dout (..., H) -> dx (..., H)
        np.multiply(dout, dgelu, out=dx)                            # fwd: y = gelu(x + b)
        if db is not None:
            db += dx.reshape(-1, dx.shape[-1]).sum(0)               # b is added to every row
        return dx

    # ---- causal softmax over the last axis of scaled scores (..., T, Tk)
    def _causal_softmax(self, att, scale, start=0):                   # att (..., T, Tk), in place
        T, Tk = att.shape[-2:]
        # scaled scores s, worked on in att itself, or for a view (att[..., :Tk]) in contiguous scratch (faster)
        s = att if att.flags.c_contiguous else self._tmp("softmax", att.shape, att.dtype)
        np.multiply(att, float(scale), out=s)
        np.copyto(s, -np.inf, where=future(T, Tk, start))          # query i sees keys 0..start+i; -inf, never -1e4
        s -= s.max(-1, keepdims=True)                               # max-subtracted: exp never overflows
        np.exp(s, out=s)                                            # masked entries: exp(-inf) = exactly 0
        np.divide(s, s.sum(-1, keepdims=True), out=att)
        return att

    def _causal_softmax_backward(self, att, datt, scale, start=0):
        # fwd: att = softmax(scale * s) -> ds = scale * att * (datt - sum_j datt_j att_j); masked att are 0, so
        # start (which the forward's mask needed) is not needed here
        tmp = self._tmp("softmax", att.shape, att.dtype)
        datt -= np.multiply(datt, att, out=tmp).sum(-1, keepdims=True)
        datt *= np.multiply(att, float(scale), out=tmp)
        return datt

    # ---- softmax cross-entropy: loss = mean_n (lse_n - logits[n, t_n])
    def _cross_entropy(self, logits, targets, lse):                  # logits (N, V), targets (N,) -> loss
        m = logits.max(-1)                                          # (N,)
        e = np.subtract(logits, m[:, None], out=self._tmp("xent", logits.shape, logits.dtype))
        np.exp(e, out=e)
        np.log(e.sum(-1), out=lse)
        lse += m                                                    # log-sum-exp, never log(softmax)
        return float(np.mean(lse - logits[np.arange(targets.size), targets]))

    def _cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        np.exp(np.subtract(logits, lse[:, None], out=dlogits), out=dlogits)
        dlogits *= float(scale)                                     # softmax * scale
        dlogits[np.arange(targets.size), targets] -= scale          # - onehot * scale
        return dlogits

    # ---- embedding scatter-add and AdamW
    def _embedding_backward(self, dW, idx, dout):                    # dW (V, C), idx (N,), dout (N, C)
        # fwd: out = W[idx] -> dW[idx[n]] += dout[n]; np.add.at adds repeated ids one at a time, in order.
        # Over flat element indices numpy takes its fast 1-D path (faster than over rows).
        if not dW.flags.c_contiguous:                               # a view: dW.reshape(-1) would be a copy
            np.add.at(dW, idx, dout)
            return
        C = dW.shape[1]
        flat = self._tmp("emb", dout.shape, np.intp)               # flat[n, j]: where dW[idx[n], j] is in dW.ravel()
        np.add(idx.reshape(-1, 1).astype(np.intp) * C, np.arange(C), out=flat)
        np.add.at(dW.reshape(-1), flat.reshape(-1), dout.reshape(-1))

    def _adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        """One in-place update as torch.optim.AdamW: decoupled decay, bias-corrected moments."""
        lr, b1, b2, eps, wd, bc1, bc2 = map(float, (lr, b1, b2, eps, wd, bc1, bc2))   # an np.float64 would upcast
        tmp, step = self._tmp("adam", g.shape, g.dtype), self._tmp("adam step", g.shape, g.dtype)
        p *= 1.0 - lr * wd                                          # p -= lr * wd * p
        m *= b1
        m += np.multiply(g, 1.0 - b1, out=tmp)                      # m = b1 m + (1 - b1) g
        v *= b2
        v += np.multiply(np.square(g, out=tmp), 1.0 - b2, out=tmp)  # v = b2 v + (1 - b2) g^2
        np.sqrt(v, out=tmp)
        tmp /= math.sqrt(bc2)
        tmp += eps                                                  # sqrt(v_hat) + eps
        p -= np.divide(np.multiply(m, lr / bc1, out=step), tmp, out=step)   # p -= lr m_hat / (sqrt(v_hat) + eps)

    # ---- dropout
    def _dropout(self, x, p, seed, out):                             # out = x * (0 or 1 / (1 - p))
        keys, keep_from, scale = dropout_keys(seed), dropout_keep_from(p), x.dtype.type(1.0 / (1.0 - p))
        c = self._contiguous("dropout")
        xf, of = c.inp(x).reshape(-1), c.out(out).reshape(-1)
        n, t = self._tmp("dropout n", (CHUNK,), np.uint32), self._tmp("dropout t", (CHUNK,), np.uint32)
        keep, m = self._tmp("dropout keep", (CHUNK,), bool), self._tmp("dropout m", (CHUNK,), x.dtype)
        for i in range(0, x.size, CHUNK):
            k = min(CHUNK, x.size - i)
            u = dropout_hash(keys, np.add(COUNT[:k], np.uint32(i), out=n[:k]), t[:k])   # element numbers i, i + 1, ...
            np.greater_equal(np.right_shift(u, 8, out=u), keep_from, out=keep[:k])  # 24 random bits >= keep_from
            np.multiply(keep[:k], scale, out=m[:k])                             # the mask: 0 or 1 / (1 - p)
            np.multiply(xf[i:i + k], m[:k], out=of[i:i + k])
        c.back()
        return out

    def set_threads(self, n):
        from threadpoolctl import threadpool_limits
        threadpool_limits(n, user_api="blas")                       # OpenBLAS's own pool


_backend = NumpyOps()


def backend():
    return _backend
