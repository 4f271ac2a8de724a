"""The fused ops of the native backend against the compositions they replace, side by side in one process, at
configs S and M, float32 and bf16 products, each against Ops' own composition on the same backend:
  matmul_gelu  the MLP's first Linear with its GELU (mgk_gemm_gelu)
  matmul_mul   the MLP's second Linear's backward into fc, times the gelu' its forward kept (mgk_gemm_mul)
  matmul_add   an output projection with the residual add after it (mgk_gemm_add): attention's (C -> C) and the
               MLP's (4C -> C)
and, not a product, LayerNorm's backward adding into the residual stream's gradient (acc=True) against writing
its own array and adding it with numpy (float32 rows only: it has no products).
The calls alternate, so a busy machine slows both alike. Writes reports/fused_ops.md.

    python scripts/bench_fused.py [--threads 2] [--calls 9] [--configs S,M] [--out reports/fused_ops.md]
"""
import argparse
import time

import numpy as np

from bench_util import command, cpu_line, revision, write_keeping_notes
from minigpt import backends
from minigpt.backends.interface import Ops

CONFIGS = {"S": (12 * 64, 128), "M": (64 * 256, 384)}             # (rows of a step's activations, n_embd)
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def side_by_side(calls, n):
    """median seconds of each call, their turns alternating (which goes first alternates too)"""
    for c in calls:
        c()
    times = [[] for _ in calls]
    for i in range(n):
        for k in (range(len(calls)) if i % 2 == 0 else reversed(range(len(calls)))):
            t0 = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=9, help="calls of each per shape (median)")
    ap.add_argument("--configs", default="S,M")
    ap.add_argument("--out", default="reports/fused_ops.md")
    a = ap.parse_args()
    ops = backends.load("native", threads=a.threads, verbose=False)
    rng = np.random.default_rng(0)
    rows = []
    for cfg in a.configs.split(","):
        R, C = CONFIGS[cfg]
        x, dy, res = (rng.standard_normal((R, C)).astype(np.float32) for _ in range(3))
        fc = rng.standard_normal((R, 4 * C)).astype(np.float32)
        w_fc = (rng.standard_normal((C, 4 * C)) / np.sqrt(C)).astype(np.float32)
        w_proj = (rng.standard_normal((4 * C, C)) / np.sqrt(4 * C)).astype(np.float32)
        w_attn = (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32)
        b = rng.standard_normal(4 * C).astype(np.float32)
        out, dgelu = np.empty((2, R, 4 * C), np.float32)
        y = np.empty((R, C), np.float32)
        w_ln, dw = np.ones(C, np.float32), np.zeros(C, np.float32)
        mean, rstd = np.empty(R, np.float32), np.empty(R, np.float32)
        ops.layernorm(x, w_ln, None, np.empty_like(x), mean, rstd)
        dresid, dln_in = res.copy(), np.empty_like(x)

        def ln_composed():
            ops.layernorm_backward(dy, x, w_ln, mean, rstd, dln_in, dw, None)
            np.add(dresid, dln_in, out=dresid)
        ln = ("layernorm_backward", "acc: dresid += LayerNorm's dx", (R, C, 0),
              lambda: ops.layernorm_backward(dy, x, w_ln, mean, rstd, dresid, dw, None, acc=True), ln_composed)
        for bf16 in (False, True):
            o = ops.with_bf16(bf16)
            cases = [  # (op, what, M x N x K, fused, composed)
                ("matmul_gelu", "c_fc: gelu(x W + b)", (R, 4 * C, C),
                 lambda: o.matmul_gelu(x, w_fc, b, out, dgelu),
                 lambda: Ops._matmul_gelu(o, x, w_fc, b, out, dgelu)),
                ("matmul_mul", "mlp.c_proj backward: (dy W^T) gelu'", (R, 4 * C, C),
                 lambda: o.matmul_mul(dy, w_proj, dgelu, out, tb=True),
                 lambda: Ops._matmul_mul(o, dy, w_proj, dgelu, out, True)),
                ("matmul_add", "attn.c_proj: x + y W", (R, C, C),
                 lambda: o.matmul_add(x, w_attn, None, res, y),
                 lambda: Ops._matmul_add(o, x, w_attn, None, res, y)),
                ("matmul_add", "mlp.c_proj: x + fc W", (R, C, 4 * C),
                 lambda: o.matmul_add(fc, w_proj, None, res, y),
                 lambda: Ops._matmul_add(o, fc, w_proj, None, res, y))] + ([] if bf16 else [ln])
            for op, what, (M, N, K), fused, composed in cases:
                reps = max(1, int(2e8 // (2 * M * N * max(K, 64))))                 # small shapes: several a timing
                t_c, t_f = side_by_side([lambda: [composed() for _ in range(reps)],
                                         lambda: [fused() for _ in range(reps)]], a.calls)
                rows.append((cfg, op, what, f"{M}x{N}x{K}" if K else f"{M}x{N}", "-" if not K else "bf16" if bf16
                             else "float32", t_c / reps, t_f / reps))
                print(rows[-1], flush=True)
    lines = ["# Fused ops against their compositions", "",
             f"Command: `{command('bench_fused.py')}` on {cpu_line()}, {a.threads} threads, native backend "
             f"(path {ops.lib.mgk_isa_name(ops.lib.mgk_isa()).decode()}), {time.strftime('%Y-%m-%d %H:%M')}, at "
             f"{revision()}. Median of {a.calls} calls each, the two alternating in one process.", "",
             "Each is a product with the elementwise op that reads its result. Composed: the product writes its "
             "result, then the op (numpy's, or the backend's GELU) reads it back and writes it again. Fused: each "
             "block of the product gets the op while it is still in cache, so the result is written once and not "
             "read back (`matmul_gelu`: out = gelu(x W + b), gelu' kept for the backward; `matmul_mul`: the "
             "MLP's backward, d loss / d z = (dy W^T) gelu'; `matmul_add`: a projection and the residual add, out "
             "= x + y W). `layernorm_backward` with acc adds its dx into the residual stream's gradient as it writes "
             "it, instead of writing an array of its own that numpy then adds (no product: M x N is the array). Same "
             "bits (tests/test_native_isa.py, tests/test_ops.py).", "",
             "| config | op | where | product (M x N x K) | products | composed ms | fused ms | speed-up |",
             "|---|---|---|---|---|---:|---:|---:|"]
    for cfg, op, what, shape, dt, tc, tf in rows:
        lines.append(f"| {cfg} | `{op}` | {what} | {shape} | {dt} | {1e3 * tc:.2f} | {1e3 * tf:.2f} | {tc / tf:.2f}x |")
    write_keeping_notes(a.out, "\n".join(lines), NOTES)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
