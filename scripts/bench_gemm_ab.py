"""Two builds of the native library, side by side: each product of a training step (or a decoding step's few-row
products) timed with the calls of the two builds alternating in one process, so that a busy machine slows both
alike. Prints GFLOP/s per product and the speed-up (after / before; with --ops, ns per element and before /
after, the same speed-up); for kernel work, where step-level timings of a shared machine are too noisy to show a
few per cent.

    python setup.py build_ext --inplace   (in a checkout of the old commit: its minigpt/_mgk*.so is BEFORE)
    (BEFORE and AFTER must be two files, built with the same flags: one path given twice loads one library)
    python scripts/bench_gemm_ab.py BEFORE.so AFTER.so [--config M] [--threads 2] [--calls 9] [--rows 0] [--ops]
                                    [--attention] [--bf16] [--isa avx2] [--spin 100] [--threads 1 --clock cpu]

--rows N (1-8) times N-row products against the step's weights (decoding) instead of the step's own products.
--bf16 times the bf16 products (mgk_bgemm: operands rounded to bfloat16) instead of the float32 ones.
--ops times the step's ops instead, in ns per element: those built on exp (GELU forward, causal softmax forward, and
exp itself), LayerNorm forward and backward, and GELU backward with a bias's column sums.
--attention times one layer's fused attention instead (mgk_attention_fwd and _bwd on the heads of a (B, T, 3C) qkv,
as a step calls them), in ms a call; with --bf16, its bf16 products.
--isa NAME runs both builds on that path (mgk_set_isa; one this CPU runs) instead of their fastest.
"""
import argparse
import ctypes
import time

import numpy as np

from bench_util import cpu_line
from minigpt.backends.native import ISAS, NativeOps, _matrices     # the paths, in mgk_set_isa's numbering
from minigpt.layers import heads

CONFIGS = {"S": (12 * 64, 128), "M": (64 * 256, 384)}             # (rows of a step's activations, n_embd)
ATTENTION = {"S": (12 * 4, 64), "M": (64 * 6, 256)}                # (batch * heads, block) of attention's matrices
HEADS = {"S": (12, 4), "M": (64, 6)}                               # (batch, heads)


def load(path, threads, isa=None, spin_us=0):
    lib = ctypes.CDLL(path)
    lib.mgk_set_spin_us(spin_us)
    if isa is not None and lib.mgk_set_isa(ISAS.index(isa)) != 0:
        raise SystemExit(f"bench_gemm_ab: {path} cannot run the {isa} path on this CPU (mgk_set_isa refused it)")
    P = ctypes.c_void_p
    lib.mgk_sgemm.argtypes = [ctypes.c_int] * 5 + [P, ctypes.c_int, P, ctypes.c_int, ctypes.c_float, P, ctypes.c_int]
    lib.mgk_bgemm.argtypes = lib.mgk_sgemm.argtypes
    LL, I = ctypes.c_longlong, ctypes.c_int
    lib.mgk_gelu_fwd.argtypes = [LL, I, P, P, P, P]
    lib.mgk_exp.argtypes = [LL, P, P]
    lib.mgk_causal_softmax_fwd.argtypes = [LL, I, I, I, ctypes.c_float, P]
    lib.mgk_layernorm_fwd.argtypes = [LL, I, P, P, P, ctypes.c_double, P, P, P]
    lib.mgk_layernorm_bwd.argtypes = [LL, I] + [P] * 8
    lib.mgk_gelu_bwd.argtypes = [LL, I, P, P, P, P]
    view, drop = [P, I, LL, LL], [I, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_float]   # as minigpt/backends/native.py
    lib.mgk_attention_fwd.argtypes = [I] * 7 + [ctypes.c_float] + view * 5 + drop
    lib.mgk_attention_bwd.argtypes = [I] * 5 + [ctypes.c_float] + view * 8 + drop
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


