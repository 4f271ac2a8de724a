"""The backend interface as code (minigpt/backends/interface.py) and the choice of backend by dtype (__init__.py).

Ops declares every op, and every backend implements each one; Ops._contiguous hands kernels C-contiguous
arrays without allocating per call; each backend names the dtypes a model runs on it, "auto" picks the first
that loads and runs the model's dtype, an explicit backend that cannot run it is an error with the fix, and
ensure(dtype) (each forward) re-chooses only what "auto" chose, and does for each dtype in turn; a backend
installed here passes its own smoke test. The ops' numbers: test_ops.py.
"""
import importlib
import inspect

import numpy as np
import pytest

from minigpt import backends
from minigpt.backends import Ops
from test_ops import DECLARED, FAST, REASONS

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _class(name):
    """The backend's Ops subclass (importing its module loads no kernels)."""
    module, cls = backends._MODULES[name]
    return getattr(importlib.import_module(f"minigpt.backends.{module}"), cls)


def _fast_here():
    return [n for n in backends.AUTO_ORDER if n != "numpy" and REASONS[n] is None]


# ----------------------------------------------------------------------------
# the interface

COMPOSED = {"attention", "attention_backward"}   # Ops composes them of the other ops (native fuses them)


def test_ops_declares_every_op_and_each_backend_implements_it():
    """Ops holds every op's checks (once for all backends); each backend writes the op's _<op> (with the op's
    signature) and never the public op, which would skip the checks: only the composed ones may be fused."""
    assert {"matmul", "bmm", "layernorm", "layernorm_backward", "gelu", "gelu_backward", "causal_softmax",
            "causal_softmax_backward", "cross_entropy", "cross_entropy_backward", "embedding_backward",
            "adamw"} <= set(DECLARED)
    base = Ops()
    for op in DECLARED:
        assert getattr(Ops, op).__doc__, f"Ops.{op} has no docstring (its shapes)"
    with pytest.raises(NotImplementedError):                    # checked in Ops, then computed by _matmul
        base.matmul(np.ones((3, 4)), np.ones((4, 5)))
    with pytest.raises(NotImplementedError):
        base.bmm(np.ones((2, 3, 4)), np.ones((2, 4, 5)))
    for name in backends.BACKENDS:
        cls = _class(name)
        for op in set(DECLARED) - COMPOSED:
            impl = "_" + op
            assert getattr(cls, impl, None) is not getattr(Ops, impl, None), f"{cls.__name__} lacks {impl}"
            assert getattr(cls, op) is getattr(Ops, op), f"{cls.__name__} overrides {op}: its checks would be skipped"
            if op not in ("matmul", "bmm"):                      # the layers call them with Ops' signatures
                assert inspect.signature(getattr(cls, impl)) == inspect.signature(getattr(Ops, op)), (name, op)
    assert {op for op in COMPOSED if getattr(_class("native"), op) is not getattr(Ops, op)} == COMPOSED   # fused


def test_a_backend_that_loads_here_passes_its_own_smoke_test():
    """numba and native compare a kernel or two with the specification when they load, and "auto" skips one that
    fails; the op tests then skip it too. Here that is a failure, not a skip: a backend whose module and library
    are installed (numba imports; the library is built) must pass its smoke test, so that a kernel broken badly
    enough to fail it (a wrong exp, a softmax missing a key) fails the suite instead of quietly skipping it."""
    import importlib.util
    from minigpt.backends import native
    installed = {"numba": importlib.util.find_spec("numba") is not None}
    try:
        native._find()
        installed["native"] = True
    except backends.BackendUnavailable:
        installed["native"] = False
    for name, present in installed.items():
        if present:
            assert backends.why_unavailable(name) is None, (name, backends.why_unavailable(name))


def test_backends_name_their_dtypes():
    assert _class("numpy").dtypes == {F32, F64}
    assert _class("numba").dtypes == {F32}                      # float64 models are the specification's
    assert _class("native").dtypes == {F32}


