"""Benchmark every matmul shape of one training step (configs S and M) on numpy (OpenBLAS) and native (fp32 and
bf16); write reports/kernels.md. (numba runs numpy's products: numpy_ops.product.)

The shapes (step_shapes) and the timer (time_product) are here, not in the package: they serve benchmarks only.
All backends run in one process with the same thread count; rounds alternate the backends so that noise from
other work on the machine lands on all of them (numpy last, then a pause: idle OpenBLAS threads spin for a while
and would slow whichever backend runs next). Text after the NOTES marker in an existing report is kept.
Run:  flock /tmp/minigpt-bench.lock python scripts/bench_kernels.py --threads 2
"""
import argparse
import functools
import time

import numpy as np

from bench_util import cpu_line, write_keeping_notes
from minigpt import backends
from minigpt.backends import interface
from minigpt.backends.native import isa as native_isa


# ----------------------------------------------------------------------------
# the products of one training step, and a timer

def step_shapes(batch, block, n_embd, n_head, vocab, n_layer):
    """[(name, L, M, N, K, ta, tb, count, causal)]: every product of one forward+backward, count = uses per step;
    causal: how layers.py runs attention's products (bmm causal=); each also has a plain row, count 0, beside it."""
    R, C, Cx, hs, nl = batch * block, n_embd, 4 * n_embd, n_embd // n_head, n_layer
    out = []
    for name, n_in, n_out in (("c_attn", C, 3 * C), ("attn.c_proj", C, C), ("c_fc", C, Cx), ("mlp.c_proj", Cx, C)):
        out += [(f"{name} fwd x@W", 1, R, n_out, n_in, False, False, nl, None),
                (f"{name} dX dy@W^T", 1, R, n_in, n_out, False, True, nl, None),
                (f"{name} dW x^T@dy", 1, n_in, n_out, R, True, False, nl, None)]
    L, T = batch * n_head, block
    for name, M, N, K, ta, tb, causal in (("q@k^T", T, T, hs, False, True, "out"), ("att@v", T, hs, T, False, False, "a"),
                                          ("d(att) dy@v^T", T, T, hs, False, True, "out"),
                                          ("dv att^T@dy", T, hs, T, True, False, "a"),
                                          ("dq ds@k", T, hs, T, False, False, "a"), ("dk ds^T@q", T, hs, T, True, False, "a")):
        out += [(f"attn {name}", L, M, N, K, ta, tb, nl, causal), (f"attn {name}, plain", L, M, N, K, ta, tb, 0, None)]
    return out + [("lm_head fwd x@wte^T", 1, R, vocab, C, False, True, 1, None),
                  ("lm_head dX dl@wte", 1, R, C, vocab, False, False, 1, None),
                  ("lm_head dW dl^T@x", 1, vocab, C, R, True, False, 1, None)]


def time_product(ops, L, M, N, K, ta, tb, min_time=0.2, warmup=2, min_calls=5, rng=None, bf16=False, causal=None):
    """Seconds of each timed call of op(a) @ op(b) on backend ops (after warm-up), into a preallocated
    out: ops.matmul for L = 1, ops.bmm over a (L, M, N) batch otherwise (contiguous operands); bf16 products
    with bf16=True; causal: bmm's causal= (for "a", a is made causal: zero past the diagonal)."""
    rng = rng or np.random.default_rng(0)
    lead = (L,) if L > 1 else ()
    a = rng.standard_normal((*lead, K, M) if ta else (*lead, M, K), dtype=np.float32)
    b = rng.standard_normal((*lead, N, K) if tb else (*lead, K, N), dtype=np.float32)
    if causal == "a":
        a[..., interface.future(*a.shape[-2:], 0)] = 0
    out = np.empty((*lead, M, N), np.float32)
    f = functools.partial(ops.bmm, causal=causal) if lead else ops.matmul
    for _ in range(warmup):
        f(a, b, ta, tb, out, bf16=bf16)
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_calls or (time.perf_counter() < t_end and len(times) < 200):
        t0 = time.perf_counter()
        f(a, b, ta, tb, out, bf16=bf16)
        times.append(time.perf_counter() - t0)
    return np.array(times)