def ops(config, rng):
    """(name, elements, call(lib)) of the step's ops at the config's shapes. The softmax runs in place on its own
    output again and again: probabilities, so every call does the same work; the backwards keep adding into the
    same parameter gradients."""
    R, C = CONFIGS[config]
    L, T = ATTENTION[config]
    x, b = rng.standard_normal((R, 4 * C)).astype(np.float32), rng.standard_normal(4 * C).astype(np.float32)
    y, d, db = np.empty_like(x), np.empty_like(x), np.zeros(4 * C, np.float32)
    att = rng.standard_normal((L, T, T)).astype(np.float32)
    h, dh = rng.standard_normal((2, R, C)).astype(np.float32)          # LayerNorm: x and dy, (R, C)
    w, hb, dw, dhb = np.ones(C, np.float32), np.zeros(C, np.float32), np.zeros(C, np.float32), np.zeros(C, np.float32)
    hy, hdx, mean, rstd = np.empty_like(h), np.empty_like(h), np.empty(R, np.float32), np.empty(R, np.float32)
    p = lambda a: a.ctypes.data                                      # noqa: E731
    return [(f"GELU forward {R}x{4 * C}", x.size, lambda lib: lib.mgk_gelu_fwd(R, 4 * C, p(x), p(b), p(y), p(d))),
            (f"exp {x.size}", x.size, lambda lib: lib.mgk_exp(x.size, p(x), p(y))),
            (f"causal softmax {L}x{T}x{T}", att.size,
             lambda lib: lib.mgk_causal_softmax_fwd(L, T, T, 0, 0.125, p(att))),
            (f"LayerNorm forward {R}x{C}", hy.size,
             lambda lib: lib.mgk_layernorm_fwd(R, C, p(h), p(w), p(hb), 1e-5, p(hy), p(mean), p(rstd))),
            (f"LayerNorm backward {R}x{C}", hy.size,
             lambda lib: lib.mgk_layernorm_bwd(R, C, p(dh), p(h), p(w), p(mean), p(rstd), p(hdx), p(dw), p(dhb))),
            (f"GELU backward, bias {R}x{4 * C}", x.size,
             lambda lib: lib.mgk_gelu_bwd(R, 4 * C, p(x), p(d), p(y), p(db)))]


def attention(config, bf16, rng):
    """(name, call(lib)) of one layer's fused attention forward and backward, no dropout, on the heads of a qkv
    (B, T, 3C) as the model's attention_forward/backward pass them (strided views: native.py's _matrices)"""
    (B, nh), (_, T), C = HEADS[config], ATTENTION[config], CONFIGS[config][1]
    hs = C // nh
    qkv, dqkv = rng.standard_normal((2, B, T, 3 * C)).astype(np.float32)
    y, dy = rng.standard_normal((2, B, T, C)).astype(np.float32)
    att = np.empty((B, nh, T, T), np.float32)
    scale, off = 1.0 / np.sqrt(hs), (0, 0, 0, 1.0)                  # off: no dropout
    fwd_views = [*heads(qkv, nh, 3), att, *heads(y, nh)]           # q, k, v, att, y: numpy views, which keep
    bwd_views = [*heads(qkv, nh, 3), att, *heads(dy, nh), *heads(dqkv, nh, 3)]   # their arrays alive
    strides = lambda views: [f for x in views for f in _matrices(x)]  # noqa: E731  (pointer, ld, s1, s2) each

    def fwd(lib):
        return lib.mgk_attention_fwd(bf16, B, nh, T, T, hs, 0, scale, *strides(fwd_views), *off)

    def bwd(lib):
        return lib.mgk_attention_bwd(bf16, B, nh, T, hs, scale, *strides(bwd_views), *off)
    return [(f"attention forward {B}x{nh}x{T}x{hs}", fwd), (f"attention backward {B}x{nh}x{T}x{hs}", bwd)]


