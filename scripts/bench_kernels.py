"""Benchmark every matmul shape of one training step (configs S and M) on each backend; write reports/kernels.md.

Thin: the shapes (kernels.step_shapes) and the timer (kernels.time_product) are in the package. All backends
run in one process with the same thread count; rounds alternate the backends so that noise from other work
on the machine lands on all of them (numpy last, then a pause: idle OpenBLAS threads spin for a while and
would slow whichever backend runs next). Text after the NOTES marker in an existing report is kept.
Run:  flock /tmp/minigpt-bench.lock python scripts/bench_kernels.py --threads 2
"""
import argparse
import os
import platform
import time

import numpy as np

from minigpt import kernels as K

CONFIGS = {"S": dict(batch=12, block=64, n_embd=128, n_head=4, vocab=65, n_layer=4),
           "M": dict(batch=64, block=256, n_embd=384, n_head=6, vocab=65, n_layer=6)}
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"
p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--configs", default="S,M")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--min_time", type=float, default=0.25, help="seconds of timed calls per backend, shape and round")
p.add_argument("--out", default="reports/kernels.md")
args = p.parse_args()

backends = sorted(K.available(), key=lambda b: b == "numpy")  # numpy (= OpenBLAS via np.matmul) last in a round


def peak():                 # fp32 FMA peak of the threads now (register-only loop): low values flag a busy machine
    if "native" not in backends:
        return "n/a"
    K.set_backend("native", threads=args.threads, verbose=False)
    return f"{max(K._current().peak_gflops() for _ in range(3)):.0f}"


peak_before = peak()
lines = [f"# Kernel benchmark: GFLOP/s per matmul shape of one training step", "",
         f"`flock /tmp/minigpt-bench.lock python scripts/bench_kernels.py --threads {args.threads} "
         f"--rounds {args.rounds} --min_time {args.min_time}` on {platform.processor() or platform.machine()}, "
         f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}. Threads: {args.threads} for every backend. "
         "fp32 FMA peak (register-only loop on the same threads), GFLOP/s: {PEAK}.",
         "Each entry: median over rounds of the median call time (after warm-up calls; at least 5 calls, 3 for "
         "products over 1 GFLOP); GFLOP/s = 2·L·M·N·K / t. 'best calls': the fastest call of each, less hit by noise.", ""]
for cfg in args.configs.split(","):
    shapes = K.step_shapes(**CONFIGS[cfg])
    t, tmin = {b: [] for b in backends}, {b: [] for b in backends}
    for name, L, M, N, Kd, ta, tb, count in shapes:
        runs = {b: [] for b in backends}
        for _ in range(args.rounds):
            for b in backends:
                K.set_backend(b, threads=args.threads, verbose=False)
                big = L * M * N * Kd > 5e8                         # config M: a few calls of ~0.1 s each suffice
                runs[b].append(K.time_product(L, M, N, Kd, ta, tb, args.min_time, 1 if big else 2, 3 if big else 5))
                if b == "numpy":
                    time.sleep(0.3)        # OpenBLAS workers spin ~0.1 s after a call: let them sleep first
        for b in backends:
            t[b].append(float(np.median([np.median(r) for r in runs[b]])))
            tmin[b].append(float(min(r.min() for r in runs[b])))
        print(cfg, name, " ".join(f"{b} {2e-9 * L * M * N * Kd / t[b][-1]:.1f}" for b in backends), flush=True)
    flops, counts = np.array([2.0 * L * M * N * Kd for _, L, M, N, Kd, *_ in shapes]), np.array([s[-1] for s in shapes])
    gf = {b: flops / np.array(t[b]) / 1e9 for b in backends}
    lines += [f"## Config {cfg}: {CONFIGS[cfg]}", "",
              "| product | L x M x N x K | " + " | ".join(backends) + " | " +
              " | ".join(f"{b}/numpy" for b in backends if b != "numpy") + " |",
              "|---|---|" + "---:|" * (2 * len(backends) - 1)]
    for i, (name, L, M, N, Kd, ta, tb, count) in enumerate(shapes):
        lines.append(f"| {name} | {L}x{M}x{N}x{Kd} | " + " | ".join(f"{gf[b][i]:.1f}" for b in backends) + " | " +
                     " | ".join(f"{gf[b][i] / gf['numpy'][i]:.2f}" for b in backends if b != "numpy") + " |")
    geo = {b: float(np.exp(np.log(gf[b]).mean())) for b in backends}
    best = {b: float(np.exp(np.log(flops / np.array(tmin[b]) / 1e9).mean())) for b in backends}
    step = {b: float((counts * np.array(t[b])).sum() * 1e3) for b in backends}
    lines += [f"| **geometric mean** | | " + " | ".join(f"**{geo[b]:.1f}**" for b in backends) + " | " +
              " | ".join(f"**{geo[b] / geo['numpy']:.2f}**" for b in backends if b != "numpy") + " |",
              f"| geometric mean of best calls | | " + " | ".join(f"{best[b]:.1f}" for b in backends) + " | " +
              " | ".join(f"{best[b] / best['numpy']:.2f}" for b in backends if b != "numpy") + " |",
              f"| one step's matmuls (ms, x count) | | " + " | ".join(f"{step[b]:.1f}" for b in backends) + " | " +
              " | ".join(f"{step['numpy'] / step[b]:.2f}x faster" for b in backends if b != "numpy") + " |", ""]
lines[2] = lines[2].replace("{PEAK}", f"{peak_before} before, {peak()} after the run")
old = open(args.out).read() if os.path.exists(args.out) else ""
os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
with open(args.out, "w") as f:
    f.write("\n".join(lines) + "\n" + NOTES + (old.split(NOTES, 1)[1] if NOTES in old else "\n"))
print("wrote", args.out)
