"""Backend switch for the model's matrix products.

Every matmul of the model goes through `matmul` (2-D) or `bmm` (batched 3-D). The backend is one of
  numpy  - np.matmul (OpenBLAS); dtype-generic, the only backend that runs float64 (gradient tests)
  numba  - blocked, parallel float32 GEMM in minigpt/_numba.py (numba imported lazily, only here)
  native - AVX-512 float32 SGEMM in native/mgk.c, loaded with ctypes by minigpt/_native.py
chosen with MINIGPT_BACKEND=auto|numpy|numba|native or set_backend(). An explicitly requested backend
that cannot run here raises BackendUnavailable; only "auto" chooses, and it says what it chose.
Transposes are flags (ta: use a^T, tb: use b^T), never copies.
"""
import importlib
import os
import sys

import numpy as np

BACKENDS = ("numpy", "numba", "native")
# fastest first on this project's shapes (reports/kernels.md): native ~1.0-1.3x OpenBLAS, numba ~0.5-0.7x,
# so auto only reaches numba if numpy itself cannot run
AUTO_ORDER = ("native", "numpy", "numba")


class BackendUnavailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------
# argument checks shared by all backends

def gemm_dims(a, b, ta, tb):
    """(M, N, K) of op(a) @ op(b) over the last two axes; ValueError if the inner dimensions differ."""
    M, Ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    Kb, N = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if Ka != Kb:
        raise ValueError(f"matmul: inner dimensions differ: op(a) is {M}x{Ka} (a {a.shape}, ta={ta}), "
                         f"op(b) is {Kb}x{N} (b {b.shape}, tb={tb})")
    return M, N, Ka


