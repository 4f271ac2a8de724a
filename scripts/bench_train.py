"""Training-step speed of every backend at configs S and M, side by side with PyTorch; writes reports/benchmarks.md.

    python scripts/bench_train.py [--threads 2] [--steps_S 30] [--steps_M 3] [--rounds 3]

One invocation, the same threads: rounds alternate the implementations, each in its own child process
(`--child NAME`), medians after warm-up. A profiled pass splits a minigpt step into matmul / attention /
LayerNorm / GELU / loss / optimizer / other (exclusive times). PyTorch is optional.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np

from minigpt import kernels as K
from minigpt import layers as L
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW, clip_grad_norm

CONFIGS = {"S": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12),
           "M": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=64)}
PEAK_GFLOPS = 270.0          # fp32 FMA peak of this machine on 2 cores (probe quoted in issue 4)


def model_flops(c, V=65):
    """Matmul FLOPs of one training step (forward + backward = 3x forward), as the issue counts them."""
    C, T, B, L_ = c["n_embd"], c["block_size"], c["batch"], c["n_layer"]
    fwd = 2 * B * T * (12 * C * C * L_ + C * V) + 4 * B * T * T * C * L_
    return 3 * fwd


# ----------------------------------------------------------------------------
# one step of each implementation

class MiniStep:
    def __init__(self, c, backend, seed=0):
        K.set_backend(backend)
        self.backend = backend
        cfg = GPTConfig(vocab_size=65, block_size=c["block_size"], n_layer=c["n_layer"], n_head=c["n_head"],
                        n_embd=c["n_embd"], bias=False)
        self.model = GPT(cfg, np.random.default_rng(seed))
        self.opt = AdamW(self.model.params())
        r = np.random.default_rng(seed)
        self.x = r.integers(0, 65, (c["batch"], c["block_size"])).astype(np.int32)
        self.y = r.integers(0, 65, (c["batch"], c["block_size"])).astype(np.int32)

    def __call__(self):
        if K.backend() != self.backend:
            K.set_backend(self.backend)
        m = self.model
        m.zero_grad()
        _, loss = m.forward(self.x, self.y)
        m.backward()
        clip_grad_norm(m.grads(), 1.0)
        self.opt.step(m.params(), m.grads(), 1e-4)
        return loss


class TorchStep:
    def __init__(self, mini, threads):
        import torch
        from minigpt.torch_twin import TorchGPT
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = TorchGPT.from_minigpt(mini.model)
        names = self.model.minigpt_names().values()
        self.opt = torch.optim.AdamW([{"params": [p for p, _ in names if p.dim() >= 2], "weight_decay": 0.1},
                                      {"params": [p for p, _ in names if p.dim() < 2], "weight_decay": 0.0}],
                                     lr=1e-4, betas=(0.9, 0.99))
        self.x, self.y = torch.from_numpy(mini.x).long(), torch.from_numpy(mini.y).long()

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        _, loss = self.model(self.x, self.y)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.item()


def time_steps(step, n, warmup=3):
    """Seconds of each of n steps after warm-up."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


# ----------------------------------------------------------------------------
# profiled pass: exclusive time per part

PARTS = {"matmul": [(L.Linear, "forward"), (L.Linear, "backward"), (GPT, "_head_forward"), (GPT, "_head_backward")],
         "attention": [(L.CausalSelfAttention, "forward"), (L.CausalSelfAttention, "backward")],
         "LayerNorm": [(L.LayerNorm, "forward"), (L.LayerNorm, "backward")],
         "GELU": [(L.GELU, "forward"), (L.GELU, "backward")],
         "loss": [(L.CrossEntropy, "forward"), (L.CrossEntropy, "backward")],
         "optimizer": [(AdamW, "step")]}


def profile(step, n):
    """Median share of each part over n steps; a stack of timers subtracts children from parents."""
    acc, stack, saved = defaultdict(float), [], []

    def wrap(part, fn):
        def inner(*a, **kw):
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*a, **kw)
            finally:
                child = stack.pop()
                dt = time.perf_counter() - t0
                acc[part] += dt - child
                if stack:
                    stack[-1] += dt
        return inner

    for part, targets in PARTS.items():
        for cls, meth in targets:
            if meth not in cls.__dict__:
                continue
            orig = cls.__dict__[meth]
            saved.append((cls, meth, orig))
            setattr(cls, meth, wrap(part, orig))
    try:
        step()
        shares = defaultdict(list)
        for _ in range(n):
            acc.clear()
            t0 = time.perf_counter()
            step()
            total = time.perf_counter() - t0
            for part in PARTS:
                shares[part].append(acc[part] / total)
            shares["other"].append(1 - sum(acc.values()) / total)
    finally:
        for cls, meth, orig in saved:
            setattr(cls, meth, orig)
    return {k: float(np.median(v)) for k, v in shares.items()}


