"""The native library's products and a whole training step on every ISA path this CPU runs (AVX-512, AVX2+FMA,
generic; mgk_set_isa, as MINIGPT_ISA does), against float64. tests/test_ops.py covers the path the CPU picks;
tests/test_native_ops.py the non-matmul ops on every path. Skipped, with the reason, without the library."""
import itertools

import numpy as np
import pytest

from minigpt import backends
from minigpt.backends import native
from minigpt.backends.numpy_ops import round_bf16
from minigpt.layers import heads
from minigpt.model import GPT, GPTConfig
from helpers import (causal_products, check_fused_attention, check_matmul_epilogues, check_matmul_gelu,
                     native_threads)


REASON = backends.why_unavailable("native")
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))
PATHS = list(native.ISAS[:native._lib().mgk_cpu_isa() + 1]) if REASON is None else []


@pytest.fixture(params=PATHS)
def path(request):
    """Load native and force the ISA path request.param for the test; the path in use is restored after."""
    lib = native._lib()
    saved = lib.mgk_isa()
    ops = backends.load("native", verbose=False)
    assert lib.mgk_set_isa(native.ISAS.index(request.param)) == 0
    assert native.isa() == request.param
    yield ops
    lib.mgk_set_isa(saved)


def test_isa_names_match_the_library():
    """native.ISAS (MINIGPT_ISA's words) names the paths in mgk.h's MGK_ISA_* order, as the library does."""
    lib = native._lib()
    assert [lib.mgk_isa_name(i).decode() for i in range(len(PATHS))] == PATHS
    assert lib.mgk_isa_name(len(PATHS)) == b"?"                      # a path this CPU cannot run


def close(got, want, K):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.sqrt(max(K, 1)))


@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_matmul_every_path_matches_float64(path, ta, tb):
    rng = np.random.default_rng(0)
    for M, N, K in itertools.product((1, 5, 7, 17, 64, 129), (1, 7, 16, 33, 130), (0, 1, 17, 400)):
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        close(path.matmul(a, b, ta=ta, tb=tb), want, K)
        c0 = rng.standard_normal((M, N)).astype(np.float32)
        out = c0.copy()
        close(path.matmul(a, b, ta=ta, tb=tb, out=out, acc=True), want + c0, K)   # acc: beta = 1


@pytest.mark.parametrize("N", [130, 3000])
def test_k_blocks_in_both_loop_orders(path, N):
    """More than one k block (K 1100: blocks of 256, 384 or 512 by path). On the AVX-512 paths, with 130 columns
    all of op(B) fits the pack buffer and each row block of C takes its k blocks in turn; with 3000 split over 2
    threads it does not, and each k block makes a pass over C (the other paths have only that order). Both must
    sum the same way, float32 and bf16, with and without beta."""
    with native_threads(2):                               # the columns per thread decide the order
        k_blocks(path, N)


def k_blocks(path, N):
    rng = np.random.default_rng(3)
    M, K = 70, 1100
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    close(path.matmul(a, b), want, K)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    out = c0.copy()
    close(path.matmul(a, b, out=out, acc=True), want + c0, K)
    r = lambda x: round_bf16(x, np.empty_like(x)).astype(np.float64)            # noqa: E731
    close(path.matmul(a, b, bf16=True), r(a) @ r(b), K)


@pytest.mark.parametrize("ta", [False, True])
def test_row_blocks(path, ta):
    """More rows than one packed row block (mgk.c: MC = 192 rows, MC_TA = 384 where op(A) = A^T), on one
    thread so that the rows are not split first: 400 rows make two or three blocks, the last a part one."""
    rng = np.random.default_rng(4)
    r = lambda x: round_bf16(x, np.empty_like(x)).astype(np.float64)            # noqa: E731
    # one k block, and (N 1600, K 600) k blocks that do not fit the B buffer all at once: a pass over C each
    for M, N, K in ((400, 40, 300), (400, 1600, 600)):
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c0 = rng.standard_normal((M, N)).astype(np.float32)
        want = (a.T if ta else a).astype(np.float64) @ b.astype(np.float64)
        with native_threads(1):
            close(path.matmul(a, b, ta=ta), want, K)
            close(path.matmul(a, b, ta=ta, out=c0.copy(), acc=True), want + c0, K)            # beta = 1
            close(path.matmul(a, b, ta=ta, bf16=True), (r(a).T if ta else r(a)) @ r(b), K)


