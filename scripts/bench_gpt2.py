"""llm.c's CPU workload: GPT-2 124M shapes at B=4, T=64, one AdamW step, minigpt beside PyTorch; writes
reports/gpt2.md with the step times and what the fine-tune holds in memory.

    python scripts/bench_gpt2.py [--threads 2] [--steps 5] [--rounds 3] [--backend native]

Each implementation runs in its own child process (`--child NAME`), alternating over rounds; the table gives the
median over rounds of each child's median step after 2 warm-up steps. Weights are random (speed and memory do not
depend on them). Memory: the sum of weights, gradients, AdamW's two moments and the activation table at (B, T)
(model.py's tables), against the child's resident memory after its steps and at its peak. PyTorch is optional.
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np

from bench_util import command, cpu_line

GPT2_124M = dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)
B, T = 4, 64


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def child(name, steps, threads, backend):
    from minigpt import backends
    from minigpt.model import GPT, GPTConfig, activation_shapes, gradient_shapes
    from minigpt.optim import AdamW, clip_grad_norm
    backends.select(backend, threads=threads, verbose=False)
    cfg = GPTConfig(**GPT2_124M)
    model = GPT(cfg, np.random.default_rng(0))
    r = np.random.default_rng(1)
    x, y = r.integers(0, cfg.vocab_size, (B, T)), r.integers(0, cfg.vocab_size, (B, T))
    if name == "pytorch":
        import torch
        from torch_twin import TorchGPT
        torch.set_num_threads(threads)
        tm = TorchGPT.from_minigpt(model)
        del model
        opt = torch.optim.AdamW(tm.parameters(), lr=3e-5, betas=(0.9, 0.99), weight_decay=0.1)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)

        def step():
            opt.zero_grad(set_to_none=True)
            tm(xt, yt)[1].backward()
            torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
            opt.step()
    else:
        opt = AdamW(model.params())

        def step():
            model.zero_grad()
            model.forward(x, y)
            model.backward()
            clip_grad_norm(model.grad_memory, 1.0)
            opt.step(model.params(), model.grads(), 3e-5)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    out = {"median": float(np.median(times)), "rss": rss_mb(),
           "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if name != "pytorch":
        n = model.num_params()
        acts = sum(math.prod(s) for s in activation_shapes(cfg, B, T).values())
        grads = sum(math.prod(s) for s in gradient_shapes(cfg, B, T).values())
        out["parts"] = {"weights": 4 * n, "gradients": 4 * n, "AdamW moments": 8 * n,
                        "activation table": 4 * acts, "its gradients": 4 * grads}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="native")
    ap.add_argument("--out", default="reports/gpt2.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.steps, a.threads, a.backend)
    try:
        import torch  # noqa: F401
        names = ["minigpt", "pytorch"]
    except ImportError:
        names = ["minigpt"]
    runs = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names:
            p = subprocess.run([sys.executable, __file__, "--child", n, "--steps", str(a.steps), "--threads",
                                str(a.threads), "--backend", a.backend], capture_output=True, text=True,
                               cwd=os.path.dirname(os.path.abspath(__file__)))
            if p.returncode:
                sys.exit(f"{n} child failed:\n{p.stderr[-2000:]}")
            runs[n].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(n, f"{runs[n][-1]['median']:.3f} s/step", flush=True)
    med = {n: float(np.median([x["median"] for x in v])) for n, v in runs.items()}
    mini = runs["minigpt"][-1]
    parts = mini["parts"]
    total = sum(parts.values()) / 2 ** 20
    lines = ["# GPT-2 124M shapes at B=4, T=64: llm.c's CPU workload", "",
             f"Command: `{command('bench_gpt2.py')}` on {cpu_line()}, {a.threads} threads, {time.strftime('%Y-%m-%d %H:%M')}.", "",
             "One AdamW step (forward, backward, clipping, update), float32, random weights, vocab 50257, "
             f"n_layer 12, n_head 12, n_embd 768. Each implementation in its own process, alternating over "
             f"{a.rounds} rounds; median over rounds of each process's median of {a.steps} steps after 2 warm-up "
             "steps.", "", "| implementation | s/step | per round | vs PyTorch |", "|---|---|---|---|"]
    for n in names:
        rel = f"{med['pytorch'] / med[n]:.2f}x" if "pytorch" in med else "-"
        label = f"minigpt ({a.backend})" if n == "minigpt" else "PyTorch (eager)"
        rounds = ", ".join(f"{x['median']:.3f}" for x in runs[n])
        lines.append(f"| {label} | {med[n]:.3f} | {rounds} | {rel} |")
    lines += ["", "## What a 124M fine-tune holds in memory (minigpt)", "", "| part | MiB |", "|---|---|"]
    lines += [f"| {k} | {v / 2 ** 20:,.0f} |" for k, v in parts.items()]
    lines += [f"| **sum** | **{total:,.0f}** |", "",
              f"The minigpt process: resident {mini['rss']:,.0f} MiB after its steps ({mini['rss'] / total - 1:+.0%} "
              f"of the sum), peak {mini['peak']:,.0f} MiB ({mini['peak'] / total - 1:+.0%}); the rest is Python, "
              "NumPy, numba and the C library."]
    if "pytorch" in med:
        p = runs["pytorch"][-1]
        lines.append(f"PyTorch's process: resident {p['rss']:,.0f} MiB, peak {p['peak']:,.0f} MiB (it also built "
                     "minigpt's model to copy the same weights).")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