# ----------------------------------------------------------------------------
# Ops._contiguous: C-contiguous arrays for one kernel call

def test_contiguous_passes_contiguous_arrays_through():
    ops = backends.current()
    x, y = np.ones((3, 4), np.float32), np.empty((3, 4), np.float32)
    c = ops._contiguous("op")
    assert c.inp(x) is x and c.out(y) is y and c.inout(y) is y and c.inp(None) is None and c.out(None) is None
    c.back()
    assert np.all(x == 1)


def test_contiguous_copies_views_into_scratch_and_back():
    ops = backends.current()
    base_x, base_y = np.arange(30, dtype=np.float32).reshape(3, 10), np.full((3, 10), -1.0, np.float32)
    x, y, acc = base_x[:, :4], base_y[:, :4], base_y[:, 5:9]       # rows 10 floats apart: not contiguous
    c = ops._contiguous("op")
    xs, ys, accs = c.inp(x), c.out(y), c.inout(acc)
    assert all(a.flags.c_contiguous for a in (xs, ys, accs))
    assert len({id(xs), id(ys), id(accs)}) == 3                 # each argument its own scratch
    np.testing.assert_array_equal(xs, x)                        # inp and inout: copied in
    np.testing.assert_array_equal(accs, acc)
    np.multiply(xs, 2, out=ys)                                  # "the kernel"
    accs += 1
    c.back()
    np.testing.assert_array_equal(y, 2 * x)                     # out and inout: copied back
    np.testing.assert_array_equal(acc, np.full((3, 4), 0.0))
    assert (base_y[:, 4] == -1).all() and (base_y[:, 9] == -1).all()    # nothing outside the views

    c = ops._contiguous("op")                                   # the next call: the same scratch, no allocation
    assert c.inp(x) is xs and c.out(y) is ys and c.inout(acc) is accs
    c = ops._contiguous("op")
    assert c.inp(x) is xs and c.inp(x) is ys                    # the same array twice: two scratch arrays
    c.back()                                                    # nothing to copy back
    np.testing.assert_array_equal(y, 2 * x)


