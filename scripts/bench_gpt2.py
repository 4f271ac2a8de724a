"""llm.c's CPU workload: GPT-2 124M shapes at B=4, T=64, one AdamW step, minigpt beside PyTorch; writes
reports/gpt2.md with the step times and what the fine-tune holds in memory.

    python scripts/bench_gpt2.py [--threads 2] [--steps 5] [--rounds 3] [--backend native] [--dtypes float32,bf16]

Each implementation runs in its own child process (`--child NAME --dtype DTYPE`), alternating over rounds; the
table gives the median over rounds of each child's median step after 2 warm-up steps. --dtypes float32,bf16 runs
each in both: minigpt's bf16 rounds the operands of every product to bfloat16 (training's --dtype bf16), PyTorch's
runs its forward under torch.autocast("cpu", torch.bfloat16). Weights are random (speed and memory do not depend
on them). Memory (float32 minigpt): the sum of weights, gradients, AdamW's two moments and the activation table at
(B, T) (model.py's tables), against the child's resident memory after its steps and at its peak. PyTorch is
optional. Text below the report's NOTES marker is kept when it is rewritten.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np

from bench_util import command, cpu_line, write_keeping_notes

GPT2_124M = dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True)
B, T = 4, 64
NOTES = "<!-- notes: text below this line (earlier runs, notes) is kept when the script rewrites the report -->"


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def child(name, steps, threads, backend, dtype):
    from minigpt import backends
    from minigpt.model import GPT, GPTConfig, activation_shapes, gradient_shapes
    from minigpt.optim import AdamW, clip_grad_norm
    ops = backends.load(backend, threads=threads, verbose=False)
    cfg = GPTConfig(**GPT2_124M)
    model = GPT(cfg, np.random.default_rng(0), bf16=dtype == "bf16" and name != "pytorch", ops=ops)
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
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = tm(xt, yt)[1]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
            opt.step()
    else:
        opt = AdamW(model.params(), ops=model.ops)

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
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of every implementation")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per child, after 2 warm-up steps")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every implementation (the median is reported)")
    ap.add_argument("--backend", default="native", help="minigpt's backend: native | numba | numpy")
    ap.add_argument("--dtypes", default="float32", help="comma list of float32, bf16: each implementation runs in "
                    "each (minigpt bf16: bf16 products; PyTorch bf16: its forward under autocast)")
    ap.add_argument("--out", default="reports/gpt2.md", help="the report (its notes below the marker are kept)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bf16"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.steps, a.threads, a.backend, a.dtype)
    dtypes = a.dtypes.split(",")
    if not dtypes or any(d not in ("float32", "bf16") for d in dtypes):
        sys.exit(f"--dtypes takes a comma list of float32 and bf16, got {a.dtypes!r}")
    try:
        import torch  # noqa: F401
        impls = ["minigpt", "pytorch"]
    except ImportError:
        impls = ["minigpt"]
    names = [(n, d) for d in dtypes for n in impls]
    runs = {k: [] for k in names}
    for r in range(a.rounds):
        for n, d in names:
            p = subprocess.run([sys.executable, __file__, "--child", n, "--dtype", d, "--steps", str(a.steps),
                                "--threads", str(a.threads), "--backend", a.backend], capture_output=True, text=True,
                               cwd=os.path.dirname(os.path.abspath(__file__)))
            if p.returncode:
                sys.exit(f"{n} {d} child failed:\n{p.stderr[-2000:]}")
            runs[n, d].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(n, d, f"{runs[n, d][-1]['median']:.3f} s/step", flush=True)
    med = {k: float(np.median([x["median"] for x in v])) for k, v in runs.items()}
    mem_dtype = "float32" if "float32" in dtypes else dtypes[0]       # memory: the float32 model's, if it ran
    mini = runs["minigpt", mem_dtype][-1]
    parts = mini["parts"]
    total = sum(parts.values()) / 2 ** 20
    refs = [(k, label) for k, label in ((("pytorch", "float32"), "vs PyTorch"),
                                        (("pytorch", "bf16"), "vs PyTorch bf16 autocast")) if k in med]
    lines = ["# GPT-2 124M shapes at B=4, T=64: llm.c's CPU workload", "",
             f"Command: `{command('bench_gpt2.py')}` on {cpu_line()}, {a.threads} threads, "
             f"{time.strftime('%Y-%m-%d %H:%M')}.", "",
             "One AdamW step (forward, backward, clipping, update), random weights, vocab 50257, n_layer 12, n_head "
             "12, n_embd 768. float32, and in the bf16 rows: minigpt's products on bfloat16 operands summed in "
             "float32 (--dtype bf16), PyTorch's forward under torch.autocast(\"cpu\", torch.bfloat16). Each "
             f"implementation in its own process, alternating over {a.rounds} rounds; median over rounds of each "
             f"process's median of {a.steps} steps after 2 warm-up steps.", "",
             "| implementation | s/step | per round |" + "".join(f" {label} |" for _, label in refs),
             "|---|---|---|" + "---|" * len(refs)]
    for n, d in names:
        label = f"minigpt ({a.backend})" if n == "minigpt" else "PyTorch (eager)"
        label += (" bf16 autocast" if n == "pytorch" else " bf16") if d == "bf16" else ""
        rounds = ", ".join(f"{x['median']:.3f}" for x in runs[n, d])
        lines.append(f"| {label} | {med[n, d]:.3f} | {rounds} |"
                     + "".join(f" {med[k] / med[n, d]:.2f}x |" for k, _ in refs))
    lines += ["", f"## What a 124M fine-tune holds in memory (minigpt, {mem_dtype})", "", "| part | MiB |", "|---|---|"]
    lines += [f"| {k} | {v / 2 ** 20:,.0f} |" for k, v in parts.items()]
    lines += [f"| **sum** | **{total:,.0f}** |", "",
              f"The minigpt process: resident {mini['rss']:,.0f} MiB after its steps ({mini['rss'] / total - 1:+.0%} "
              f"of the sum), peak {mini['peak']:,.0f} MiB ({mini['peak'] / total - 1:+.0%}); the rest is Python, "
              "NumPy, numba and the C library."]
    for d in dtypes:
        if ("pytorch", d) in runs:
            p = runs["pytorch", d][-1]
            lines.append(f"PyTorch's process ({'bf16 autocast' if d == 'bf16' else d}): resident {p['rss']:,.0f} MiB, "
                         f"peak {p['peak']:,.0f} MiB (it also built minigpt's model to copy the same weights).")
    write_keeping_notes(a.out, "\n".join(lines), NOTES)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
