"""The backend interface as code (minigpt/backends/interface.py) and the choice of backend by dtype (__init__.py).

Ops declares every op, and every backend implements each one; Ops._contiguous hands kernels C-contiguous
arrays without allocating per call; each backend names the dtypes a model runs on it, "auto" picks the first
that loads and runs the model's dtype, an explicit backend that cannot run it is an error with the fix; a model
holds the backend it is given (or the default for its dtype, chosen once), bound to its precision (with_bf16); a
backend installed here passes its own smoke test. The ops' numbers: test_ops.py.
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
# Ops checks them and composes their _<op> of the other ops (native fuses that: a product with its epilogue)
CHECKED_COMPOSED = {"matmul_gelu", "matmul_mul", "matmul_add"}


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
        for op in CHECKED_COMPOSED:
            assert getattr(cls, op) is getattr(Ops, op), f"{cls.__name__} overrides {op}: its checks would be skipped"
        for op in set(DECLARED) - COMPOSED - CHECKED_COMPOSED:
            impl = "_" + op
            assert getattr(cls, impl, None) is not getattr(Ops, impl, None), f"{cls.__name__} lacks {impl}"
            assert getattr(cls, op) is getattr(Ops, op), f"{cls.__name__} overrides {op}: its checks would be skipped"
            if op not in ("matmul", "bmm"):                      # the layers call them with Ops' signatures
                assert inspect.signature(getattr(cls, impl)) == inspect.signature(getattr(Ops, op)), (name, op)
    assert {op for op in COMPOSED if getattr(_class("native"), op) is not getattr(Ops, op)} == COMPOSED   # fused
    native_own = {op for op in CHECKED_COMPOSED if getattr(_class("native"), "_" + op) is not getattr(Ops, "_" + op)}
    assert native_own == CHECKED_COMPOSED                        # fused, behind Ops' checks


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
    ops = backends.load("numpy", verbose=False)
    x, y = np.ones((3, 4), np.float32), np.empty((3, 4), np.float32)
    c = ops._contiguous("op")
    assert c.inp(x) is x and c.out(y) is y and c.inout(y) is y and c.inp(None) is None and c.out(None) is None
    c.back()
    assert np.all(x == 1)


def test_contiguous_copies_views_into_scratch_and_back():
    ops = backends.load("numpy", verbose=False)
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
    ops = backends.load("numpy", verbose=False)
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
# selection by dtype, and the backend a model holds

def test_auto_picks_the_first_backend_that_runs_the_dtype(capsys):
    first = backends.load("auto", verbose=False).name           # no dtype: the first that loads
    assert backends.load("auto", dtype=np.float32).name == first
    assert backends.load("auto", dtype="float64").name == "numpy"
    err = capsys.readouterr().err
    assert "auto -> numpy for float64" in err
    for name in _fast_here():                                   # why each faster backend was skipped
        assert f"{name} runs float32 only, not float64" in err


def test_auto_without_a_backend_for_the_dtype_raises():
    with pytest.raises(backends.BackendUnavailable, match="no backend runs float16"):
        backends.load("auto", dtype=np.float16)


@pytest.mark.parametrize("name", ["numba", "native"])
def test_explicit_backend_that_cannot_run_the_dtype_raises(name):
    # checked from the class, before anything loads: the same answer where the backend is missing
    with pytest.raises(backends.BackendUnavailable) as e:
        backends.load(name, dtype=np.float64)
    msg = str(e.value)
    assert "\n" not in msg and f"{name} runs float32 only, not float64" in msg
    assert "select numpy (--backend numpy or MINIGPT_BACKEND=numpy)" in msg and "cast the model to float32" in msg
    assert backends.load("numpy", dtype=np.float64, verbose=False).name == "numpy"


def test_a_backend_is_one_object_per_process():
    """load hands out each backend's one Ops (its kernels, scratch and thread pools): loading again, by name or
    by auto, gives the same object."""
    ops = backends.load("numpy", verbose=False)
    assert backends.load("numpy", dtype="float64", verbose=False) is ops
    first = backends.load("auto", verbose=False)
    assert backends.load("auto", dtype=np.float32, verbose=False) is first


TINY = dict(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8)


def test_a_model_holds_the_backend_it_was_given():
    from minigpt.model import GPT, GPTConfig
    numpy_ops = backends.load("numpy", verbose=False)
    for dt in (np.float32, np.float64, F64, "float32"):        # a dtype, a scalar type, a name
        model = GPT(GPTConfig(**TINY), dtype=dt, ops=numpy_ops)
        assert model.ops is numpy_ops and not model.bf16
        model.forward(np.zeros((1, 3), int))
        assert model.ops is numpy_ops                           # a forward changes nothing


@pytest.mark.parametrize("name", FAST)
def test_a_model_refuses_a_backend_that_cannot_run_its_dtype(name):
    from minigpt.model import GPT, GPTConfig
    ops = backends.load(name, verbose=False)
    assert GPT(GPTConfig(**TINY), dtype=F32, ops=ops).ops is ops
    with pytest.raises(backends.BackendUnavailable) as e:
        GPT(GPTConfig(**TINY), dtype=F64, ops=ops)
    msg = str(e.value)
    assert f"the model is float64, but the selected backend, {name}, runs float32 only" in msg and "\n" not in msg
    assert "select numpy" in msg and "cast the model to float32" in msg


def test_a_model_chooses_its_backend_once_for_its_dtype(monkeypatch, capsys):
    """Without ops=, a model takes the default when it is made: $MINIGPT_BACKEND, else auto's choice for its
    dtype (a float64 model, a gradient check, gets numpy; a float32 one the fastest), and keeps it."""
    from minigpt.model import GPT, GPTConfig
    monkeypatch.delenv("MINIGPT_BACKEND", raising=False)
    m64 = GPT(GPTConfig(**TINY), dtype=np.float64)
    assert m64.ops.name == "numpy" and "auto -> numpy for float64" in capsys.readouterr().err
    m32 = GPT(GPTConfig(**TINY))
    first = backends.load("auto", verbose=False).name
    assert m32.ops.name == first and f"auto -> {first} for float32" in capsys.readouterr().err
    m64.forward(np.zeros((1, 3), int))                          # each runs on its own, in any order
    m32.forward(np.zeros((1, 3), int))
    assert (m64.ops.name, m32.ops.name) == ("numpy", first) and capsys.readouterr().err == ""

    monkeypatch.setenv("MINIGPT_BACKEND", "native")             # chosen explicitly, by the environment
    with pytest.raises(backends.BackendUnavailable, match="native runs float32 only, not float64"):
        GPT(GPTConfig(**TINY), dtype=np.float64)


def test_with_bf16_binds_the_products_precision():
    """with_bf16 gives the backend with bf16 products by default (a copy sharing its state), itself when it already
    is; a call's own bf16= still decides, and the model's ops is bound to its precision."""
    from minigpt.model import GPT, GPTConfig
    ops = backends.load("numpy", verbose=False)
    b16 = ops.with_bf16(True)
    assert b16 is not ops and b16.bf16 and not ops.bf16 and b16.with_bf16(True) is b16 and ops.with_bf16(False) is ops
    assert b16._scratch is ops._scratch and b16.with_bf16(False).name == "numpy"
    a = np.full((2, 2), 1 + 2 ** -10, np.float32)               # bf16 rounds it to 1
    assert b16.matmul(a, a)[0, 0] == 2.0 and ops.matmul(a, a)[0, 0] != 2.0
    assert b16.matmul(a, a, bf16=False)[0, 0] != 2.0 and ops.matmul(a, a, bf16=True)[0, 0] == 2.0
    model = GPT(GPTConfig(**TINY), bf16=True, ops=ops)
    assert model.bf16 and model.ops.bf16 and model.ops.name == "numpy" and not ops.bf16
    assert not GPT(GPTConfig(**TINY), ops=b16).bf16             # the model's bf16= decides


def test_label_names_the_native_isa_path(monkeypatch):
    """What train, sample and the report print: native with the path its library runs (MINIGPT_ISA forces one)."""
    assert backends.label(backends.load("numpy", verbose=False)) == "numpy"
    if backends.why_unavailable("native") is None:
        ops = backends.load("native", verbose=False)
        from minigpt.backends import native
        isa = native.isa()
        assert backends.label(ops) == backends.label(ops, True) == f"native ({isa})" and isa in native.ISAS
        fp32 = f"native (avx512; {isa} for bf16)" if isa in ("avx512bf16", "amx") else f"native ({isa})"
        assert backends.label(ops, False) == fp32                # float32 products run on AVX-512 FMAs there


def test_more_threads_than_cpus_is_said_once(capsys):
    """load(threads=N) above the CPUs runs, after one note on stderr; at the CPUs, or silenced, nothing is said."""
    saved, n = backends._threads, backends.cpus()
    try:
        backends.load("numpy", threads=n + 3)
        assert capsys.readouterr().err == (f"minigpt: note: {n + 3} threads on {n} CPUs take turns, slower than {n} "
                                           "threads (--threads 0 uses every CPU)\n")
        assert backends.threads() == n + 3
        backends.load("numpy", threads=n + 3, verbose=False)
        backends.load("numpy", threads=n)
        assert capsys.readouterr().err == ""
    finally:
        backends.load("numpy", threads=saved, verbose=False)
