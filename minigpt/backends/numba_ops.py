"""The numba backend: the interface's ops on numba kernels (products: numba_gemm.py; the rest: numba_kernels.py).

The kernels walk C-contiguous arrays. A strided view (a head of the qkv array, say) goes through Ops._contiguous:
copied into a scratch array kept per shape, and an output's result copied back, so this backend takes views
like every other one and still allocates nothing of activation size per step (only (B*T,) int64 copies of
the token ids and targets). A model runs float32 here (dtypes): the GEMM is float32 only; the other kernels
also compile for float64, which the tests use.
"""
import math

import numpy as np

from . import BackendUnavailable, Ops, check_dropout, check_float32, dropout_keep_from, gemm_dims
from .numpy_ops import bf16_operands

try:
    from . import numba_gemm as G                  # first: it sets numba's environment before importing numba
    from . import numba_kernels as NK
    import numba
except ImportError as e:                           # reported by backend(), so "auto" can skip numba
    numba, _IMPORT_ERROR = None, e

SERIAL_BELOW = 16384     # elements of work: below this a kernel runs on one thread (waking numba's other threads
                         # costs ~17 us here, more than the one-row LayerNorms and GELUs of decoding take)


class NumbaOps(Ops):
    name = "numba"
    dtypes = frozenset({np.dtype(np.float32)})       # the GEMM is float32 (the other kernels also compile float64)

    def __init__(self):
        super().__init__()
        self.nt = 1
        self._none = {}

    # ---- plumbing: thread counts, the absent bias (views: Ops._contiguous)
    def _threads(self, work):
        n = 1 if work < SERIAL_BELOW else self.nt
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)

    def _zeros(self, n, dtype):          # zero bias of length n; n = 0 tells a backward kernel there is no bias
        key = (n, np.dtype(dtype))
        if key not in self._none:
            self._none[key] = np.zeros(n, dtype)
        return self._none[key]

    def set_threads(self, n):
        self.nt = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(self.nt)

    # ---- products
    def _matmul(self, a, b, ta, tb, out, acc, bf16):
        self._bmm(a[None], b[None], ta, tb, out[None], acc, bf16)
        return out                                                 # out itself, not a view of it

    own_causal = True                                              # causal "out": zeroed by a kernel

    def _bmm(self, a, b, ta, tb, out, acc, bf16, causal=None, start=0):   # a (..., M, K), b (..., K, N) -> (..., M, N)
        check_float32(a, b, out, backend=self.name)
        M, N, K = gemm_dims(a, b, ta, tb)
        L = math.prod(a.shape[:-2])                                 # not -1: an empty stack has no size to infer it
        nt = self.nt if out.size * K >= SERIAL_BELOW * 16 else 1       # tiny products (decoding): one thread
        c = self._contiguous("bmm")
        if bf16:                                                    # bf16 operands by the specification's
            a, b = bf16_operands(self, a, b)                        # formula; the float32 GEMM sums exact products
        a3, b3 = c.inp(a).reshape(L, *a.shape[-2:]), c.inp(b).reshape(L, *b.shape[-2:])
        out3 = (c.inout(out) if acc else c.out(out)).reshape(L, M, N)
        G.gemm(a3, b3, out3, ta, tb, acc, nt)                       # the full product: no causal skipping here
        if causal == "out":
            NK.zero_future(out3, start)
        c.back()
        return out

    # ---- LayerNorm
    def layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):           # x (N, C) -> out (N, C)
        self._threads(x.size)
        c = self._contiguous("layernorm")
        NK.layernorm_fwd(c.inp(x), w, self._zeros(x.shape[-1], x.dtype) if b is None else b, eps, c.out(out),
                         mean, rstd)
        c.back()
        return out

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):     # dy, x (N, C) -> dx; dw, db (C,) +=
        self._threads(x.size)
        c = self._contiguous("layernorm_backward")
        dy, x = c.inp(dy), c.inp(x)
        NK.layernorm_bwd_params(dy, x, mean, rstd, dw, self._zeros(0, x.dtype) if db is None else db)
        NK.layernorm_bwd(dy, x, w, mean, rstd, c.out(dx))                # second: dx may be dy itself
        c.back()
        return dx

    # ---- GELU over rows of H: the kernels take (rows, H)
    def gelu(self, x, b, out, dgelu):                                    # x (..., H) -> out, dgelu (..., H)
        self._threads(x.size)
        H = x.shape[-1]
        b = self._zeros(H, x.dtype) if b is None else b
        c = self._contiguous("gelu")
        if out is x:                                                     # in place (the MLP's c_fc)
            NK.gelu_fwd_inplace(c.inout(out).reshape(-1, H), b, c.out(dgelu).reshape(-1, H))
        else:
            NK.gelu_fwd(c.inp(x).reshape(-1, H), b, c.out(out).reshape(-1, H), c.out(dgelu).reshape(-1, H))
        c.back()
        return out

    def gelu_backward(self, dout, dgelu, dx, db):                        # dx = dout * dgelu; db (H,) +=
        H = dout.shape[-1]
        c = self._contiguous("gelu_backward")
        NK.gelu_bwd(c.inp(dout).reshape(-1, H), c.inp(dgelu).reshape(-1, H), c.out(dx).reshape(-1, H),
                    self._zeros(0, dout.dtype) if db is None else db)
        c.back()
        return dx

    # ---- causal softmax, in place over (..., T, Tk): the kernels take (L, T, Tk)
    def causal_softmax(self, att, scale, start=0):
        self._threads(att.size)
        c = self._contiguous("causal_softmax")
        NK.causal_softmax_fwd(c.inout(att).reshape(-1, *att.shape[-2:]), scale, start)
        c.back()
        return att

    def causal_softmax_backward(self, att, datt, scale, start=0):
        self._threads(att.size)
        T, Tk = att.shape[-2:]
        c = self._contiguous("causal_softmax_backward")
        NK.causal_softmax_bwd(c.inp(att).reshape(-1, T, Tk), c.inout(datt).reshape(-1, T, Tk), scale, start)
        c.back()
        return datt

    # ---- cross-entropy
    def cross_entropy(self, logits, targets, lse):                       # logits (N, V) -> mean loss
        c = self._contiguous("cross_entropy")
        total = NK.xent_fwd(c.inp(logits), targets.astype(np.int64, copy=False), lse)
        return float(total) / max(1, targets.size)

    def cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        c = self._contiguous("cross_entropy_backward")
        NK.xent_bwd(c.inp(logits), targets.astype(np.int64, copy=False), lse, scale, c.out(dlogits))
        c.back()
        return dlogits

    # ---- embedding scatter-add and AdamW
    def embedding_backward(self, dW, idx, dout):                         # dW[idx[n]] += dout[n]
        c = self._contiguous("embedding_backward")
        NK.scatter_add(dW, idx.reshape(-1).astype(np.int64, copy=False), c.inp(dout))

    def adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        if not (p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("adamw updates p, m and v in place: they must be C-contiguous arrays, not views")
        c = self._contiguous("adamw")
        NK.adamw(p.reshape(-1), c.inp(g).reshape(-1), m.reshape(-1), v.reshape(-1), lr, b1, b2, eps, wd, bc1, bc2)

    def dropout(self, x, p, seed, out):                                   # out = x * (0 or 1 / (1 - p))
        check_dropout(x, seed, out)
        self._threads(x.size)
        c = self._contiguous("dropout")
        NK.dropout(c.inp(x).reshape(-1), c.out(out).reshape(-1), seed & 0xFFFFFFFF, seed >> 32, dropout_keep_from(p),
                   1.0 / (1.0 - p))
        c.back()
        return out


_backend = None


def backend():
    """The numba backend, after a compile-and-compare smoke test (BackendUnavailable if anything fails)."""
    global _backend
    if _backend is None:
        if numba is None:
            raise BackendUnavailable(f"numba: cannot import numba ({_IMPORT_ERROR}). Fix: pip install numba")
        be = NumbaOps()
        try:
            x = np.arange(15, dtype=np.float32).reshape(3, 5)
            got = be.matmul(x, x, tb=True)
        except Exception as e:             # noqa: BLE001  (a numba/LLVM failure on this machine)
            raise BackendUnavailable(f"numba: the kernel failed to compile or run here ({e!r})") from e
        if not np.allclose(got, x @ x.T):
            raise BackendUnavailable("numba: the kernel gave wrong results on this machine")
        _backend = be
    return _backend
