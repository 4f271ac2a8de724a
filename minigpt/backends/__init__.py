"""The backends: the one place that chooses who runs the ops a training step needs (declared in interface.py).

Every layer calls `ops.<op>(...)` (ops forwards to the selected backend) and never asks which backend it is:
  numpy  - numpy_ops.py: the executable specification in plain NumPy; float32 and float64 (gradient tests)
  numba  - numba_ops.py: fused numba kernels (numba_kernels.py), and the specification's products (BLAS); float32
  native - native.py: every op in the C library native/ (AMX, AVX512_BF16, AVX-512, AVX2+FMA or portable C, chosen
           at run time), through ctypes; float32
interface.py declares every op with its shapes (Ops) and checks their arguments for all three. This file chooses:
an explicitly requested backend that cannot run (or cannot run the model's dtype) raises BackendUnavailable;
only "auto" chooses, and it says what it chose. It also owns every thread count (set_threads).
"""
import importlib
import os
import sys

import numpy as np

from .interface import Ops, bf16_products  # noqa: F401  (the interface, as backends.Ops and backends.bf16_products)

BACKENDS = ("numpy", "numba", "native")
# fastest first (reports/benchmarks.md): native's C, else numba's kernels, else the plain NumPy specification
AUTO_ORDER = ("native", "numba", "numpy")


class BackendUnavailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------
# selection: the one place that chooses a backend and sets thread counts

_current = None
_auto = False             # _current was chosen by "auto": ensure() may choose again for another dtype
_auto_for = None          # ... for this dtype (None: for any, or chosen by name)
_threads = 0              # 0: every CPU this process may run on
_blas_cap = None          # threadpoolctl limiter, active while native threads own the cores
_MODULES = {"numpy": ("numpy_ops", "NumpyOps"), "numba": ("numba_ops", "NumbaOps"), "native": ("native", "NativeOps")}


def _import(name):
    module = _MODULES[name][0]
    try:
        return importlib.import_module(f".{module}", __package__)
    except ImportError as e:
        raise BackendUnavailable(f"{name}: cannot import minigpt.backends.{module} ({e})") from e


def _load(name):
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")
    return _import(name).backend()       # raises BackendUnavailable with the reason and the fix


def _dtypes(name):
    """The dtypes backend `name` runs, from its class (no kernel loads); None if its module cannot import."""
    try:
        return getattr(_import(name), _MODULES[name][1]).dtypes
    except BackendUnavailable:
        return None


def _cannot_run(name, dtype):
    """None if backend `name` runs dtype (or cannot tell), else why not, in a few words."""
    dtypes = _dtypes(name)
    if dtypes is None or dtype in dtypes:
        return None
    return f"{name} runs {_names(dtypes)} only, not {dtype}"


def _names(dtypes):
    return " and ".join(sorted(map(str, dtypes))) or "no dtype"


def _dtype_fix(name, dtype):
    others = [n for n in BACKENDS if n != name and _cannot_run(n, dtype) is None]
    return "Fix: " + "".join(f"select {n} (--backend {n} or MINIGPT_BACKEND={n}), or " for n in others) + \
        "cast the model to float32"