def side_by_side(libs, call, calls, reps, clock=time.perf_counter):
    """median seconds of one call(lib) for each lib, the libs' turns alternating; clock: wall time, or the
    calling thread's CPU time (--clock cpu)"""
    for lib in libs:                                                 # warm-up: threads started, pages touched
        call(lib)
    times = [[], []]
    for c in range(calls):
        for b in ((0, 1) if c % 2 == 0 else (1, 0)):                # alternate which build goes first
            t0 = clock()
            for _ in range(reps):
                call(libs[b])
            times[b].append((clock() - t0) / reps)
    return [np.median(t) for t in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=9, help="calls of each build per product or op (median)")
    ap.add_argument("--rows", type=int, default=0, choices=range(9), metavar="0-8",
                    help="1-8: decoding's few-row products instead")
    ap.add_argument("--ops", action="store_true", help="the step's ops (GELU, causal softmax, LayerNorm) "
                    "instead (--rows does not apply)")
    ap.add_argument("--attention", action="store_true", help="one layer's fused attention, forward and backward, "
                    "instead (with --bf16: bf16 products)")
    ap.add_argument("--bf16", action="store_true", help="bf16 products (mgk_bgemm) instead of float32 (mgk_sgemm)")
    ap.add_argument("--isa", choices=ISAS, help="run both builds on this path (default: each one's fastest)")
    ap.add_argument("--spin", type=int, default=0, metavar="US",
                    help="the pools' wait on the CPU between calls (mgk_set_spin_us; the native backend sets "
                    f"{NativeOps.SPIN_US}, which lets small ops split over the threads); default 0: workers sleep. "
                    "Both builds' pools then spin, in each other's way")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time each call by the calling thread's CPU time, not the wall clock (--threads 1 "
                    "only: a one-thread call runs on its caller). On a host whose cores other work shares, the time "
                    "the scheduler gives that work to others is then not counted; caches and memory still are")
    a = ap.parse_args()
    if a.clock == "cpu" and a.threads != 1:
        ap.error("--clock cpu needs --threads 1: worker threads' CPU time is not the caller's")
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    libs = [load(a.before, a.threads, a.isa, a.spin), load(a.after, a.threads, a.isa, a.spin)]
    rng = np.random.default_rng(0)
    print(f"{cpu_line()}; {a.threads} threads; {a.isa or 'fastest'} path; {'bf16' if a.bf16 else 'float32'} "
          f"products; before {a.before}, after {a.after}; median of {a.calls} calls each, {a.clock} clock")
    if a.attention:
        print("| call | before ms | after ms | before / after |\n|---|---:|---:|---:|")
        for name, call in attention(a.config, a.bf16, rng):
            if call(libs[0]) or call(libs[1]):
                raise SystemExit(f"bench_gemm_ab: {name} returned an error code")
            t = side_by_side(libs, call, a.calls, 1, clock)
            print(f"| {name} | {t[0] * 1e3:.2f} | {t[1] * 1e3:.2f} | {t[0] / t[1]:.3f} |", flush=True)
        return
    if a.ops:
        print("| op | before ns/element | after ns/element | before / after |\n|---|---:|---:|---:|")
        for name, n, call in ops(a.config, rng):
            t = side_by_side(libs, call, a.calls, max(1, int(2e6 // n)), clock)
            print(f"| {name} | {t[0] / n * 1e9:.3f} | {t[1] / n * 1e9:.3f} | {t[0] / t[1]:.3f} |", flush=True)
        return
    print("| product (ta tb M x N x K) | before GFLOP/s | after GFLOP/s | after / before |\n|---|---:|---:|---:|")
    for ta, tb, M, N, K, beta in products(a.config, a.rows):
        x = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        w = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        out = np.zeros((M, N), np.float32)
        reps = max(1, int(2e8 // (2 * M * N * K)))                  # small products: several calls per timing
        gemm = "mgk_bgemm" if a.bf16 else "mgk_sgemm"
        call = lambda lib: getattr(lib, gemm)(ta, tb, M, N, K, x.ctypes.data, x.shape[1], w.ctypes.data,  # noqa: E731
                                         w.shape[1], beta, out.ctypes.data, N)
        g = [2 * M * N * K / t / 1e9 for t in side_by_side(libs, call, a.calls, reps, clock)]
        print(f"| {ta:d} {tb:d} {M}x{N}x{K} | {g[0]:.1f} | {g[1]:.1f} | {g[1] / g[0]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