def test_bmm_on_head_views_every_path(path):
    rng = np.random.default_rng(1)
    B, T, C, nh = 3, 17, 24, 4
    qkv = rng.standard_normal((B, T, 3 * C)).astype(np.float32)
    q, k, v = heads(qkv, nh, 3)                                  # strided views (B, nh, T, hs)
    y = np.full((B, T, C + 5), np.nan, np.float32)               # the output's gaps must stay NaN
    (yh,) = heads(y[:, :, :C], nh)
    att = path.bmm(q, k, tb=True)
    close(att, q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2), C // nh)
    path.bmm(att, v, out=yh)
    close(yh, att.astype(np.float64) @ v.astype(np.float64), T)
    assert np.isnan(y[:, :, C:]).all()


def test_causal_products_every_path(path):
    """The tiles and k ranges a causal product skips, on every path's own tile (helpers.causal_products)."""
    for got, a, b, ta, tb, base, future in causal_products(path, np.random.default_rng(2)):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        want = (a64.swapaxes(-1, -2) if ta else a64) @ (b64.swapaxes(-1, -2) if tb else b64)
        want += 0 if base is None else base
        if future is not None:
            want[..., future] = 0
            assert (got[..., future] == 0).all()
        close(got, want, a.shape[-2] if ta else a.shape[-1])



