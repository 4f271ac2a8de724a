"""Two builds of the native library, side by side: each product of a training step (or a decoding step's few-row
products) timed with the calls of the two builds alternating in one process, so that a busy machine slows both
alike. Prints GFLOP/s per product and the ratio (after / before); for kernel work, where step-level timings of a
shared machine are too noisy to show a few per cent.

    python setup.py build_ext --inplace   (in a checkout of the old commit: its minigpt/_mgk*.so is BEFORE)
    python scripts/bench_gemm_ab.py BEFORE.so AFTER.so [--config M] [--threads 2] [--calls 9] [--rows 0]

--rows N (1-8) times N-row products against the step's weights (decoding) instead of the step's own products.
"""
import argparse
import ctypes
import time

import numpy as np

from bench_util import cpu_line

CONFIGS = {"S": (12 * 64, 128), "M": (64 * 256, 384)}             # (rows of a step's activations, n_embd)


def load(path, threads):
    lib = ctypes.CDLL(path)
    P = ctypes.c_void_p
    lib.mgk_sgemm.argtypes = [ctypes.c_int] * 5 + [P, ctypes.c_int, P, ctypes.c_int, ctypes.c_float, P, ctypes.c_int]
    lib.mgk_set_num_threads(threads)
    return lib


def products(config, rows):
    """(ta, tb, M, N, K, beta) of a step's linear products (forward x W, backward dy W^T and x^T dy, which adds
    into the gradient), or of N-row products against the same weights when rows > 0."""
    R, C = CONFIGS[config]
    shapes = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]            # (out, in) of c_attn, c_proj, c_fc, mlp proj
    if rows:
        return [(0, 0, rows, o, i, 0.0) for o, i in shapes] + [(0, 1, rows, i, o, 0.0) for o, i in shapes]
    return ([(0, 0, R, o, i, 0.0) for o, i in shapes] + [(0, 1, R, i, o, 0.0) for o, i in shapes]
            + [(1, 0, i, o, R, 1.0) for o, i in shapes])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=9, help="calls of each build per product (median)")
    ap.add_argument("--rows", type=int, default=0, choices=range(9), metavar="0-8",
                    help="1-8: decoding's few-row products instead")
    a = ap.parse_args()
    libs = [load(a.before, a.threads), load(a.after, a.threads)]
    rng = np.random.default_rng(0)
    print(f"{cpu_line()}; {a.threads} threads; before {a.before}, after {a.after}; median of {a.calls} calls each")
    print("| product (ta tb M x N x K) | before GFLOP/s | after GFLOP/s | after / before |\n|---|---:|---:|---:|")
    for ta, tb, M, N, K, beta in products(a.config, a.rows):
        x = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        w = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        out = np.zeros((M, N), np.float32)
        reps = max(1, int(2e8 // (2 * M * N * K)))                  # small products: several calls per timing
        for lib in libs:                                             # warm-up: threads started, pages touched
            lib.mgk_sgemm(ta, tb, M, N, K, x.ctypes.data, x.shape[1], w.ctypes.data, w.shape[1], beta,
                          out.ctypes.data, N)
        times = [[], []]
        for c in range(a.calls):
            for b in ((0, 1) if c % 2 == 0 else (1, 0)):            # alternate which build goes first
                t0 = time.perf_counter()
                for _ in range(reps):
                    libs[b].mgk_sgemm(ta, tb, M, N, K, x.ctypes.data, x.shape[1], w.ctypes.data, w.shape[1],
                                      beta, out.ctypes.data, N)
                times[b].append((time.perf_counter() - t0) / reps)
        g = [2 * M * N * K / np.median(t) / 1e9 for t in times]
        print(f"| {ta:d} {tb:d} {M}x{N}x{K} | {g[0]:.1f} | {g[1]:.1f} | {g[1] / g[0]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