def _check_shapes(a, b, ta, tb, out, acc, batched):
    """Same rules on every backend, so a program that runs on numpy runs unchanged on numba/native."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        raise TypeError(f"matmul: a and b must be numpy arrays, got {type(a).__name__}, {type(b).__name__}")
    if batched:
        if a.ndim < 3 or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"bmm: a and b need the same leading (batch) dims and ndim >= 3, got {a.shape}, {b.shape}")
    elif a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: a and b must be 2-D (use bmm for batches), got {a.shape}, {b.shape}")
    M, N, _ = gemm_dims(a, b, ta, tb)
    if acc and out is None:
        raise ValueError("acc=True needs an out= array to add into")
    if out is not None and out.shape != (*a.shape[:-2], M, N):
        raise ValueError(f"matmul: out has shape {out.shape}, expected {(*a.shape[:-2], M, N)}")


def check_f32(*arrays, backend=None, contiguous=True):
    """The fast backends run float32 arrays only, C-contiguous unless the caller walks strides itself (native
    bmm); no silent casts or copies."""
    name = backend or (_impl.name if _impl is not None else "this backend")
    for x in arrays:
        if x is None:
            continue
        if x.dtype != np.float32:
            raise TypeError(f"{name} backend: float32 arrays only, got {x.dtype}. Cast with .astype(np.float32), "
                            "or use MINIGPT_BACKEND=numpy (dtype-generic, e.g. float64 gradient tests)")
        if contiguous and not x.flags.c_contiguous:
            raise ValueError(f"{name} backend: array of shape {x.shape} is not C-contiguous. Pass transposes "
                             "with the ta/tb flags, or make a copy with np.ascontiguousarray")


# ----------------------------------------------------------------------------
# numpy reference backend

def _t(x, flag):
    return x.swapaxes(-1, -2) if flag else x


class _NumpyBackend:
    name = "numpy"

    def __init__(self):
        self._scratch = {}               # acc=True: np.matmul cannot add into out, so it writes here first

    def matmul(self, a, b, ta, tb, out, acc):
        if not acc:
            return np.matmul(_t(a, ta), _t(b, tb), out=out)
        key = (out.shape, out.dtype)
        r = self._scratch.get(key)
        if r is None:
            r = self._scratch[key] = np.empty_like(out)   # once per shape: no allocation per step
        out += np.matmul(_t(a, ta), _t(b, tb), out=r)
        return out

    bmm = matmul
    strided_bmm = True                   # np.matmul takes any strided views

    def set_threads(self, n):
        from threadpoolctl import threadpool_limits
        threadpool_limits(n, user_api="blas")   # OpenBLAS's own pool (the cap of _cap_blas when it is off)

    def set_spin(self, us):
        pass


# ----------------------------------------------------------------------------
# selection

_impl = None
_threads = None
_blas_cap = None          # threadpoolctl limiter, active while numba/native own the cores


def _load(name):
    if name == "numpy":
        return _NumpyBackend()
    if name in ("numba", "native"):
        try:
            mod = importlib.import_module(f"._{name}", __package__)
        except ImportError as e:
            raise BackendUnavailable(f"{name}: cannot import minigpt._{name} ({e})") from e
        return mod.backend()             # raises BackendUnavailable with the reason and the fix
    raise BackendUnavailable(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")


def _cap_blas(on):
    """One thread pool busy at a time: BLAS gets 1 thread while numba/native threads run."""
    global _blas_cap
    if on and _blas_cap is None:
        from threadpoolctl import threadpool_limits
        _blas_cap = threadpool_limits(1, user_api="blas")
    elif not on and _blas_cap is not None:
        _blas_cap.restore_original_limits()
        _blas_cap = None


def set_backend(name="auto", threads=None, verbose=None):
    """Select the matmul backend. 'auto' picks the first of AUTO_ORDER that loads here and says which on
    stderr (verbose=False silences it). An explicit name that cannot run raises BackendUnavailable."""
    global _impl, _threads
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
    _impl = impl
    _cap_blas(impl.name != "numpy")
    set_threads(threads if threads is not None else _threads)
    return impl.name


def set_threads(n=None):
    """Threads for the active backend (default: the CPUs this process may run on)."""
    global _threads
    _threads = n
    _current().set_threads(n or _cpus())


def set_spin(us=0):
    """Between products, let the backend's worker threads wait on the CPU up to `us` microseconds before they
    sleep (native only; 0, the default, sleeps at once). Worth it only while nothing else needs the cores between
    back-to-back products, as in token-by-token generation (minigpt/sample.py); training keeps 0."""
    _current().set_spin(us)


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:               # not on Linux
        return os.cpu_count() or 1


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
    _check_shapes(a, b, ta, tb, out, acc, batched=False)
    return _current().matmul(a, b, bool(ta), bool(tb), out, acc)


def bmm(a, b, ta=False, tb=False, out=None, acc=False):
    """Batched op(a) @ op(b) for a (..., M, K) and b (..., K, N) after the flags, same leading dims (L, or B, nh).
    On backends with bmm_takes_views(), a, b and out may be strided views (e.g. heads inside a qkv array)."""
    _check_shapes(a, b, ta, tb, out, acc, batched=True)
    return _current().bmm(a, b, bool(ta), bool(tb), out, acc)


def bmm_takes_views():
    """True if bmm reads and writes strided views (numpy, native) rather than C-contiguous arrays only (numba)."""
    return getattr(_current(), "strided_bmm", False)


# ----------------------------------------------------------------------------
# benchmark helpers (scripts/bench_kernels.py): the products of one training step, and a timer

def step_shapes(batch, block, n_embd, n_head, vocab, n_layer):
    """[(name, L, M, N, K, ta, tb, count)]: every product of one forward+backward, count = uses per step."""
    R, C, Cx, hs, nl = batch * block, n_embd, 4 * n_embd, n_embd // n_head, n_layer
    out = []
    for name, n_in, n_out in (("c_attn", C, 3 * C), ("attn.c_proj", C, C), ("c_fc", C, Cx), ("mlp.c_proj", Cx, C)):
        out += [(f"{name} fwd x@W", 1, R, n_out, n_in, False, False, nl),
                (f"{name} dX dy@W^T", 1, R, n_in, n_out, False, True, nl),
                (f"{name} dW x^T@dy", 1, n_in, n_out, R, True, False, nl)]
    L, T = batch * n_head, block
    out += [("attn q@k^T", L, T, T, hs, False, True, nl), ("attn att@v", L, T, hs, T, False, False, nl),
            ("attn d(att) dy@v^T", L, T, T, hs, False, True, nl), ("attn dv att^T@dy", L, T, hs, T, True, False, nl),
            ("attn dq ds@k", L, T, hs, T, False, False, nl), ("attn dk ds^T@q", L, T, hs, T, True, False, nl)]
    return out + [("lm_head fwd x@wte^T", 1, R, vocab, C, False, True, 1), ("lm_head dX dl@wte", 1, R, C, vocab, False, False, 1),
                  ("lm_head dW dl^T@x", 1, vocab, C, R, True, False, 1)]


def time_product(L, M, N, K, ta, tb, min_time=0.2, warmup=2, min_calls=5, rng=None):
    """Seconds of each timed call of op(a) @ op(b) on the current backend (after warm-up), into a preallocated out."""
    import time
    rng = rng or np.random.default_rng(0)
    lead = (L,) if L > 1 else ()
    a = rng.standard_normal((*lead, K, M) if ta else (*lead, M, K), dtype=np.float32)
    b = rng.standard_normal((*lead, N, K) if tb else (*lead, K, N), dtype=np.float32)
    out = np.empty((*lead, M, N), np.float32)
    f = bmm if lead else matmul
    for _ in range(warmup):
        f(a, b, ta, tb, out)
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_calls or (time.perf_counter() < t_end and len(times) < 200):
        t0 = time.perf_counter()
        f(a, b, ta, tb, out)
        times.append(time.perf_counter() - t0)
    return np.array(times)
