"""The backend interface: the fixed set of ops a training step needs, and the one place that chooses who runs them.

Every layer calls `ops.<op>(...)` (ops forwards to the selected backend) and never asks which backend it is:
  numpy  - numpy_ops.py: the executable specification in plain NumPy; dtype-generic (float64 gradient tests)
  numba  - numba_ops.py: a numba GEMM (numba_gemm.py) and fused numba kernels (numba_kernels.py), float32/64
  native - native.py: every op in the C library native/ (AVX-512, AVX2+FMA or portable C), through ctypes
The ops (Ops below) take and write caller-owned arrays (out=...), accept strided views, and allocate nothing of
activation size on the fast backends. An explicitly requested backend that cannot run raises BackendUnavailable;
only "auto" chooses, and it says what it chose. This module also owns every thread count (set_threads).
"""
import importlib
import os
import sys

import numpy as np

BACKENDS = ("numpy", "numba", "native")
# fastest first (reports/benchmarks.md): native's C, else numba's kernels, else the plain NumPy specification
AUTO_ORDER = ("native", "numba", "numpy")


class BackendUnavailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------
# the interface: argument checks shared by every backend, so a program that runs on one runs on all

def gemm_dims(a, b, ta, tb):
    """(M, N, K) of op(a) @ op(b) over the last two axes; ValueError if the inner dimensions differ."""
    M, Ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    Kb, N = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if Ka != Kb:
        raise ValueError(f"matmul: inner dimensions differ: op(a) is {M}x{Ka} (a {a.shape}, ta={ta}), "
                         f"op(b) is {Kb}x{N} (b {b.shape}, tb={tb})")
    return M, N, Ka


class Ops:
    """The ops of a training step. Subclasses implement the _underscored products and the other ops; the
    public matmul/bmm check their arguments here, once for all backends. Transposes are flags, never copies.

      matmul(a, b, ta, tb, out, acc)        op(a) @ op(b) for 2-D a, b; acc=True adds into out
      bmm(a, b, ta, tb, out, acc)           the same over leading batch dims, on any strided views
      layernorm(x, w, b, out, mean, rstd, eps)            x (N, C) -> out; keeps mean, rstd (N,)
      layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)    dx written; dw, db (C,) +=; b/db may be None
      gelu(x, b, out, dgelu)                out = gelu(x + b), dgelu = gelu'(x + b) (tanh form); b may be None,
                                            out may be x
      gelu_backward(dout, dgelu, dx, db)    dx = dout * dgelu (dx may be dout); db (H,) += its column sums
      causal_softmax(att, scale, start)     scores (..., T, Tk) -> probabilities, in place; query i sees keys
                                            0..start+i; masked entries become exactly 0
      causal_softmax_backward(att, datt, scale, start)      d(probabilities) -> d(scores), in place in datt
      cross_entropy(logits, targets, lse) -> mean loss     lse (N,) written: row log-sum-exp
      cross_entropy_backward(logits, targets, lse, scale, dlogits)   (softmax - onehot) * scale
      embedding_backward(dW, idx, dout)     dW[idx[n]] += dout[n], repeated ids summed (scatter-add)
      adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2)     one in-place AdamW update
    """
    name = "?"

    def matmul(self, a, b, ta=False, tb=False, out=None, acc=False):
        M, N, _ = _check_product(a, b, ta, tb, out, acc, batched=False)
        if out is None:
            out = np.empty((M, N), np.result_type(a, b))
        return self._matmul(a, b, bool(ta), bool(tb), out, acc)

    def bmm(self, a, b, ta=False, tb=False, out=None, acc=False):
        M, N, _ = _check_product(a, b, ta, tb, out, acc, batched=True)
        if out is None:
            out = np.empty((*a.shape[:-2], M, N), np.result_type(a, b))
        return self._bmm(a, b, bool(ta), bool(tb), out, acc)

    def set_threads(self, n):
        pass

    def _contig(self, x, slot, copy=True):
        """x itself if C-contiguous, else a scratch array kept per (slot, shape, dtype), holding x's values if copy:
        how a backend whose kernels walk contiguous arrays takes views without allocating per call."""
        if x.flags.c_contiguous:
            return x
        scratch = self.__dict__.setdefault("_scratch", {})
        key = (slot, x.shape, x.dtype)
        if key not in scratch:
            scratch[key] = np.empty(x.shape, x.dtype)
        if copy:
            np.copyto(scratch[key], x)
        return scratch[key]

    def spin(self, us=None):
        """Let worker threads wait up to us microseconds on the CPU between back-to-back calls before they sleep
        (native only; None: the backend's default)."""