# ----------------------------------------------------------------------------

CONFIGS = {"S": dict(batch=12, block=64, n_embd=128, n_head=4, vocab=65, n_layer=4),
           "M": dict(batch=64, block=256, n_embd=384, n_head=6, vocab=65, n_layer=6)}
BF16_ON = {"avx512bf16": "vdpbf16ps", "amx": "AMX tiles (tdpbf16ps)"}   # the bf16 peak loop of each native path
BF16_ELSE = "the fp32 FMAs on bf16-rounded operands: no bf16 instruction on this path"
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def peak(names, threads, bf16=False):  # fp32 FMA peak of the threads now (register-only loop): low values flag a
    if "native" not in names:           # busy machine. bf16: the bf16 products' instruction (BF16_ON)
        return None
    ops = backends.load("native", threads=threads, verbose=False)
    return max(ops.peak_gflops(bf16=bf16) for _ in range(3))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="threads of every backend")
    p.add_argument("--configs", default="S,M", help="comma list of the step shapes to time: S, M")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every backend (the median is reported)")
    p.add_argument("--min_time", type=float, default=0.25, help="seconds of timed calls per backend, shape and round")
    p.add_argument("--out", default="reports/kernels.md", help="the report (its notes below the marker are kept)")
    p.add_argument("--bf16", type=int, default=1, help="1: also time native's bf16 products (column 'native bf16')")
    p.add_argument("--match", default="", help="time only the products whose name starts with this text (e.g. "
                   "'attn ': attention's)")
    args = p.parse_args()

    # numpy (OpenBLAS via np.matmul) last in a round; numba runs numpy's products (numpy_ops.product): not timed twice
    names = sorted((b for b in backends.available() if b != "numba"), key=lambda b: b == "numpy")
    peak_before, bf16_peak = peak(names, args.threads), peak(names, args.threads, bf16=True)
    if "native" in names and args.bf16:
        names.insert(names.index("native") + 1, "native bf16")        # bf16 products on the native path in use
    lines = ["# Kernel benchmark: GFLOP/s per matmul shape of one training step"
             + (f" (the products named '{args.match}...')" if args.match else ""), "",
             f"`flock /tmp/minigpt-bench.lock python scripts/bench_kernels.py --threads {args.threads} "
             f"--configs {args.configs} --rounds {args.rounds} --min_time {args.min_time}"
             + (f" --match '{args.match}'" if args.match else "") + (" --bf16 0" if not args.bf16 else "")
             + f"` on {cpu_line()}, "
             f"{time.strftime('%Y-%m-%d %H:%M')}. Threads: {args.threads} for every backend. "
             "fp32 FMA peak (register-only loop on the same threads), GFLOP/s: {PEAK}."
             + (f" bf16 peak on native's {native_isa()} path ({BF16_ON.get(native_isa(), BF16_ELSE)}), "
                "GFLOP/s: {PEAK16}."
                if "native bf16" in names else ""),
             "Each entry: median over rounds of the median call time (after warm-up calls; at least 5 calls, 3 for "
             "products over 1 GFLOP); GFLOP/s = 2·L·M·N·K / t. 'best calls': the fastest call of each, less hit by noise. "
             "Attention's products run causal, as a step runs them (bmm causal=: native skips the causal matrix's "
             "zeros, numpy computes the full product and zeroes the future), with the full product's flops "
             "counted; the ', plain' rows beside them are the plain products, left out of the step's sum. Timed here "
             "one call at a time; a native step runs them fused a head at a time (mgk_attention_fwd/bwd), on the same "
             "blocks.", ""]
    step_rate = {}
    for cfg in args.configs.split(","):
        shapes = [s for s in step_shapes(**CONFIGS[cfg]) if s[0].startswith(args.match)]
        t, tmin = {b: [] for b in names}, {b: [] for b in names}
        for name, L, M, N, Kd, ta, tb, count, causal in shapes:
            runs = {b: [] for b in names}
            for _ in range(args.rounds):
                for b in names:
                    ops = backends.load(b.split()[0], threads=args.threads, verbose=False)
                    big = L * M * N * Kd > 5e8                         # config M: a few long calls suffice
                    runs[b].append(time_product(ops, L, M, N, Kd, ta, tb, args.min_time, 1 if big else 2,
                                                3 if big else 5, bf16=b.endswith("bf16"), causal=causal))
                    if b == "numpy":
                        time.sleep(0.3)        # OpenBLAS workers spin a while after a call: let them sleep first
            for b in names:
                t[b].append(float(np.median([np.median(r) for r in runs[b]])))
                tmin[b].append(float(min(r.min() for r in runs[b])))
            print(cfg, name, " ".join(f"{b} {2e-9 * L * M * N * Kd / t[b][-1]:.1f}" for b in names), flush=True)
        flops, counts = np.array([2.0 * L * M * N * Kd for _, L, M, N, Kd, *_ in shapes]), np.array([s[7] for s in shapes])
        gf = {b: flops / np.array(t[b]) / 1e9 for b in names}
        lines += [f"## Config {cfg}: {CONFIGS[cfg]}", "",
                  "| product | L x M x N x K | " + " | ".join(names) + " | " +
                  " | ".join(f"{b}/numpy" for b in names if b != "numpy") + " |",
                  "|---|---|" + "---:|" * (2 * len(names) - 1)]
        for i, (name, L, M, N, Kd, ta, tb, count, causal) in enumerate(shapes):
            lines.append(f"| {name} | {L}x{M}x{N}x{Kd} | " + " | ".join(f"{gf[b][i]:.1f}" for b in names) + " | " +
                         " | ".join(f"{gf[b][i] / gf['numpy'][i]:.2f}" for b in names if b != "numpy") + " |")
        geo = {b: float(np.exp(np.log(gf[b]).mean())) for b in names}
        best = {b: float(np.exp(np.log(flops / np.array(tmin[b]) / 1e9).mean())) for b in names}
        step = {b: float((counts * np.array(t[b])).sum() * 1e3) for b in names}
        if "native bf16" in names:
            step_rate[cfg] = float((counts * flops).sum() / (step["native bf16"] * 1e-3) / 1e9)
        lines += ["| **geometric mean** | | " + " | ".join(f"**{geo[b]:.1f}**" for b in names) + " | " +
                  " | ".join(f"**{geo[b] / geo['numpy']:.2f}**" for b in names if b != "numpy") + " |",
                  "| geometric mean of best calls | | " + " | ".join(f"{best[b]:.1f}" for b in names) + " | " +
                  " | ".join(f"{best[b] / best['numpy']:.2f}" for b in names if b != "numpy") + " |",
                  "| one step's matmuls (ms, x count) | | " + " | ".join(f"{step[b]:.1f}" for b in names) + " | " +
                  " | ".join(f"{step['numpy'] / step[b]:.2f}x faster" for b in names if b != "numpy") + " |", ""]
    after, bf16_after = peak(names, args.threads), peak(names, args.threads, bf16=True) if args.bf16 else None
    if "native bf16" in names:                    # against the larger reading of each peak: a busy moment of the
        top, top16 = max(peak_before, after), max(bf16_peak, bf16_after)    # shared host can halve one
        lines += ["native bf16 against the peaks (one step's matmul-weighted GFLOP/s: all its products' flops over "
                  "their summed median times; each peak the larger of its two readings):", "",
                  "| config | native bf16 GFLOP/s | % of fp32 peak | % of bf16 peak |",
                  "|---|---:|---:|---:|"] + [f"| {c} | {g:.1f} | {100 * g / top:.0f}% | {100 * g / top16:.0f}% |"
                                             for c, g in step_rate.items()] + [""]
    lines[2] = lines[2].replace("{PEAK}", f"{peak_before:.0f} before, {after:.0f} after the run" if after else "n/a")
    lines[2] = lines[2].replace("{PEAK16}", f"{bf16_peak:.0f} before, {bf16_after:.0f} after the run" if bf16_after
                                else "n/a")
    write_keeping_notes(args.out, "\n".join(lines), NOTES)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