def test_contiguous_refuses_read_only_outputs():
    ops = backends.current()
    ro = np.broadcast_to(np.zeros(4, np.float32), (3, 4))
    c = ops._contiguous("gelu")
    assert c.inp(ro).flags.c_contiguous                         # an input may be read-only
    for f in (c.out, c.inout):
        with pytest.raises(ValueError, match="numpy gelu: an output array is read-only"):
            f(ro)
    frozen = np.zeros((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.out(frozen)


# ----------------------------------------------------------------------------
# selection by dtype

def test_auto_picks_the_first_backend_that_runs_the_dtype(capsys):
    first = backends.select("auto", verbose=False)              # no dtype: the first that loads
    assert backends.select("auto", dtype=np.float32) == first
    assert backends.select("auto", dtype="float64") == "numpy"
    err = capsys.readouterr().err
    assert "auto -> numpy for float64" in err
    for name in _fast_here():                                   # why each faster backend was skipped
        assert f"{name} runs float32 only, not float64" in err


def test_auto_without_a_backend_for_the_dtype_raises():
    with pytest.raises(backends.BackendUnavailable, match="no backend runs float16"):
        backends.select("auto", dtype=np.float16)
    assert backends.name() == "numpy"                           # unchanged


@pytest.mark.parametrize("name", ["numba", "native"])
def test_explicit_backend_that_cannot_run_the_dtype_raises(name):
    # checked from the class, before anything loads: the same answer where the backend is missing
    with pytest.raises(backends.BackendUnavailable) as e:
        backends.select(name, dtype=np.float64)
    msg = str(e.value)
    assert "\n" not in msg and f"{name} runs float32 only, not float64" in msg
    assert "select numpy (--backend numpy or MINIGPT_BACKEND=numpy)" in msg and "cast the model to float32" in msg
    assert backends.name() == "numpy"                           # no silent switch
    assert backends.select("numpy", dtype=np.float64, verbose=False) == "numpy"


def test_ensure_keeps_a_backend_that_runs_the_dtype():
    numpy_ops = backends.current()
    for dt in (np.float32, np.float64, F64, "float32"):        # a dtype, a scalar type, a name
        backends.ensure(dt)
        assert backends.current() is numpy_ops


@pytest.mark.parametrize("name", FAST)
def test_ensure_refuses_another_dtype_on_an_explicit_backend(name):
    backends.select(name, verbose=False)
    backends.ensure(F32)
    with pytest.raises(backends.BackendUnavailable) as e:
        backends.ensure(F64)
    msg = str(e.value)
    assert f"the model is float64, but the selected backend, {name}, runs float32 only" in msg and "\n" not in msg
    assert "select numpy" in msg and "cast the model to float32" in msg
    assert backends.name() == name


def test_ensure_chooses_again_what_auto_chose(capsys):
    if not _fast_here():
        pytest.skip("auto picks numpy here, which runs every dtype")
    first = backends.select("auto", threads=1, verbose=False)
    assert first != "numpy"
    backends.ensure(F32)
    assert backends.name() == first
    backends.ensure(F64)                                        # a float64 model: auto again, for float64
    assert backends.name() == "numpy" and backends.threads() == 1
    assert "auto -> numpy for float64" in capsys.readouterr().err
    backends.ensure(F32)                                        # a float32 model again: auto's first choice,
    assert backends.name() == first and backends.threads() == 1 # not numpy (which runs float32 too, slower)
    assert f"auto -> {first} for float32" in capsys.readouterr().err
    backends.ensure(F32)                                        # then nothing more: one lookup a forward
    assert capsys.readouterr().err == ""


def test_ensure_before_any_selection_takes_the_default_for_the_dtype(monkeypatch, capsys):
    monkeypatch.setattr(backends, "_current", None)             # as in a fresh process
    monkeypatch.delenv("MINIGPT_BACKEND", raising=False)
    backends.ensure(np.float64)
    assert backends.name() == "numpy" and "auto -> numpy for float64" in capsys.readouterr().err

    monkeypatch.setattr(backends, "_current", None)
    monkeypatch.setenv("MINIGPT_BACKEND", "native")             # chosen explicitly, by the environment
    with pytest.raises(backends.BackendUnavailable, match="native runs float32 only, not float64"):
        backends.ensure(np.float64)


def test_label_names_the_native_isa_path(monkeypatch):
    """What train, sample and the report print: native with the path its library runs (MINIGPT_ISA forces one)."""
    before = backends.name()
    try:
        backends.select("numpy", verbose=False)
        assert backends.label() == "numpy"
        if backends.why_unavailable("native") is None:
            backends.select("native", verbose=False)
            from minigpt.backends import native
            isa = native.isa()
            assert backends.label() == backends.label(True) == f"native ({isa})" and isa in native.ISAS
            fp32 = f"native (avx512; {isa} for bf16)" if isa in ("avx512bf16", "amx") else f"native ({isa})"
            assert backends.label(False) == fp32                  # float32 products run on AVX-512 FMAs there
    finally:
        backends.select(before, verbose=False)


def test_more_threads_than_cpus_is_said_once(capsys):
    """select(threads=N) above the CPUs runs, after one note on stderr; at the CPUs, or silenced, nothing is said."""
    before, saved, n = backends.name(), backends._threads, backends.cpus()
    try:
        backends.select("numpy", threads=n + 3)
        assert capsys.readouterr().err == (f"minigpt: note: {n + 3} threads on {n} CPUs take turns, slower than {n} "
                                           "threads (--threads 0 uses every CPU)\n")
        assert backends.threads() == n + 3
        backends.select("numpy", threads=n + 3, verbose=False)
        backends.select("numpy", threads=n)
        assert capsys.readouterr().err == ""
    finally:
        backends.select(before, threads=saved, verbose=False)
