"""The numba backend: the interface's ops on numba kernels (numba_kernels.py), and products on numpy's BLAS.

The kernels walk C-contiguous activations. A strided view of one (a head of the qkv array, say) goes through
Ops._contiguous: copied into a scratch array kept per shape, and an output's result copied back, so this backend
takes views like every other one and still allocates nothing of activation size per step (only (B*T,) int64
copies of the token ids and targets, and a row's worth of scratch in the LayerNorm and softmax backwards). The
small arrays (a LayerNorm's w, b, mean, rstd; the bias sums) go to the kernels as they are: numba compiles a
strided version for a view of one. Ops has checked every shape, id and offset before these run. The products
are the specification's (np.matmul: numpy_ops.product). A model runs float32 here (dtypes), as on native; the
kernels also compile for float64, which tests/test_ops.py holds to the float64 specification. The products run
on BLAS, not on a numba GEMM, which is much slower than BLAS (reports/benchmarks.md: the numba backend's products
on BLAS).
"""
import math

import numpy as np

from . import BackendUnavailable
from .interface import Ops, check_float32, dropout_keep_from
from .numpy_ops import product

try:
    from . import numba_kernels as NK              # first: it sets numba's environment before importing numba
    import numba
except ImportError as e:                           # reported by backend(), so "auto" can skip numba
    numba, _IMPORT_ERROR = None, e

SERIAL_BELOW = 16384     # elements of work: below this a kernel runs on one thread (waking numba's other threads
                         # costs more than the one-row LayerNorms and GELUs of decoding take)


