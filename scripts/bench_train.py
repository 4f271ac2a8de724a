"""Training-step speed of every backend at configs S and M, side by side with PyTorch; writes reports/benchmarks.md.

    python scripts/bench_train.py [--threads 2] [--steps_S 30] [--steps_M 3] [--rounds 3] [--baseline OLD_TREE]
                                  [--dtypes float32,bf16] [--isas avx2,generic] [--dropout 0.2 --out FILE]

One invocation, the same threads: rounds alternate the implementations, each in its own child process
(`--child NAME`), medians after warm-up. A profiled pass splits a minigpt step into matmul / attention /
LayerNorm / GELU / loss / optimizer / other (exclusive times). PyTorch is optional.
--baseline: a checkout of an older commit (its native library built in place: `python setup.py build_ext
--inplace`); every round then also runs that tree's own children ("native@base", "native bf16@base", ...: each
dtype, on the default ISA path), so before and after are measured side by side, in the same invocation. The
child protocol (--child/--config/--steps/--threads/--profile in, one JSON line {median, shares, rss} out) must
be the same in the baseline tree's script; --dtype bf16 is passed to bf16 children only, --dropout P to every
child when P > 0. --dtypes float32,bf16 runs every implementation in both (PyTorch's bf16 is its autocast);
--isas adds native rows on lower ISA paths (MINIGPT_ISA in the child). --dropout trains every model with
dropout (reports/dropout.md is its report: --out).
"""
import argparse
import importlib.util
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np

from bench_util import cpu_line, revision, tree_env, write_keeping_notes
from minigpt import backends
from minigpt import layers as L
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW, clip_grad_norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # this tree
CONFIGS = {"S": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12),
           "M": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=64)}
BASE = "@base"
TORCH = ("pytorch", "pytorch-compile")                   # the PyTorch children: eager, and under torch.compile


def model_flops(c, V=65):
    """Matmul FLOPs of one training step (forward + backward = 3x forward), as the issue counts them."""
    C, T, B, L_ = c["n_embd"], c["block_size"], c["batch"], c["n_layer"]
    fwd = 2 * B * T * (12 * C * C * L_ + C * V) + 4 * B * T * T * C * L_
    return 3 * fwd


# ----------------------------------------------------------------------------
# one step of each implementation

class MiniStep:
    def __init__(self, c, backend, threads, seed=0, bf16=False, dropout=0.0):
        ops = backends.load(backend, threads=threads, verbose=False)
        cfg = GPTConfig(vocab_size=65, block_size=c["block_size"], n_layer=c["n_layer"], n_head=c["n_head"],
                        n_embd=c["n_embd"], bias=False, dropout=dropout)
        self.model = GPT(cfg, np.random.default_rng(seed), bf16=bf16, ops=ops)
        self.opt = AdamW(self.model.params(), ops=self.model.ops)
        r = np.random.default_rng(seed)
        self.x = r.integers(0, 65, (c["batch"], c["block_size"])).astype(np.int32)
        self.y = r.integers(0, 65, (c["batch"], c["block_size"])).astype(np.int32)

    def __call__(self):
        m = self.model
        m.zero_grad()
        _, loss = m.forward(self.x, self.y)
        m.backward()
        clip_grad_norm(m.grad_memory, 1.0)
        self.opt.step(m.params(), m.grads(), 1e-4)
        return loss