def _check_product(a, b, ta, tb, out, acc, batched):
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        raise TypeError(f"matmul: a and b must be numpy arrays, got {type(a).__name__}, {type(b).__name__}")
    if batched:
        if a.ndim < 3 or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"bmm: a and b need the same leading (batch) dims and ndim >= 3, got {a.shape}, {b.shape}")
    elif a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: a and b must be 2-D (use bmm for batches), got {a.shape}, {b.shape}")
    M, N, K = gemm_dims(a, b, ta, tb)
    if acc and out is None:
        raise ValueError("acc=True needs an out= array to add into")
    if out is not None:
        if out.shape != (*a.shape[:-2], M, N):
            raise ValueError(f"matmul: out has shape {out.shape}, expected {(*a.shape[:-2], M, N)}")
        if not out.flags.writeable:
            raise ValueError("matmul: out= is read-only (a broadcast view?); pass a writable array")
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            raise ValueError("matmul: out= must not overlap the inputs")
    return M, N, K


def check_float32(*arrays, backend):
    """The fast backends compute in float32 (numba's kernels also in float64); no silent casts."""
    for x in arrays:
        if x is not None and x.dtype != np.float32:
            raise TypeError(f"{backend} backend: float32 arrays only, got {x.dtype}. Cast with .astype(np.float32), "
                            "or select the numpy backend (dtype-generic, e.g. float64 gradient tests)")


# ----------------------------------------------------------------------------
# selection: the one place that chooses a backend and sets thread counts

_current = None
_threads = 0              # 0: every CPU this process may run on
_blas_cap = None          # threadpoolctl limiter, active while numba/native threads own the cores


def _load(name):
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")
    module = {"numpy": "numpy_ops", "numba": "numba_ops", "native": "native"}[name]
    try:
        mod = importlib.import_module(f".{module}", __package__)
    except ImportError as e:
        raise BackendUnavailable(f"{name}: cannot import minigpt.backends.{module} ({e})") from e
    return mod.backend()                 # raises BackendUnavailable with the reason and the fix


def select(name="auto", threads=None, verbose=None):
    """Select the backend by name; returns the name that runs. 'auto' takes the first of AUTO_ORDER that loads
    and says which on stderr (verbose=False silences it). threads: see set_threads (None keeps the current)."""
    global _current
    name = (name or "auto").lower()
    if name == "auto":
        reasons = []
        for cand in AUTO_ORDER:
            try:
                impl = _load(cand)
                break
            except BackendUnavailable as e:
                reasons.append(str(e))
        if verbose is not False:
            skipped = f" (skipped: {'; '.join(reasons)})" if reasons else ""
            print(f"minigpt: backend auto -> {impl.name}{skipped}", file=sys.stderr)
    else:
        impl = _load(name)
        if verbose:
            print(f"minigpt: backend {impl.name}", file=sys.stderr)
    _current = impl
    _cap_blas(impl.name != "numpy")
    set_threads(_threads if threads is None else threads)
    return impl.name


def set_threads(n=0):
    """Threads of every pool of the current backend (0: all CPUs). BLAS takes them on numpy and gets 1 otherwise."""
    global _threads
    _threads = int(n or 0)
    current().set_threads(threads())


def threads():
    """Threads the current backend runs on."""
    return _threads or cpus()


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:               # not on Linux
        return os.cpu_count() or 1


def _cap_blas(on):
    """One thread pool busy at a time: BLAS gets 1 thread while numba/native threads run."""
    global _blas_cap
    if on and _blas_cap is None:
        from threadpoolctl import threadpool_limits
        _blas_cap = threadpool_limits(1, user_api="blas")
    elif not on and _blas_cap is not None:
        _blas_cap.restore_original_limits()
        _blas_cap = None


def current():
    """The selected backend's Ops (on first use: $MINIGPT_BACKEND, else auto)."""
    if _current is None:
        from ..config import default_backend
        select(default_backend())
    return _current


def name():
    return current().name


def why_unavailable(name):
    """The reason backend `name` cannot run here, or None if it loads."""
    try:
        _load(name)
        return None
    except BackendUnavailable as e:
        return str(e)


def available():
    """Names of the backends that load on this machine."""
    return [n for n in BACKENDS if why_unavailable(n) is None]


class _Forward:
    """`ops.matmul(...)` runs the current backend's matmul: the layers' one handle on the backends."""

    def __getattr__(self, attr):
        return getattr(current(), attr)


ops = _Forward()