class NumbaOps(Ops):
    name = "numba"
    dtypes = frozenset({np.dtype(np.float32)})       # a choice, as on native: a float64 model (the gradient checks)
                                                     # runs on the specification, and auto sends it there

    def __init__(self):
        super().__init__()
        self.pool = {"threads": 1}       # numba's pool size, in a dict that with_bf16's copies share
        self._none = {}

    # ---- plumbing: thread counts, the absent bias (views: Ops._contiguous)
    def _threads(self, work):
        n = 1 if work < SERIAL_BELOW else self.pool["threads"]
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)

    def _zeros(self, n, dtype):          # zero bias of length n; n = 0 tells a backward kernel there is no bias
        key = (n, np.dtype(dtype))
        if key not in self._none:
            self._none[key] = np.zeros(n, dtype)
        return self._none[key]

    def set_threads(self, n):
        from threadpoolctl import threadpool_limits
        self.pool["threads"] = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))   # no more than it started with
        numba.set_num_threads(self.pool["threads"])
        threadpool_limits(max(1, int(n)), user_api="blas")         # the products' pool (backends._cap_blas: one
                                                                   # pool at a time)

    # ---- products: the specification's own (numpy_ops.product: np.matmul, on BLAS's threads, which set_threads
    # sets to this backend's count); numba's threads sleep meanwhile (OMP_WAIT_POLICY, numba_kernels.py)
    def _matmul(self, a, b, ta, tb, out, acc, bf16):
        check_float32(a, b, out, backend=self.name)
        return product(self, a, b, ta, tb, out, acc, bf16)

    own_causal = True            # causal "out": the future zeroed by a kernel (numpy's np.copyto with a mask is
                                 # slow enough to show in the causal q k^T)

    def _bmm(self, a, b, ta, tb, out, acc, bf16, causal=None, start=0):   # a (..., M, K), b (..., K, N) -> (..., M, N)
        check_float32(a, b, out, backend=self.name)
        product(self, a, b, ta, tb, out, acc, bf16)                 # the full product (causal "a" is just that)
        if causal == "out":
            L = math.prod(out.shape[:-2])                           # not -1: an empty stack has no size to infer it
            self._threads(out.size)
            c = self._contiguous("bmm")
            NK.zero_future(c.inout(out).reshape(L, *out.shape[-2:]), start)
            c.back()
        return out

    # ---- LayerNorm
    def _layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):           # x (N, C) -> out (N, C)
        self._threads(x.size)
        c = self._contiguous("layernorm")
        NK.layernorm_fwd(c.inp(x), w, self._zeros(x.shape[-1], x.dtype) if b is None else b, eps, c.out(out),
                         mean, rstd)
        c.back()
        return out

    def _layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db, acc=False):  # dy, x (N, C) -> dx (+=)
        self._threads(x.size)
        c = self._contiguous("layernorm_backward")
        dy, x = c.inp(dy), c.inp(x)
        NK.layernorm_bwd_params(dy, x, mean, rstd, dw, self._zeros(0, x.dtype) if db is None else db)
        NK.layernorm_bwd(dy, x, w, mean, rstd, c.inout(dx) if acc else c.out(dx), acc)   # second: dx may be dy
        c.back()
        return dx

    # ---- GELU over rows of H: the kernels take (rows, H)
    def _gelu(self, x, b, out, dgelu):                                    # x (..., H) -> out, dgelu (..., H)
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

    def _matmul_mul(self, a, b, scale, out, tb):                          # the product, then the multiply on
        self.matmul(a, b, tb=tb, out=out)                                 # numba's threads (gelu_backward's
        return self._gelu_backward(out, scale, out, None)                 # kernel: the composition's bits)

    def _gelu_backward(self, dout, dgelu, dx, db):                        # dx = dout * dgelu; db (H,) +=
        H = dout.shape[-1]
        c = self._contiguous("gelu_backward")
        NK.gelu_bwd(c.inp(dout).reshape(-1, H), c.inp(dgelu).reshape(-1, H), c.out(dx).reshape(-1, H),
                    self._zeros(0, dout.dtype) if db is None else db)
        c.back()
        return dx

    # ---- causal softmax, in place over (..., T, Tk): the kernels take (L, T, Tk)
    def _causal_softmax(self, att, scale, start=0):
        self._threads(att.size)
        c = self._contiguous("causal_softmax")
        NK.causal_softmax_fwd(c.inout(att).reshape(-1, *att.shape[-2:]), scale, start)
        c.back()
        return att

    def _causal_softmax_backward(self, att, datt, scale, start=0):
        self._threads(att.size)
        T, Tk = att.shape[-2:]
        c = self._contiguous("causal_softmax_backward")
        NK.causal_softmax_bwd(c.inp(att).reshape(-1, T, Tk), c.inout(datt).reshape(-1, T, Tk), scale, start)
        c.back()
        return datt

    # ---- cross-entropy
    def _cross_entropy(self, logits, targets, lse):                       # logits (N, V) -> mean loss
        c = self._contiguous("cross_entropy")
        total = NK.xent_fwd(c.inp(logits), targets.astype(np.int64, copy=False), lse)
        return float(total) / max(1, targets.size)

    def _cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        c = self._contiguous("cross_entropy_backward")
        NK.xent_bwd(c.inp(logits), targets.astype(np.int64, copy=False), lse, scale, c.out(dlogits))
        c.back()
        return dlogits

    # ---- embedding scatter-add and AdamW
    def _embedding_backward(self, dW, idx, dout):                         # dW[idx[n]] += dout[n]
        c = self._contiguous("embedding_backward")
        NK.scatter_add(dW, idx.reshape(-1).astype(np.int64, copy=False), c.inp(dout))

    def _adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        c = self._contiguous("adamw")
        NK.adamw(p.reshape(-1), c.inp(g).reshape(-1), m.reshape(-1), v.reshape(-1), lr, b1, b2, eps, wd, bc1, bc2)

    def _dropout(self, x, p, seed, out):                                   # out = x * (0 or 1 / (1 - p))
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
        x = np.arange(15, dtype=np.float32).reshape(3, 5) ** 2
        got, mean, rstd = np.empty_like(x), np.empty(3, np.float32), np.empty(3, np.float32)
        s = x[:, :3] / 10                                         # (3, 3) scores: query i sees keys 0..i
        att = s[None].copy()
        try:                               # two kernels: LayerNorm, and the softmax (exp32's own LLVM code)
            be.layernorm(x, np.ones(5, np.float32), None, got, mean, rstd)
            be.causal_softmax(att, 1.0)
        except Exception as e:             # noqa: BLE001  (a numba/LLVM failure on this machine)
            raise BackendUnavailable(f"numba: a kernel failed to compile or run here ({e!r})") from e
        want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
        p = np.tril(np.exp(s - s.max(1, keepdims=True)))          # the causal softmax, unnormalised
        if not (np.allclose(got, want, atol=1e-5) and np.allclose(att[0], p / p.sum(1, keepdims=True), atol=1e-6)):
            raise BackendUnavailable("numba: a kernel gave wrong results on this machine")
        _backend = be
    return _backend