class TorchStep:
    """The same step in PyTorch (scripts/torch_twin.py); autocast: the forward under torch.autocast("cpu",
    bfloat16), as a nanoGPT user would write it (the backward follows the forward's dtypes); compile: the model
    wrapped in torch.compile, as nanoGPT's train.py does by default (the optimizer step stays eager, as there)."""

    def __init__(self, mini, threads, autocast=False, compile=False):
        import contextlib
        import torch
        from torch_twin import TorchGPT                  # scripts/torch_twin.py, a sibling module
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = TorchGPT.from_minigpt(mini.model)
        names = self.model.minigpt_names().values()
        self.forward = torch.compile(self.model) if compile else self.model
        self.opt = torch.optim.AdamW([{"params": [p for p, _ in names if p.dim() >= 2], "weight_decay": 0.1},
                                      {"params": [p for p, _ in names if p.dim() < 2], "weight_decay": 0.0}],
                                     lr=1e-4, betas=(0.9, 0.99))
        self.x, self.y = torch.from_numpy(mini.x).long(), torch.from_numpy(mini.y).long()
        self.context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        with self.context():
            _, loss = self.forward(self.x, self.y)
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
#
# A part is the layer function that does the work (minigpt/layers.py), wrapped, so the shares compare with the
# trees before (where the same work sat in layer classes): the Linears (with their bias adds) and the head are
# "matmul", the attention core (bmm, causal softmax, the head views) is "attention", and so on. GELU is fused
# into the MLP's first Linear, so it is wrapped at the backend's ops (gelu, gelu_backward) and its time comes out
# of matmul's; where a backend runs it in a product's epilogue (native's matmul_gelu, and GELU's backward in
# matmul_mul), as the residual adds in matmul_add and layernorm_backward's acc, it is in that product's part.
# "other" is what no part covers: embeddings, residual adds left to numpy, dropout, zero_grad, clip_grad_norm, glue.