def child(a):
    """One implementation in this process: median step time, profiled shares, peak RSS, as one JSON line."""
    c = CONFIGS[a.config]
    K.set_backend(a.child if a.child != "pytorch" else "numpy", threads=a.threads)
    mini = MiniStep(c, a.child if a.child != "pytorch" else "numpy")
    step = TorchStep(mini, a.threads) if a.child == "pytorch" else mini
    times = time_steps(step, a.steps, warmup=3 if a.config == "S" else 1)   # one M step warms every kernel
    shares = profile(mini, max(1, a.steps // 3)) if a.child != "pytorch" and a.profile else None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"median": float(np.median(times)), "shares": shares, "rss": rss}))


# ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps_S", type=int, default=30)
    ap.add_argument("--steps_M", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="S,M")
    ap.add_argument("--out", default="reports/benchmarks.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="S", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    impls = K.available()
    try:
        import torch  # noqa: F401
        impls.append("pytorch")
    except ImportError:
        pass
    results = {}
    for cfg_name in a.configs.split(","):
        c = CONFIGS[cfg_name]
        n = a.steps_S if cfg_name == "S" else a.steps_M
        runs = defaultdict(list)
        for rnd in range(a.rounds):                # rounds alternate the implementations, one process each
            for name in impls:                     # (the profiled pass, for the shares, only in the first round)
                r = subprocess.run([sys.executable, __file__, "--child", name, "--config", cfg_name, "--steps", str(n),
                                    "--threads", str(a.threads), "--profile", str(int(rnd == 0))],
                                   capture_output=True, text=True, check=True)
                runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
        tokens = c["batch"] * c["block_size"]
        rows = {}
        for name, rs in runs.items():
            med = float(np.median([r["median"] for r in rs]))
            rows[name] = {"ms": 1000 * med, "tok_s": tokens / med, "gflops": model_flops(c) / med / 1e9,
                          "share": rs[0]["shares"], "rss": max(r["rss"] for r in rs),
                          "spread": [round(1000 * r["median"], 1) for r in rs]}
            print(f"{cfg_name} {name:8s} {1000 * med:9.1f} ms/step {tokens / med:9,.0f} tok/s  rounds {rows[name]['spread']}",
                  flush=True)
        results[cfg_name] = rows
    write_report(a, results, "pytorch" in impls)


def write_report(a, results, have_torch):
    lines = ["# Training-step speed: minigpt backends vs PyTorch", "",
             f"Command: `python scripts/bench_train.py --threads {a.threads} --steps_S {a.steps_S} --steps_M {a.steps_M} "
             f"--rounds {a.rounds}` ({os.cpu_count()} cores, {a.threads} threads for every implementation). One "
             f"invocation; each round runs every implementation in its own process, one after the other (in one "
             f"process PyTorch's OpenMP threads spin and slow both sides). Each process: 3 warm-up steps (1 at M), "
             f"then the median step; the table gives the median over rounds (per-round medians in brackets). A step is "
             f"forward + backward + clip + AdamW, float32, bias off, vocab 65, same initial weights and batch. "
             f"Peak RSS is that process's maximum resident set (it imports numpy and numba; PyTorch's also imports torch).", ""]
    for cfg_name, rows in results.items():
        c = CONFIGS[cfg_name]
        lines += [f"## Config {cfg_name}: n_layer {c['n_layer']}, n_head {c['n_head']}, n_embd {c['n_embd']}, "
                  f"block {c['block_size']}, batch {c['batch']} ({model_flops(c) / 1e9:.2f} GFLOP of matmul per step)", "",
                  "| implementation | ms/step | tokens/s | vs PyTorch | GFLOP/s | % of fp32 peak | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|"]
        ref = rows.get("pytorch", {}).get("tok_s")
        for name, r in rows.items():
            ratio = f"{r['tok_s'] / ref:.2f}x" if ref else "n/a"
            lines.append(f"| {name} | {r['ms']:.1f} {r['spread']} | {r['tok_s']:,.0f} | {ratio} | {r['gflops']:.1f} | "
                         f"{100 * r['gflops'] / PEAK_GFLOPS:.0f}% | {r['rss']:.0f} |")
        parts = list(PARTS) + ["other"]
        lines += ["", "Share of a minigpt step (profiled pass, exclusive times):", "",
                  "| backend | " + " | ".join(parts) + " |", "|---" * (len(parts) + 1) + "|"]
        for name, r in rows.items():
            if r["share"]:
                lines.append(f"| {name} | " + " | ".join(f"{100 * r['share'][p]:.0f}%" for p in parts) + " |")
        lines.append("")
    if not have_torch:
        lines.append("PyTorch is not installed here (`pip install torch==2.13.0`), so there is no ratio.")
    lines.append(f"fp32 peak: {PEAK_GFLOPS:.0f} GFLOP/s on 2 cores (FMA probe, reports/kernels.md).")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
