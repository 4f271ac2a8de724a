"""Per-op time of the numpy backend (the specification) at config S shapes, against another tree's numpy_ops.py.

The other file is loaded as a module of this tree's minigpt.backends (its Ops base class), so both run in one
process on the same arrays; each repetition runs the two one after the other, and the table gives medians.
Run:  python scripts/bench_numpy_ops.py --base /path/to/old/tree [--reps 100]
"""
import argparse
import importlib.util
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from minigpt.backends import numpy_ops

B, T, C, NH, V = 12, 64, 128, 4, 65                             # config S: batch, block, n_embd, n_head, vocab


def cases(ops, rng):
    """name -> a call of one op at config S shapes (forward ops first run once, for their backward's inputs)."""
    F, N, H = np.float32, B * T, 4 * C
    r = lambda *s, k=1.0: (k * rng.standard_normal(s)).astype(F)    # noqa: E731
    x, w, b, y, mean, rstd = r(N, C, k=3), r(C), r(C), np.empty((N, C), F), np.empty(N, F), np.empty(N, F)
    ops.layernorm(x, w, b, y, mean, rstd)
    dy, dx, dw, db = r(N, C), np.empty((N, C), F), np.zeros(C, F), np.zeros(C, F)
    z0, bh, d = r(B, T, H, k=2), r(H), np.empty((B, T, H), F)
    z, dout, dbh = z0.copy(), r(B, T, H), np.zeros(H, F)
    s0, att, wide = r(B, NH, T, T, k=3), np.empty((B, NH, T, T), F), np.zeros((B, NH, T, T + 32), F)
    datt0, datt = r(B, NH, T, T), np.empty((B, NH, T, T), F)
    probs = ops.causal_softmax(s0.copy(), 0.17, 0)
    logits, t, lse, dl = r(N, V, k=2), rng.integers(0, V, N), np.empty(N, F), np.empty((N, V), F)
    ops.cross_entropy(logits, t, lse)
    dW, idx = np.zeros((V, C), F), rng.integers(0, V, N)
    p, g, m, v = r(C, 3 * C), r(C, 3 * C), r(C, 3 * C), r(C, 3 * C) ** 2
    qkv = np.empty((N, 3 * C), F)
    return {
        "matmul (768,128) @ (128,384)": lambda: ops.matmul(x, p, out=qkv),
        "matmul acc (768,128)^T @ (768,384)": lambda: ops.matmul(x, qkv, ta=True, out=g, acc=True),
        "layernorm (768,128)": lambda: ops.layernorm(x, w, b, y, mean, rstd),
        "layernorm_backward": lambda: ops.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db),
        "gelu (12,64,512), out = x": lambda: (np.copyto(z, z0), ops.gelu(z, bh, z, d)),
        "gelu_backward, dx = dout": lambda: ops.gelu_backward(dout, d, dout, dbh),
        "causal_softmax (12,4,64,64)": lambda: (np.copyto(att, s0), ops.causal_softmax(att, 0.17, 0)),
        "causal_softmax on [..., :64] of 96": lambda: (np.copyto(wide[..., :T], s0),
                                                        ops.causal_softmax(wide[..., :T], 0.17, 0)),
        "causal_softmax_backward": lambda: (np.copyto(datt, datt0), ops.causal_softmax_backward(probs, datt, 0.17)),
        "cross_entropy (768,65)": lambda: ops.cross_entropy(logits, t, lse),
        "cross_entropy_backward": lambda: ops.cross_entropy_backward(logits, t, lse, 1 / N, dl),
        "embedding_backward (65,128)": lambda: ops.embedding_backward(dW, idx, dy),
        "adamw (128,384)": lambda: ops.adamw(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5, 0.3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="a tree (a git worktree) whose minigpt/backends/numpy_ops.py to time")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2, help="BLAS threads (the products)")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("minigpt.backends._numpy_ops_base",
                                                  f"{a.base}/minigpt/backends/numpy_ops.py")
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    threadpool_limits(a.threads, user_api="blas")
    old, new = cases(base.NumpyOps(), np.random.default_rng(0)), cases(numpy_ops.NumpyOps(), np.random.default_rng(0))
    print(f"| op | {a.base} ms | this tree ms | ratio |\n|---|---|---|---|")
    for name in old:
        times = {0: [], 1: []}
        for f in (old[name], new[name], old[name], new[name]):         # warm-up: scratch, caches
            f()
        for _ in range(a.reps):
            for i, f in enumerate((old[name], new[name])):
                t0 = time.perf_counter()
                f()
                times[i].append(time.perf_counter() - t0)
        mb, mn = (statistics.median(times[i]) * 1e3 for i in (0, 1))
        print(f"| {name} | {mb:.3f} | {mn:.3f} | {mn / mb:.2f} |")


if __name__ == "__main__":
    main()