PARTS = {"matmul": [(L, "linear_forward"), (L, "linear_backward"), (L, "linear_gelu_forward"),
                    (L, "linear_gelu_backward"), (GPT, "head_forward"), (GPT, "head_backward")],
         "attention": [(L, "attention_forward"), (L, "attention_backward")],
         "LayerNorm": [(L, "layernorm_forward"), (L, "layernorm_backward")],
         "GELU": [("ops", "gelu"), ("ops", "gelu_backward")],
         "loss": [(L, "crossentropy_forward"), (L, "crossentropy_backward")],
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

    impl = step.model.ops                                # the Ops object the layers' `ops.<op>` calls reach
    for part, targets in PARTS.items():
        for owner, meth in targets:
            if owner == "ops":                           # an instance attribute shadows the class's method
                saved.append((impl, meth, None))
                setattr(impl, meth, wrap(part, getattr(impl, meth)))
            else:
                saved.append((owner, meth, owner.__dict__[meth]))
                setattr(owner, meth, wrap(part, owner.__dict__[meth]))
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
        for owner, meth, orig in saved:
            if orig is None:
                delattr(owner, meth)
            else:
                setattr(owner, meth, orig)
    return {k: float(np.median(v)) for k, v in shares.items()}


def child(a):
    """One implementation in this process: median step time, profiled shares, peak RSS, as one JSON line."""
    c, bf16 = CONFIGS[a.config], a.dtype == "bf16"
    torch = a.child in TORCH
    mini = MiniStep(c, "numpy" if torch else a.child, a.threads, bf16=bf16 and not torch, dropout=a.dropout)
    step = TorchStep(mini, a.threads, autocast=bf16, compile=a.child == "pytorch-compile") if torch else mini
    warmup = (3 if a.config == "S" else 1) + (2 if a.child == "pytorch-compile" else 0)   # compiling takes 1-2 steps
    times = time_steps(step, a.steps, warmup=warmup)     # one M step warms every kernel
    shares = profile(mini, max(1, a.steps // 3)) if not torch and a.profile else None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"median": float(np.median(times)), "shares": shares, "rss": rss}))


# ----------------------------------------------------------------------------
# the parent: rounds of children, from this tree and from the baseline tree

PROBE = """import json, sys, minigpt
try:
    from minigpt import backends                       # this tree
except ImportError:                                    # a tree from before minigpt/backends
    from minigpt import kernels as backends
names, peak, bf16_peak, isa, threads = backends.available(), None, None, None, int(sys.argv[1])
if threads and "native" in names:                      # asked of this tree only
    ops = backends.load("native", threads=threads, verbose=False)
    peak = max(ops.peak_gflops() for _ in range(3))
    bf16_peak = max(ops.peak_gflops(bf16=True) for _ in range(3))
    isa = ops.lib.mgk_isa()
print(json.dumps({"minigpt": minigpt.__file__, "backends": names, "peak": peak, "bf16_peak": bf16_peak,
                  "isa": isa}))"""


def probe(tree, peak_threads=0):
    """{minigpt: the package file a child in `tree` imports, backends: the ones that load there, peak: native
    fp32 GFLOP/s on peak_threads, bf16_peak: its bf16-product GFLOP/s, isa: its MGK_ISA_* number (the three None
    when peak_threads is 0 or native does not load)}, from a child process: the parent imports neither numba nor
    torch, so it stays small (a child's ru_maxrss includes the RSS of the parent that spawned it).
    Exits if the child would not import tree's own minigpt."""
    r = subprocess.run([sys.executable, "-c", PROBE, str(int(peak_threads))], cwd=tree,
                       env=tree_env(tree), capture_output=True, text=True)
    info = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"minigpt": r.stderr.strip()}
    if r.returncode or not os.path.realpath(info["minigpt"]).startswith(os.path.realpath(tree) + os.sep):
        sys.exit(f"error: a child in {tree} imports minigpt from {info['minigpt']!r}, not from {tree}")
    return info


def run_child(tree, impl, cfg_name, steps, threads, prof, dropout):
    """impl: (backend or "pytorch", dtype, ISA path or None). A float32 child takes no --dtype, and one without
    dropout no --dropout, so a baseline tree from before those options runs too."""
    name, dtype, isa = impl
    env = {**tree_env(tree), **({"MINIGPT_ISA": isa} if isa else {})}
    r = subprocess.run([sys.executable, os.path.join(tree, "scripts", "bench_train.py"), "--child", name,
                        "--config", cfg_name, "--steps", str(steps), "--threads", str(threads),
                        "--profile", str(int(prof))] + (["--dtype", dtype] if dtype != "float32" else [])
                       + (["--dropout", str(dropout)] if dropout else []),
                       cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of every implementation")
    ap.add_argument("--steps_S", type=int, default=30, help="timed steps per process at config S")
    ap.add_argument("--steps_M", type=int, default=3, help="timed steps per process at config M")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every implementation (the median is reported)")
    ap.add_argument("--configs", default="S,M", help="comma list of S, M")
    ap.add_argument("--backends", default="", help="comma list (default: every backend that loads, and pytorch)")
    ap.add_argument("--baseline", help="an older checkout of minigpt, native library built in place")
    ap.add_argument("--dtypes", default="float32", help="comma list of float32, bf16: each implementation runs in "
                    "each (minigpt bf16: bf16 products; PyTorch bf16: its forward under autocast)")
    ap.add_argument("--skip", default="", help="comma list of CONFIG:LABEL rows to leave out (e.g. \"M:pytorch bf16 "
                    "autocast\" where it takes minutes a step); the report names them")
    ap.add_argument("--isas", default="", help="comma list of native ISA paths to run as extra rows "
                    "(\"native:avx2\", ...), set by MINIGPT_ISA in the child; the plain native row is the default path")
    ap.add_argument("--out", default="reports/benchmarks.md", help="the report (its notes below the marker are kept)")
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout probability of every model (masks drawn "
                    "every step; PyTorch's where nanoGPT puts them); a --baseline tree's children must take it too")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="S", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bf16"),
                    help="a child's dtype (--child NAME --dtype bf16); given to the parent, the same as --dtypes DTYPE")
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.dtype != "float32" and a.dtypes == "float32":
        a.dtypes = a.dtype
    trees = {"": ROOT}
    if a.baseline:
        trees[BASE] = os.path.abspath(a.baseline)
        if not os.path.isfile(os.path.join(trees[BASE], "scripts", "bench_train.py")):
            sys.exit(f"error: --baseline {a.baseline} has no scripts/bench_train.py: pass the root of a minigpt checkout")
    where = {tag: {**probe(tree, a.threads if not tag else 0), "tree": tree, "rev": revision(tree)}
             for tag, tree in trees.items()}
    for tag, w in where.items():
        print(f"{tag or 'this tree'}: {w['tree']} at {w['rev']}, children import {w['minigpt']}, "
              f"backends {w['backends']}", flush=True)
    names = a.backends.split(",") if a.backends else list(where[""]["backends"])
    if not a.backends and importlib.util.find_spec("torch"):          # found, not imported: see probe()
        names += list(TORCH)
    impls = {}                                     # label -> (backend, dtype, ISA path or None)
    for dtype in a.dtypes.split(","):
        for name in names:
            for isa in [None] + ([i for i in a.isas.split(",") if i] if name == "native" else []):
                label = name + (f":{isa}" if isa else "") + (" bf16" if dtype == "bf16" else "")
                impls[label.replace(" bf16", " bf16 autocast") if name in TORCH else label] = (name, dtype, isa)
    peak = where[""]["peak"]
    skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    results, failed = {}, {}
    for cfg_name in a.configs.split(","):
        c = CONFIGS[cfg_name]
        n = a.steps_S if cfg_name == "S" else a.steps_M
        runs = defaultdict(list)
        for rnd in range(a.rounds):                # rounds alternate the implementations, one process each,
            for name, impl in impls.items():       # a backend's before right after its after
                for tag, tree in trees.items():    # (the profiled pass, for the shares, only in the first round)
                    label = name + tag
                    if (tag and (impl[0] not in where[tag]["backends"] or impl[2] is not None
                                 or impl[0] in TORCH)) or label in failed or f"{cfg_name}:{name}" in skip:
                        continue                   # pytorch runs once (it is the same in both trees); the
                                                   # baseline, each dtype on the default path only
                    r = run_child(tree, impl, cfg_name, n, a.threads, rnd == 0, a.dropout)
                    if "error" in r:
                        failed[label] = r["error"]
                        print(f"{cfg_name} {label}: failed: {r['error']}", flush=True)
                    else:
                        runs[label].append(r)
        tokens = c["batch"] * c["block_size"]
        rows = {}
        for name, rs in runs.items():
            if name in failed:
                continue
            med = float(np.median([r["median"] for r in rs]))
            _, dtype, isa = impls[name[:-len(BASE)] if name.endswith(BASE) else name]
            rows[name] = {"ms": 1000 * med, "tok_s": tokens / med, "gflops": model_flops(c) / med / 1e9,
                          "bf16_peak": dtype == "bf16" and isa is None,   # measured against the bf16 peak
                          "torch": impls[name][0] in TORCH if name in impls else False, "dtype": dtype,
                          "share": rs[0]["shares"], "rss": max(r["rss"] for r in rs),
                          "spread": [round(1000 * r["median"], 1) for r in rs]}
            print(f"{cfg_name} {name:13s} {1000 * med:9.1f} ms/step {tokens / med:9,.0f} tok/s  "
                  f"rounds {rows[name]['spread']}", flush=True)
        results[cfg_name] = rows
    parent_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if peak:                                       # the peaks again, after the rounds: a busy moment of the
        try:                                       # shared host can halve one reading
            again = probe(ROOT, a.threads)
        except SystemExit as e:                    # keep the rounds' report: the readings before them stand
            print(f"warning: the peaks after the rounds: {e}", file=sys.stderr)
            again = {}
        for k in ("peak", "bf16_peak"):
            if where[""][k] and again.get(k):
                where[""][k + "s"] = (where[""][k], again[k])
                where[""][k] = max(where[""][k], again[k])
        peak = where[""]["peak"]
    write_report(a, results, any(n in TORCH for n in names), where, peak, failed, parent_rss)


NOTES = "<!-- notes: text below this line (other benchmarks' sections) is kept when the script rewrites the report -->"
ENV = ("MINIGPT_ISA", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def env_line():
    """The variables that choose instruction sets (native's path, OpenBLAS's kernels, PyTorch's and MKL's)."""
    return ", ".join(f"{k}={os.environ[k]}" for k in ENV if k in os.environ) or "no ISA variables set"


def write_report(a, results, have_torch, where, peak, failed, parent_rss):
    here = where[""]
    bf16_peak, isa = here.get("bf16_peak"), here.get("isa")
    lines = ["# Training-step speed: minigpt backends vs PyTorch", "",
             f"Command: `python scripts/bench_train.py {shlex.join(sys.argv[1:])}` on {cpu_line()}, "
             f"{a.threads} threads for every implementation, {time.strftime('%Y-%m-%d %H:%M')}. "
             f"This tree: {here['tree']} at {here['rev']}. Environment: {env_line()}.", "",
             "One invocation; each round runs every implementation in its own process, one after the other (in one "
             "process PyTorch's OpenMP threads spin and slow both sides). Each process: 3 warm-up steps (1 at M), "
             "then the median step; the table gives the median over rounds (per-round medians in brackets). A step is "
             "forward + backward + clip + AdamW, float32 (bf16 rows: see below), bias off, vocab 65, same initial weights "
             "and batch, " + (f"dropout {a.dropout} (fresh masks every step). " if a.dropout else "no dropout. ") +
             "Peak RSS is that process's maximum resident set (it imports numpy, numba only in the numba rows, torch in "
             "PyTorch's); "
             f"it includes the spawning parent's, {parent_rss:.0f} MiB here, so values near that say nothing."]
    if BASE in where:
        w = where[BASE]
        lines += ["", f"Baseline (`{BASE}` rows): {w['tree']} at {w['rev']}; its children run that tree's own "
                  f"scripts/bench_train.py with cwd and PYTHONPATH set to it (checked: they import `{w['minigpt']}`), "
                  "alternating with this tree's children in every round, each backend's before right after its after. "
                  f"Backends that load there: {', '.join(w['backends'])}."]
        missing = [n for n in where[""]["backends"] if n not in w["backends"]]
        if missing:
            lines.append(f"No baseline rows for {', '.join(missing)}: not loadable in the baseline tree (for native: "
                         "build its library in place, `python setup.py build_ext --inplace`).")
    for label, err in failed.items():
        lines += ["", f"`{label}` failed and is left out: {err}"]
    if a.skip:
        lines += ["", f"Left out by `--skip`: {a.skip} (see the notes below for why)."]
    lines.append("")
    for cfg_name, rows in results.items():
        c = CONFIGS[cfg_name]
        ref, ref16 = (rows.get(k, {}).get("tok_s") for k in ("pytorch", "pytorch bf16 autocast"))
        best32 = max([r["tok_s"] for r in rows.values() if r["torch"] and r["dtype"] == "float32"], default=None)
        best = max([r["tok_s"] for r in rows.values() if r["torch"]], default=None)
        lines += [f"## Config {cfg_name}: n_layer {c['n_layer']}, n_head {c['n_head']}, n_embd {c['n_embd']}, "
                  f"block {c['block_size']}, batch {c['batch']} ({model_flops(c) / 1e9:.2f} GFLOP of matmul per step)", "",
                  "| implementation | ms/step | tokens/s | vs PyTorch | " + ("vs PyTorch bf16 autocast | " if ref16 else "")
                  + "vs PyTorch's best float32 | vs PyTorch's best | GFLOP/s | % of peak | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|---|---|" + ("---|" if ref16 else "")]
        for name, r in rows.items():
            ratio = f"{r['tok_s'] / ref:.2f}x" if ref else "n/a"
            ratio16 = f" {r['tok_s'] / ref16:.2f}x |" if ref16 else ""
            ratio16 += " " + " | ".join(f"{r['tok_s'] / b:.2f}x" if b else "n/a" for b in (best32, best)) + " |"
            top = bf16_peak if r["bf16_peak"] and bf16_peak else peak
            pct = f"{100 * r['gflops'] / top:.0f}%" if top else "n/a"
            lines.append(f"| {name} | {r['ms']:.1f} {r['spread']} | {r['tok_s']:,.0f} | {ratio} |{ratio16} "
                         f"{r['gflops']:.1f} | {pct} | {r['rss']:.0f} |")
        pairs = [(n, n + BASE) for n in rows if not n.endswith(BASE) and n + BASE in rows]
        if pairs:
            lines += ["", "Before (baseline) vs after (this tree), ms/step, median over rounds [per round]:", "",
                      "| backend | before | after | speed-up (before / after) |", "|---|---|---|---|"]
            for now, old in pairs:
                lines.append(f"| {now} | {rows[old]['ms']:.1f} {rows[old]['spread']} | {rows[now]['ms']:.1f} "
                             f"{rows[now]['spread']} | {rows[old]['ms'] / rows[now]['ms']:.2f}x |")
        parts = list(PARTS) + ["other"]
        lines += ["", "Share of a minigpt step (profiled pass, exclusive times; parts as in PARTS of each tree's "
                  "script: this tree's GELU is the fused gelu ops inside Linear):", "",
                  "| backend | " + " | ".join(parts) + " |", "|---" * (len(parts) + 1) + "|"]
        for name, r in rows.items():
            if r["share"]:
                lines.append(f"| {name} | " + " | ".join(f"{100 * r['share'].get(p, 0):.0f}%" for p in parts) + " |")
        lines.append("")
    if have_torch:
        lines += ["`pytorch-compile` rows wrap the twin's model in torch.compile (its default inductor backend), as "
                  "nanoGPT's train.py does by default; the optimizer step stays eager, as there, and the process "
                  "warms up with 2 more steps, the ones that compile. \"PyTorch's best\" is the fastest PyTorch row "
                  "of the config (of all four modes; \"float32\": of eager and compiled float32).", ""]
    if not have_torch:
        lines.append("PyTorch is not in this run (not installed, or not in --backends), so there is no ratio.")
    when = lambda k: (f"the larger of {here[k + 's'][0]:.0f} before and {here[k + 's'][1]:.0f} after the rounds"
                      if k + "s" in here else "measured before the rounds")
    lines.append(f"fp32 peak: {peak:.0f} GFLOP/s on {a.threads} threads (the native library's register-only FMA "
                 f"loop, {when('peak')})." if peak else "fp32 peak: n/a (no native backend here).")
    if "bf16" in a.dtypes and bf16_peak:
        on = {3: "vdpbf16ps", 4: "AMX tiles (tdpbf16ps)"}.get(isa, "the same fp32 FMAs (no bf16 instruction on this "
                                                                  "path)")                  # MGK_ISA_* numbers
        lines += ["", f"bf16 peak: {bf16_peak:.0f} GFLOP/s on {a.threads} threads, on {on} ({when('bf16_peak')}). "
                  "A `bf16` minigpt row rounds "
                  "the operands of every product to bfloat16 and sums in float32 (docs/backends.md: bf16); `pytorch bf16 "
                  "autocast` runs the twin's forward under torch.autocast(\"cpu\", torch.bfloat16). % of peak: of this "
                  "bf16 peak for the bf16 rows on the default path (minigpt's and PyTorch's), of the fp32 peak for "
                  "the others (a forced-down path's bf16 products run on fp32 FMAs)."]
    write_keeping_notes(a.out, "\n".join(lines), NOTES)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
