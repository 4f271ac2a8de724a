"""The backends: who runs the ops a training step needs (declared in interface.py), and the choice of one.

A backend is an Ops object that its holder calls, never a setting looked up behind a call: the model holds the
one it runs on (GPT.ops) and hands it to every layer, and the optimizer holds the same one.
  numpy  - numpy_ops.py: the executable specification in plain NumPy; float32 and float64 (gradient tests)
  numba  - numba_ops.py: fused numba kernels (numba_kernels.py), and the specification's products (BLAS); float32
  native - native.py: every op in the C library native/ (AMX, AVX512_BF16, AVX-512, AVX2+FMA or portable C, chosen
           at run time), through ctypes; float32
interface.py declares every op with its shapes (Ops) and checks their arguments for all three. This file chooses
(load): an explicitly requested backend that cannot run (or cannot run the model's dtype) raises
BackendUnavailable; only "auto" chooses, and it says what it chose. The thread pools are the process's, so this
file owns every thread count: load sets them for the backend it returns.
"""
import importlib
import os
import sys

import numpy as np

from .interface import Ops  # noqa: F401  (the interface, as backends.Ops)

BACKENDS = ("numpy", "numba", "native")
# fastest first (reports/benchmarks.md): native's C, else numba's kernels, else the plain NumPy specification
AUTO_ORDER = ("native", "numba", "numpy")


class BackendUnavailable(RuntimeError):
    pass


# ----------------------------------------------------------------------------
# choosing a backend

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
    return _import(name).backend()       # one Ops per backend and process; raises BackendUnavailable with the fix


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
    return ("Fix: " + "".join(f"select {n} (--backend {n} or MINIGPT_BACKEND={n}), or " for n in others)
            + "cast the model to float32")


def load(name=None, dtype=None, threads=None, verbose=None):
    """The backend `name` (None: $MINIGPT_BACKEND, else auto) as an Ops, with the thread pools set for it.
    'auto' takes the first of AUTO_ORDER that loads and runs dtype (None: any) and says which on stderr
    (verbose=False silences it); an explicit backend that cannot run dtype raises BackendUnavailable.
    threads: of every pool (0: every CPU; None keeps the count set before)."""
    if name is None:
        from ..config import default_backend
        name = default_backend()
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
    _set_threads(impl, threads, verbose)
    return impl


def check_dtype(ops, dtype):
    """BackendUnavailable, with the fix, unless backend ops runs a model of dtype (GPT checks the one it is given)."""
    dtype = np.dtype(dtype)
    if dtype not in ops.dtypes:
        raise BackendUnavailable(f"the model is {dtype}, but the selected backend, {ops.name}, runs "
                                 f"{_names(ops.dtypes)} only. {_dtype_fix(ops.name, dtype)}")


def select_backend(cfg, verbose=None, threads=None):
    """load() as every command calls it: cfg.backend with threads (default: cfg.threads, 0 for every CPU); -> the
    Ops, or a UserError if it cannot run here, worded "--backend NAME: why" (the reason names the backend once)."""
    from ..errors import UserError
    try:
        return load(cfg.backend, threads=threads or cfg.threads or None, verbose=verbose)
    except BackendUnavailable as e:
        why = str(e).removeprefix(f"{cfg.backend}: ")
        raise UserError(f"--backend {cfg.backend}: {why}") from None


def label(ops, bf16=None):
    """Backend ops as the commands print it: native with the ISA path its library runs, e.g. "native (avx2)"
    (MINIGPT_ISA may force a lower one); the others by name. bf16=False (a float32 model): the bf16 paths name
    the AVX-512 FMAs that run float32 products too, e.g. "native (avx512; amx for bf16)"."""
    if ops.name != "native":
        return ops.name
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


# ----------------------------------------------------------------------------
# thread counts: the process has one set of pools (BLAS's, numba's, the C library's), so they are set here, for the
# backend that load returns

_threads = 0              # 0: every CPU this process may run on
_blas_cap = None          # threadpoolctl limiter, active while native threads own the cores


def _set_threads(ops, n, verbose):
    """Threads of every pool of backend ops: n (0: all CPUs; None: as set before). BLAS takes them on numpy and
    numba (their products) and gets 1 on native."""
    global _threads
    if n is not None:
        _threads = int(n)
    _cap_blas(ops.name == "native")
    ops.set_threads(threads())
    if n and n > cpus() and verbose is not False:
        print(f"minigpt: note: {n} threads on {cpus()} CPUs take turns, slower than {cpus()} threads "
              "(--threads 0 uses every CPU)", file=sys.stderr)


def threads():
    """Threads the backends run on."""
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