def select(name="auto", threads=None, verbose=None, dtype=None):
    """Select the backend by name; returns the name that runs. 'auto' takes the first of AUTO_ORDER that loads
    and runs dtype (None: any) and says which on stderr (verbose=False silences it); an explicit backend that
    cannot run dtype raises BackendUnavailable. threads: see set_threads (None keeps the current)."""
    global _current, _auto, _auto_for
    name = (name or "auto").lower()
    dtype = None if dtype is None else np.dtype(dtype)
    if name == "auto":
        impl, reasons = None, []
        for cand in AUTO_ORDER:
            why = None if dtype is None else _cannot_run(cand, dtype)
            try:
                if why is None:
                    impl = _load(cand)
                    break
            except BackendUnavailable as e:
                why = str(e)
            reasons.append(why)
        if impl is None:
            raise BackendUnavailable(f"auto: no backend runs {dtype} here ({'; '.join(reasons)}). "
                                     "Fix: cast the model to float32")
        if verbose is not False:
            for_dtype = "" if dtype is None else f" for {dtype}"
            skipped = f" (skipped: {'; '.join(reasons)})" if reasons else ""
            print(f"minigpt: backend auto -> {impl.name}{for_dtype}{skipped}", file=sys.stderr)
    else:
        why = None if dtype is None or name not in BACKENDS else _cannot_run(name, dtype)
        if why:
            raise BackendUnavailable(f"{why}. {_dtype_fix(name, dtype)}")
        impl = _load(name)
        if verbose:
            print(f"minigpt: backend {impl.name}", file=sys.stderr)
    _current, _auto, _auto_for = impl, name == "auto", dtype if name == "auto" else None
    _cap_blas(impl.name == "native")
    set_threads(_threads if threads is None else threads)
    if threads and threads > cpus() and verbose is not False:
        print(f"minigpt: note: {threads} threads on {cpus()} CPUs take turns, slower than {cpus()} threads "
              "(--threads 0 uses every CPU)", file=sys.stderr)
    return impl.name


def select_backend(cfg, verbose=None, threads=None):
    """select() as every command calls it: cfg.backend with threads (default: cfg.threads, 0 for every CPU); a
    UserError if it cannot run here, worded "--backend NAME: why" (the reason names the backend once)."""
    from ..errors import UserError
    try:
        select(cfg.backend, threads=threads or cfg.threads or None, verbose=verbose)
    except BackendUnavailable as e:
        why = str(e).removeprefix(f"{cfg.backend}: ")
        raise UserError(f"--backend {cfg.backend}: {why}") from None


def ensure(dtype):
    """The model calls this at the start of each forward with its dtype. Nothing happens when the current
    backend runs dtype and was not chosen by "auto" for another dtype (_keeps). Else a backend "auto" chose (or
    the lazy default) is chosen again for dtype, saying so: a float32 model after a float64 one (a gradient
    check) goes back to the fast backend; an explicitly selected one raises BackendUnavailable with the fix."""
    if _current is not None and _keeps(dtype):
        return
    dtype = np.dtype(dtype)              # a scalar type or a name: compared as a dtype now
    if _current is None:                 # nothing selected yet: current()'s default, for this dtype
        from ..config import default_backend
        select(default_backend(), dtype=dtype)
    elif not _keeps(dtype):
        if not _auto:
            raise BackendUnavailable(f"the model is {dtype}, but the selected backend, {_current.name}, runs "
                                     f"{_names(_current.dtypes)} only. {_dtype_fix(_current.name, dtype)}")
        select("auto", dtype=dtype)


def _keeps(dtype):
    """The current backend runs dtype, and "auto" did not choose it for another (`is None` first: np.dtype(None)
    is float64, so a dtype compares equal to None)."""
    return dtype in _current.dtypes and (_auto_for is None or _auto_for == dtype)


def set_threads(n=0):
    """Threads of every pool of the current backend (0: all CPUs). BLAS takes them on numpy and numba (their
    products) and gets 1 on native."""
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
    """One thread pool busy at a time: BLAS gets 1 thread while native threads run. (numba's products are BLAS's:
    its set_threads gives BLAS the threads, and numba's OpenMP workers sleep between kernels.)"""
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


def label(bf16=None):
    """The current backend as the commands print it: native with the ISA path its library runs, e.g.
    "native (avx2)" (MINIGPT_ISA may force a lower one); the others by name. bf16=False (a float32 model): the
    bf16 paths name the AVX-512 FMAs that run float32 products too, e.g. "native (avx512; amx for bf16)"."""
    if name() != "native":
        return name()
    isa = _import("native").isa()
    return f"native (avx512; {isa} for bf16)" if bf16 is False and isa in ("avx512bf16", "amx") else f"native ({isa})"


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


class _CurrentBackend:
    """`ops.matmul(...)` runs the current backend's matmul: the layers' one handle on the backends."""

    def __getattr__(self, attr):
        return getattr(current(), attr)


ops = _CurrentBackend()
