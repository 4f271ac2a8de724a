"""Muon's optimizer step with Newton-Schulz's products in float32 and in bf16 (what --dtype bf16 runs), side by
side on one backend; writes reports/muon.md.

    python scripts/bench_muon.py [--threads 2] [--configs S,M] [--rounds 5] [--backend native]

Each config's GPT (bench_train.py's configs S and M; S has the speedrun's matrices too) gets random gradients; one
Muon per precision steps it (the step changes the weights, which does not change the work). Rounds alternate the
two precisions, so noise from other work on the machine lands on both; each round gives the median of its timed
steps after warm-up steps, and the table gives the median over rounds. Newton-Schulz's GFLOP/s count
its three products a step (X X^T, A A, B X) over each stack of same-shaped matrices, as newton_schulz runs them.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import CONFIGS, MiniStep  # noqa: E402
from bench_util import command, cpu_line, revision, write_keeping_notes  # noqa: E402
from minigpt import backends  # noqa: E402
from minigpt.optim import Muon  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 3                                                       # untimed steps before each round
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def ns_gflop(opt):
    """Newton-Schulz's multiply-adds x 2 in one Muon step: per stack (L, m, n), m <= n, and per iteration,
    X X^T (m m n), A A (m m m) and B X (m m n)."""
    total = 0
    for shape, names in opt.groups.items():
        m, n = sorted(shape)
        total += opt.ns_steps * len(names) * 2 * (2 * m * m * n + m ** 3)
    return total / 1e9


def median_step(opt, params, grads, steps):
    for _ in range(WARMUP):
        opt.step(params, grads, 1e-4)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step(params, grads, 1e-4)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads of the backend")
    ap.add_argument("--configs", default="S,M", help="comma list of S, M")
    ap.add_argument("--rounds", type=int, default=5, help="rounds alternating the precisions (the median is reported)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round and precision")
    ap.add_argument("--backend", default="native", help="numpy, numba or native")
    ap.add_argument("--out", default="reports/muon.md", help="the report (its notes below the marker are kept)")
    a = ap.parse_args()
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    if any(c not in CONFIGS for c in configs):
        sys.exit(f"error: --configs takes a comma list of {', '.join(CONFIGS)}, got {a.configs!r}")
    rows = []
    for name in configs:
        c = CONFIGS[name]
        model = MiniStep(c, a.backend, a.threads).model                # loads the backend, builds the GPT
        params, grads = model.params(), model.grads()
        r = np.random.default_rng(1)
        for g in grads.values():
            g[...] = 0.01 * r.standard_normal(g.shape)
        opts = {False: Muon(params, ops=model.ops), True: Muon(params, bf16=True, ops=model.ops)}
        rounds = {False: [], True: []}
        for _ in range(a.rounds):
            for bf16, opt in opts.items():
                rounds[bf16].append(median_step(opt, params, grads, a.steps))
        t = {bf16: float(np.median(v)) for bf16, v in rounds.items()}
        gf = ns_gflop(opts[False])
        rows.append(f"| {name}: {c['n_layer']} layers, n_embd {c['n_embd']} | {gf:.2f} | "
                    + " | ".join(f"{1e3 * t[b]:.2f} [{', '.join(f'{1e3 * x:.2f}' for x in rounds[b])}]"
                                 for b in (False, True))
                    + f" | {gf / t[False]:.0f} / {gf / t[True]:.0f} | {t[False] / t[True]:.2f}x |")
        print(rows[-1], flush=True)
    label = backends.label(model.ops)
    text = "\n".join([
        "# Muon's step: Newton-Schulz's products in float32 and in bf16", "",
        f"Measured by `{command('bench_muon.py')}` at {revision(ROOT)} on {cpu_line()}; backend {label}, "
        f"{a.threads} threads; {a.rounds} round{'s' * (a.rounds != 1)} alternating the two precisions, {a.steps} "
        f"timed steps each (after {WARMUP} warm-up steps). A step is the whole Muon.step (AdamW for the embeddings "
        "and LayerNorms, momentum, Newton-Schulz, the update); bf16 is what a `--dtype bf16` run uses "
        "(minigpt/optim.py: newton_schulz).", "",
        "| config | Newton-Schulz GFLOP a step | ms a step, float32 products [per round] | ms a step, bf16 products "
        "[per round] | Newton-Schulz GFLOP/s (over the whole step), float32 / bf16 | float32 / bf16 |",
        "|---|---:|---:|---:|---:|---:|", *rows])
    out = a.out if os.path.isabs(a.out) else os.path.join(ROOT, a.out)
    write_keeping_notes(out, text, NOTES)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
