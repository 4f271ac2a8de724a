"""Data parallel on this machine: tokens/s of 1 process x 2 threads against 2 ranks x 1 thread (mpiexec), at the
same global batch, for configs S and M; the Allreduce's time for each config's gradient; and, on paper, the
scaling to 8 and 64 machines. Writes reports/distributed.md.

    python scripts/bench_distributed.py                    # the full report
    python scripts/bench_distributed.py --rounds 1 --steps_S 60 --steps_M 3 --out /tmp/d.md   # a quick look

Every arrangement is one train_shakespeare.py run (its log.jsonl has each step's ms); the rounds alternate the
arrangements so that a change in the machine's load touches all of them alike. Needs mpi4py and mpiexec
(pip install -e ".[mpi]").
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import command, cpu_line, revision  # noqa: E402
from minigpt.distributed import find_mpiexec  # noqa: E402
from minigpt.outdir import OutDir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"S": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12),       # batch: the global one
           "M": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=64)}
ARRANGEMENTS = {"1 process x 2 threads": (1, 2), "2 ranks x 1 thread": (2, 1),
                "1 process x 1 thread, half the batch": (1, 1)}   # one rank's share of the work, alone
LINKS_GBIT = (10, 25, 100)
LATENCY_S = 20e-6                  # per message of the ring (TCP over Ethernet, one hop): an assumption


def n_params(c, V=65):
    C, L = c["n_embd"], c["n_layer"]
    return V * C + c["block_size"] * C + L * (12 * C * C + 2 * C) + C       # tied head, no biases


def train_run(c, ranks, threads, steps, backend, data, tmp):
    """Median ms per step (the first steps, which warm up, left out) of one train_shakespeare.py run."""
    batch = c["batch"] // 2 if (ranks, threads) != (1, 2) else c["batch"]
    out = tempfile.mkdtemp(dir=tmp)
    args = [sys.executable, "scripts/train_shakespeare.py", "--data", data, "--out_dir", out,
            *(f"--{k}={v}" for k, v in c.items() if k != "batch"), f"--batch_size={batch}",
            f"--max_iters={steps}", f"--eval_interval={10 ** 6}", "--eval_iters=1", "--sample_chars=0", "--plot=",
            f"--backend={backend}", f"--threads={threads}", f"--log_interval={10 ** 6}"]
    cmd = [find_mpiexec(), "-n", str(ranks), *args] if ranks > 1 else args
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    with open(OutDir(out).log) as f:
        ms = [r["ms"] for r in map(json.loads, f) if r["kind"] == "train"]
    skip = 5 if steps > 20 else 1
    return float(np.median(ms[skip:]))


def exactness(backend, data, tmp, iters=200):
    """Config S for `iters` steps as 1 process x --batch_size 12 and as 2 ranks x 6: the largest difference of
    a step's loss, and both val losses at the end."""
    logs = {}
    for ranks, batch in ((1, 12), (2, 6)):
        out = tempfile.mkdtemp(dir=tmp)
        args = [sys.executable, "scripts/train_shakespeare.py", "--data", data, "--out_dir", out,
                f"--batch_size={batch}", f"--max_iters={iters}", "--eval_interval=100", "--sample_chars=0",
                "--plot=", f"--backend={backend}", "--threads=1"]
        subprocess.run([find_mpiexec(), "-n", "2", *args] if ranks > 1 else args, cwd=ROOT, check=True,
                       capture_output=True)
        with open(OutDir(out).log) as f:
            logs[ranks] = [json.loads(line) for line in f]
    loss = {n: np.array([r["loss"] for r in log if r["kind"] == "train"]) for n, log in logs.items()}
    val = {n: [r["val_loss"] for r in log if r["kind"] == "eval"][-1] for n, log in logs.items()}
    return float(np.max(np.abs(loss[1] - loss[2]))), val[1], val[2]


def allreduce_child(sizes, reps):
    """Under mpiexec: the median seconds of an in-place float32 Allreduce of each size, printed by rank 0."""
    from mpi4py import MPI
    comm, out = MPI.COMM_WORLD, {}
    for n in sizes:
        buf = np.ones(n, np.float32)
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
        out[n] = float(np.median(times))
    if comm.rank == 0:
        print(json.dumps(out))


