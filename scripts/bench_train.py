"""Training-step speed of every backend at configs S and M, side by side with PyTorch; writes reports/benchmarks.md.

    python scripts/bench_train.py [--threads 2] [--steps_S 30] [--steps_M 4]

One process, the same threads: minigpt and PyTorch steps alternate, medians after warm-up. A second, profiled
pass splits a minigpt step into matmul / attention / LayerNorm / GELU / loss / optimizer / other (exclusive
times). Peak RSS is measured per implementation in a child process (`--rss NAME`). PyTorch is optional.
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


def time_alternating(steps, n, warmup=2):
    """{name: [seconds]}: warm up each, then run one step of each in turn, n rounds."""
    for f in steps.values():
        for _ in range(warmup):
            f()
    times = defaultdict(list)
    for _ in range(n):
        for name, f in steps.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
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


def peak_rss(name, cfg_name, threads, steps=3):
    """Peak RSS (MiB) of a child process that runs `steps` steps of one implementation."""
    r = subprocess.run([sys.executable, __file__, "--rss", name, "--rss_config", cfg_name, "--threads", str(threads),
                        "--rss_steps", str(steps)], capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else float("nan")


def rss_child(a):
    c = CONFIGS[a.rss_config]
    K.set_threads(a.threads)
    mini = MiniStep(c, a.rss if a.rss != "pytorch" else "numpy")
    f = TorchStep(mini, a.threads) if a.rss == "pytorch" else mini
    del_model = a.rss == "pytorch"
    if del_model:
        mini.model = mini.opt = None
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(a.rss_steps):
        f()
    print(max(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024)


# ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps_S", type=int, default=30)
    ap.add_argument("--steps_M", type=int, default=4)
    ap.add_argument("--configs", default="S,M")
    ap.add_argument("--out", default="reports/benchmarks.md")
    ap.add_argument("--rss", help=argparse.SUPPRESS)
    ap.add_argument("--rss_config", default="S", help=argparse.SUPPRESS)
    ap.add_argument("--rss_steps", type=int, default=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rss:
        return rss_child(a)
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    backends = K.available()
    results = {}
    for cfg_name in a.configs.split(","):
        c = CONFIGS[cfg_name]
        n = a.steps_S if cfg_name == "S" else a.steps_M
        steps = {b: MiniStep(c, b) for b in backends}
        for b in backends:
            K.set_backend(b, threads=a.threads)
        if have_torch:
            steps["pytorch"] = TorchStep(steps[backends[0]], a.threads)
        times = time_alternating(steps, n)
        shares = {b: profile(steps[b], max(3, n // 3)) for b in backends}
        tokens = c["batch"] * c["block_size"]
        rows = {}
        for name, ts in times.items():
            med = float(np.median(ts))
            rows[name] = {"ms": 1000 * med, "tok_s": tokens / med, "gflops": model_flops(c) / med / 1e9,
                          "share": shares.get(name), "rss": peak_rss(name, cfg_name, a.threads)}
            print(f"{cfg_name} {name:8s} {1000 * med:9.1f} ms/step {tokens / med:9,.0f} tok/s", flush=True)
        results[cfg_name] = rows
    write_report(a, results, have_torch)


def write_report(a, results, have_torch):
    lines = ["# Training-step speed: minigpt backends vs PyTorch", "",
             f"Command: `python scripts/bench_train.py --threads {a.threads} --steps_S {a.steps_S} --steps_M {a.steps_M}`"
             f" ({os.cpu_count()} cores; steps alternate between implementations in one process; medians after "
             f"2 warm-up steps; a step is forward + backward + clip + AdamW, float32, bias off, vocab 65).", ""]
    for cfg_name, rows in results.items():
        c = CONFIGS[cfg_name]
        lines += [f"## Config {cfg_name}: n_layer {c['n_layer']}, n_head {c['n_head']}, n_embd {c['n_embd']}, "
                  f"block {c['block_size']}, batch {c['batch']} ({model_flops(c) / 1e9:.2f} GFLOP of matmul per step)", "",
                  "| implementation | ms/step | tokens/s | vs PyTorch | GFLOP/s | % of fp32 peak | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|"]
        ref = rows.get("pytorch", {}).get("tok_s")
        for name, r in rows.items():
            ratio = f"{r['tok_s'] / ref:.2f}x" if ref else "n/a"
            lines.append(f"| {name} | {r['ms']:.1f} | {r['tok_s']:,.0f} | {ratio} | {r['gflops']:.1f} | "
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
    lines.append(f"fp32 peak: {PEAK_GFLOPS:.0f} GFLOP/s on 2 cores (FMA probe). Raw: `{json.dumps({k: {n: round(r['ms'], 2) for n, r in v.items()} for k, v in results.items()})}`")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
