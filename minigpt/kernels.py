"""Backend switch for the model's matrix products.

Every matmul of the model goes through `matmul` (2-D) or `bmm` (batched 3-D). The backend is one of
  numpy  - np.matmul (OpenBLAS); dtype-generic, the only backend that runs float64 (gradient tests)
  numba  - blocked, parallel float32 GEMM in minigpt/_numba.py (numba imported lazily, only here)
  native - AVX-512 float32 SGEMM in native/mgk.c, loaded with ctypes by minigpt/_native.py
chosen with MINIGPT_BACKEND=auto|numpy|numba|native or set_backend(). An explicitly requested backend
that cannot run here raises BackendUnavailable; only "auto" chooses, and it says what it chose.
Transposes are flags (ta: use a^T, tb: use b^T), never copies.
"""
import os
import sys

import numpy as np

BACKENDS = ("numpy", "numba", "native")
AUTO_ORDER = ("native", "numba", "numpy")   # fastest first on this project's shapes (reports/kernels.md)


class BackendUnavailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------
# numpy reference backend

def _t(x, flag):
    return x.swapaxes(-1, -2) if flag else x


class _NumpyBackend:
    name = "numpy"

    def matmul(self, a, b, ta, tb, out, acc):
        r = np.matmul(_t(a, ta), _t(b, tb), out=None if acc else out)
        if acc:
            out += r
            return out
        return r

    bmm = matmul

    def set_threads(self, n):
        pass


# ----------------------------------------------------------------------------
# selection

_impl = None
_threads = None


def _load(name):
    if name == "numpy":
        return _NumpyBackend()
    if name == "numba":
        from . import _numba
        return _numba.backend()          # raises BackendUnavailable with the reason
    if name == "native":
        from . import _native
        return _native.backend()
    raise BackendUnavailable(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")


def set_backend(name="auto", threads=None, verbose=False):
    """Select the matmul backend. 'auto' picks the first of AUTO_ORDER that loads here."""
    global _impl, _threads
    name = (name or "auto").lower()
    if name == "auto":
        reasons = []
        for cand in AUTO_ORDER:
            try:
                impl = _load(cand)
                break
            except BackendUnavailable as e:
                reasons.append(f"{cand}: {e}")
        if verbose:
            skipped = f" (skipped {'; '.join(reasons)})" if reasons else ""
            print(f"minigpt: backend auto -> {impl.name}{skipped}", file=sys.stderr)
    else:
        impl = _load(name)
    _impl = impl
    set_threads(threads if threads is not None else _threads)
    return impl.name


def set_threads(n=None):
    """Threads for the active backend; BLAS is capped to 1 thread when numba/native threads run."""
    global _threads
    _threads = n
    _current().set_threads(n or os.cpu_count() or 1)


def backend():
    return _current().name


def _current():
    if _impl is None:
        set_backend(os.environ.get("MINIGPT_BACKEND", "auto"))
    return _impl


def available():
    """Names of the backends that load on this machine."""
    ok = []
    for name in BACKENDS:
        try:
            _load(name)
            ok.append(name)
        except BackendUnavailable:
            pass
    return ok


# ----------------------------------------------------------------------------
# the two entry points the model uses

def matmul(a, b, ta=False, tb=False, out=None, acc=False):
    """op(a) @ op(b) for 2-D a (M,K) and b (K,N) after the flags; out= writes into a buffer, acc=True adds into it."""
    if acc and out is None:
        raise ValueError("acc=True needs an out= array to add into")
    return _current().matmul(a, b, ta, tb, out, acc)


def bmm(a, b, ta=False, tb=False, out=None, acc=False):
    """Batched op(a) @ op(b) for 3-D a (L,M,K) and b (L,K,N) after the flags."""
    if acc and out is None:
        raise ValueError("acc=True needs an out= array to add into")
    return _current().bmm(a, b, ta, tb, out, acc)