def ring_seconds(nbytes, n, gbit, latency=LATENCY_S):
    """Ring allreduce: 2(n-1) messages in sequence, each moving nbytes/n over one link."""
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / (gbit * 1e9 / 8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="times each arrangement runs (alternating)")
    ap.add_argument("--steps_S", type=int, default=300, help="steps per run of config S")
    ap.add_argument("--steps_M", type=int, default=6, help="steps per run of config M")
    ap.add_argument("--backend", default="native", help="the backend of every run")
    ap.add_argument("--data", default="data/tinyshakespeare.txt")
    ap.add_argument("--out", default="reports/distributed.md")
    ap.add_argument("--allreduce-child", dest="child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return allreduce_child([int(n) for n in a.child.split(",")], reps=30)
    if find_mpiexec() is None:
        sys.exit("error: no mpiexec; pip install -e \".[mpi]\" installs mpi4py and MPICH")

    sizes = {name: n_params(c) + 2 for name, c in CONFIGS.items()}           # + the loss and the stop flag
    r = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, __file__, "--allreduce-child",
                        ",".join(str(n) for n in sizes.values())], cwd=ROOT, check=True, capture_output=True, text=True)
    allreduce = {name: json.loads(r.stdout)[str(n)] for name, n in sizes.items()}

    results = {name: {arr: [] for arr in ARRANGEMENTS} for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        exact = exactness(a.backend, a.data, tmp)
        print(f"exactness: max |loss difference| {exact[0]:.2e}, val {exact[1]:.4f} / {exact[2]:.4f}", flush=True)
        for rnd in range(a.rounds):
            for name, c in CONFIGS.items():
                steps = a.steps_S if name == "S" else a.steps_M
                for arr, (ranks, threads) in ARRANGEMENTS.items():
                    ms = train_run(c, ranks, threads, steps, a.backend, a.data, tmp)
                    results[name][arr].append(ms)
                    print(f"round {rnd}: {name} {arr}: {ms:.1f} ms/step", flush=True)
    write_report(a, results, sizes, allreduce, exact)


def write_report(a, results, sizes, allreduce, exact):
    cmd = command("bench_distributed.py")
    L = ["# Data-parallel training on MPI", "",
         f"Measured by `{cmd}` at {revision(ROOT)}, on {cpu_line()}; backend `{a.backend}`, MPICH from PyPI.",
         f"Medians over {a.rounds} runs of each arrangement, alternating (S: {a.steps_S} steps per run, M: "
         f"{a.steps_M}, the first steps left out). The global batch is the same in the first two arrangements "
         "(S: 12 sequences, M: 64): 2 ranks x --batch_size B take the same steps as 1 process x --batch_size 2B.",
         "", "## The same steps", "",
         "Config S, 200 steps, as `python scripts/train_shakespeare.py --batch_size 12 --max_iters 200` and as "
         "`mpiexec -n 2 python scripts/train_shakespeare.py --batch_size 6 --max_iters 200` (both --threads 1): the "
         f"largest difference between the two runs' loss at any step is {exact[0]:.1e} (float32 sums taken in "
         f"another order), and the val loss at iteration 200 is {exact[1]:.4f} in one process and {exact[2]:.4f} on "
         "2 ranks.", "", "## Tokens per second on this machine (2 cores)", "",
         "| config | arrangement | ms/step | tokens/s | vs 1 process x 2 threads |", "|---|---|---:|---:|---:|"]
    for name, c in CONFIGS.items():
        base = np.median(results[name]["1 process x 2 threads"])
        for arr, runs in results[name].items():
            ms = float(np.median(runs))
            tokens = c["batch"] * c["block_size"] // (1 if arr != "1 process x 1 thread, half the batch" else 2)
            L.append(f"| {name} | {arr} | {ms:.1f} | {tokens / ms * 1000:,.0f} | "
                     f"{'' if arr.endswith('batch') else f'{base / ms:.2f}x'} |")
    L += ["", "The third row of each config is one rank's share of the step (half the batch, one thread) run alone: "
          "the step of 2 ranks minus it is what data parallelism costs here (the Allreduce, waiting for the slower "
          "rank, the second Python process).", "",
          "Overlapping the Allreduce with the backward (buckets sent as the last blocks finish) is not built: the "
          "Allreduce below is " + ", ".join(f"{100 * allreduce[n] / (np.median(results[n]['2 ranks x 1 thread']) / 1000):.1f}%"
                                           f" of a step of {n}" for n in CONFIGS) +
          " on 2 ranks here, and with every core computing there is no idle one to move the bytes meanwhile. "
          "Across machines it is worth doing where t_ar below approaches t_c.", "",
          "## Bytes allreduced per step", "",
          "Per step (not per micro-batch) the ranks sum their gradients in one Allreduce of one float32 buffer, "
          "then, in a second one, two numbers (the loss and whether a rank got a signal). The table times one "
          "buffer of the gradients plus two slots: the second call's own latency (a few microseconds on one "
          "machine) is not in it.", "",
          "| config | parameters | bytes per step | Allreduce on 2 local ranks (shared memory) |", "|---|---:|---:|---:|"]
    for name in CONFIGS:
        L.append(f"| {name} | {sizes[name] - 2:,} | {4 * sizes[name]:,} ({4 * sizes[name] / 2 ** 20:.1f} MiB) | "
                 f"{1000 * allreduce[name]:.2f} ms |")
    L += ["", "## Scaling to 8 and 64 machines, on paper", "",
          "Each machine runs one rank with this machine's per-rank step (S: batch 6 per rank, M: 32; the "
          "'1 process x 1 thread, half the batch' rows above, t_c) and the ranks sum gradients with a ring "
          "Allreduce, whose time for n ranks, b bytes, link bandwidth β (bytes/s) and per-message latency α is",
          "", "    t_ar(n) = 2 (n-1) α + 2 (n-1)/n · b / β", "",
          f"(reduce-scatter then allgather, each n-1 messages of b/n bytes). α = {LATENCY_S * 1e6:.0f} µs is an "
          "assumption (TCP over Ethernet). minigpt does not overlap the Allreduce with the backward, so a step takes "
          "t_c + t_ar and n machines give a speedup of n · t_c / (t_c + t_ar) over one at the same per-rank batch "
          "(the global batch grows with n).", "",
          "| config | link | t_ar, 8 machines | speedup, 8 | t_ar, 64 machines | speedup, 64 |",
          "|---|---|---:|---:|---:|---:|"]
    for name in CONFIGS:
        tc = np.median(results[name]["1 process x 1 thread, half the batch"]) / 1000
        nbytes = 4 * sizes[name]
        for g in LINKS_GBIT:
            t8, t64 = ring_seconds(nbytes, 8, g), ring_seconds(nbytes, 64, g)
            L.append(f"| {name} (t_c {1000 * tc:.0f} ms) | {g} Gb/s | {1000 * t8:.2f} ms | {8 * tc / (tc + t8):.1f}x | "
                     f"{1000 * t64:.2f} ms | {64 * tc / (tc + t64):.1f}x |")
    with open(os.path.join(ROOT, a.out) if not os.path.isabs(a.out) else a.out, "w") as f:
        f.write("\n".join(L) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
