"""The numba backend: the interface's ops on numba kernels (products: numba_gemm.py; the rest: numba_kernels.py).

The kernels walk C-contiguous arrays. A strided view (a head of the qkv array, say) is copied into a scratch
array kept per shape, and an output view gets its result copied back, so this backend takes views like every
other one and still allocates nothing per step. The GEMM is float32; the other kernels also run float64.
"""
import math

import numpy as np

from . import BackendUnavailable, Ops, check_float32, gemm_dims

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

    def __init__(self):
        self.nt = 1
        self._none = {}

    # ---- plumbing: thread counts (views: Ops._contig)
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
    def _matmul(self, a, b, ta, tb, out, acc):
        self._bmm(a[None], b[None], ta, tb, out[None], acc)
        return out                                                 # out itself, not a view of it

    def _bmm(self, a, b, ta, tb, out, acc):
        check_float32(a, b, out, backend=self.name)
        M, N, K = gemm_dims(a, b, ta, tb)
        L = math.prod(a.shape[:-2])                                 # not -1: an empty stack has no size to infer it
        a3 = self._contig(a, "a").reshape(L, *a.shape[-2:])
        b3 = self._contig(b, "b").reshape(L, *b.shape[-2:])
        o = self._contig(out, "out", copy=acc)
        nt = self.nt if out.size * K >= SERIAL_BELOW * 16 else 1       # tiny products (decoding): one thread
        G.gemm(a3, b3, o.reshape(L, M, N), ta, tb, acc, nt)
        if o is not out:
            np.copyto(out, o)
        return out

    # ---- LayerNorm
    def layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):
        self._threads(x.size)
        b = self._zeros(x.shape[-1], x.dtype) if b is None else b
        o = self._contig(out, "y", copy=False)
        NK.layernorm_fwd(self._contig(x, "x"), w, b, eps, o, mean, rstd)
        if o is not out:
            np.copyto(out, o)
        return out

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        self._threads(x.size)
        dy, x = self._contig(dy, "dy"), self._contig(x, "x")
        o = self._contig(dx, "dx", copy=False)
        NK.layernorm_bwd(dy, x, w, mean, rstd, o)
        NK.layernorm_bwd_params(dy, x, mean, rstd, dw, self._zeros(0, x.dtype) if db is None else db)
        if o is not dx:
            np.copyto(dx, o)
        return dx

    # ---- GELU
    def gelu(self, x, b, out, dgelu):
        self._threads(x.size)
        H = x.shape[-1]
        b = self._zeros(H, x.dtype) if b is None else b
        o, d = self._contig(out, "y", copy=False), self._contig(dgelu, "d", copy=False)
        NK.gelu_fwd(self._contig(x, "x").reshape(-1, H), b, o.reshape(-1, H), d.reshape(-1, H))
        for src, dst in ((o, out), (d, dgelu)):
            if src is not dst:
                np.copyto(dst, src)
        return out

    def gelu_backward(self, dout, dgelu, dx, db):
        H = dout.shape[-1]
        dout, dgelu = self._contig(dout, "dy"), self._contig(dgelu, "d")
        o = self._contig(dx, "dx", copy=False)
        NK.gelu_bwd(dout.reshape(-1, H), dgelu.reshape(-1, H), o.reshape(-1, H),
                    self._zeros(0, dout.dtype) if db is None else db)
        if o is not dx:
            np.copyto(dx, o)
        return dx

    # ---- causal softmax, in place over (..., T, Tk)
    def causal_softmax(self, att, scale, start=0):
        self._threads(att.size)
        a = self._contig(att, "att")
        NK.causal_softmax_fwd(a.reshape(-1, *att.shape[-2:]), scale, start)
        if a is not att:
            np.copyto(att, a)
        return att

    def causal_softmax_backward(self, att, datt, scale, start=0):
        self._threads(att.size)
        d = self._contig(datt, "datt")
        T, Tk = att.shape[-2:]
        NK.causal_softmax_bwd(self._contig(att, "att").reshape(-1, T, Tk), d.reshape(-1, T, Tk), scale, start)
        if d is not datt:
            np.copyto(datt, d)
        return datt

    # ---- cross-entropy
    def cross_entropy(self, logits, targets, lse):
        total = NK.xent_fwd(self._contig(logits, "logits"), targets.astype(np.int64, copy=False), lse)
        return float(total) / max(1, targets.size)

    def cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        o = self._contig(dlogits, "dlogits", copy=False)
        NK.xent_bwd(self._contig(logits, "logits"), targets.astype(np.int64, copy=False), lse, scale, o)
        if o is not dlogits:
            np.copyto(dlogits, o)
        return dlogits

    # ---- embedding scatter-add and AdamW
    def embedding_backward(self, dW, idx, dout):
        NK.scatter_add(dW, idx.reshape(-1).astype(np.int64, copy=False), self._contig(dout, "dout"))

    def adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        if not (p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("adamw updates p, m and v in place: they must be C-contiguous arrays, not views")
        NK.adamw(p.reshape(-1), self._contig(g, "g").reshape(-1), m.reshape(-1), v.reshape(-1),
                 lr, b1, b2, eps, wd, bc1, bc2)


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