@pytest.mark.parametrize("start", [37, 2 ** 31 - 10])
def test_a_causal_product_with_a_start_past_every_column_masks_nothing_every_path(path, start):
    """causal="a" with start past A's last column: no entry of A is in the future, so the product is the plain one,
    however large start is (the k range start + row is counted past the int range)."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 40, 36)).astype(np.float32), rng.standard_normal((2, 40, 24)).astype(np.float32)
    for ta in (False, True):
        a64 = a.astype(np.float64)
        close(path.bmm(a, b[:, :36] if not ta else b, ta=ta, causal="a", start=start),
              (a64.swapaxes(-1, -2) if ta else a64) @ (b[:, :36] if not ta else b), 40 if ta else 36)

@pytest.mark.parametrize("bf16", [False, True])
def test_fused_attention_is_the_composed_ops_every_path(path, bf16):
    """mgk_attention_fwd/bwd give the bits of the products and softmaxes they fuse (helpers.check_fused_attention),
    on 1, 2 and 3 threads (items split evenly, unevenly, or left to the composition: native._fused). The counts
    are the forwards that ran fused: helpers.ATTENTION's shapes whose items split (8, 6, 5 of them), each once
    without dropout and once under it."""
    for n, fused in ((1, 16), (2, 12), (3, 10)):
        with native_threads(n):
            assert check_fused_attention(path, bf16, np.random.default_rng(3)) == fused, n



@pytest.mark.parametrize("bf16", [False, True])
def test_fused_attention_dropout_keeps_subnormal_probabilities_every_path(path, bf16):
    """The fused kernels multiply by dropout's mask in the caller's floating-point mode, as the composition's
    Ops.dropout does, not in the flush-to-zero mode of their products. Row 2's scores 0, 0, -87 give probabilities
    1/2, 1/2 and e**-87 / 2, which is subnormal in float32; dropout at p 0.5 doubles it to a normal float, and only
    key 2 carries v, so that flushing it to 0 shows in y and in dv of every item whose mask keeps it."""
    B, nh, T, hs, scale = 2, 2, 4, 4, 0.5
    q, k, v = np.zeros((3, B, nh, T, hs), np.float32)
    q[..., 0], k[:, :, 2, 0], v[:, :, 2] = 1.0, -174.0, 1e30      # scale * q . k_2 = -87
    drop, dy = (0.5, 12345), np.ones_like(q)
    mask = np.ones((B, nh, T, T), np.float32)
    kept = path.dropout(mask, *drop, out=mask)[:, :, 2, 2] > 0
    assert kept.any() and not kept.all()                          # the seed keeps some items' and drops others'
    res, ops = [], path.with_bf16(bf16)
    composed = (lambda *a: backends.Ops.attention(ops, *a), lambda *a: backends.Ops.attention_backward(ops, *a))
    for fwd, bwd in ((ops.attention, ops.attention_backward), composed):
        att, y, dq, dk, dv = np.zeros((B, nh, T, T), np.float32), *np.zeros((4, B, nh, T, hs), np.float32)
        fwd(q, k, v, att, y, scale, 0, drop)
        bwd(q, k, v, att, dy, dq, dk, dv, scale, drop)
        res.append((att, y, dq, dk, dv))
    for name, got, want in zip(("att", "y", "dq", "dk", "dv"), *res):
        np.testing.assert_array_equal(got, want, err_msg=name)
    att, y, _, _, dv = res[0]
    assert (0 < att[:, :, 2, 2]).all() and (att[:, :, 2, 2] < np.finfo(np.float32).tiny).all()   # subnormal
    assert ((y[:, :, 2, 0] > 0) == kept).all() and ((dv[:, :, 2, 0] > 0) == kept).all()

def test_gpt_step_every_path_matches_numpy():
    cfg = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32)
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 29, (3, 16)), rng.integers(0, 29, (3, 16))

    def step(name, isa=None):
        ops = backends.load(name, verbose=False)
        if isa is not None:
            assert native._lib().mgk_set_isa(native.ISAS.index(isa)) == 0
        model = GPT(cfg, np.random.default_rng(0), ops=ops)
        model.zero_grad()
        loss = model.forward(x, y)[1]
        model.backward()
        return loss, {k: g.copy() for k, g in model.grads().items()}

    saved = native._lib().mgk_isa()
    try:
        want_loss, want = step("numpy")
        for isa in PATHS:
            loss, got = step("native", isa)
            assert abs(loss - want_loss) < 1e-4 * want_loss, isa
            for k, g in want.items():
                np.testing.assert_allclose(got[k], g, rtol=1e-3, atol=1e-4 * np.abs(g).max(), err_msg=f"{isa} {k}")
    finally:
        native._lib().mgk_set_isa(saved)


def test_a_forked_child_runs_products_while_a_parent_thread_is_in_one():
    """fork() copies the library's call lock as it is: held, when another of the parent's threads is inside a
    product (here one thread runs them back to back, so a fork nearly always lands inside one). The child has no
    such thread, so the lock must start free there, or the child's first product waits forever."""
    import os
    import signal
    import threading
    import time
    ops = backends.load("native", verbose=False)
    big = np.ones((1024, 1024), np.float32)
    a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    done, started = threading.Event(), threading.Event()

    def products():
        while not done.is_set():
            ops.matmul(big, big)
            started.set()
    worker = threading.Thread(target=products)
    worker.start()
    try:
        started.wait(30)
        pid = os.fork()
        if pid == 0:                                      # the child: one product, then out (no pytest teardown)
            ok = np.allclose(ops.matmul(a, a.T), a.astype(np.float64) @ a.T, atol=1e-3)
            os._exit(0 if ok else 1)
        t0 = time.time()
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.time() - t0 < 10:
            time.sleep(0.01)
        if status[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    finally:
        done.set()
        worker.join()
    assert status[0] == pid, "the child's product waited for a lock that no thread of its own held"
    assert os.waitstatus_to_exitcode(status[1]) == 0



def test_matmul_gelu_is_the_product_then_gelu_every_path(path):
    check_matmul_gelu(path, np.random.default_rng(9))


def test_matmul_mul_and_add_are_the_product_then_the_op_every_path(path):
    check_matmul_epilogues(path, np.random.default_rng(11))
