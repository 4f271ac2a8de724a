"""Does bf16 learn as well as float32? Trains each recipe in float32 and in bf16 from the same seed and compares
the whole-split validation loss at the end; writes reports/bf16.md.

    python scripts/bf16_learning.py [--seeds 1337] [--bisect 1337] [--backend native] [--work_dir /tmp/minigpt-bf16]

Recipes: config S as `scripts/train_shakespeare.py` runs it by default (2000 iterations), and the speedrun's two
recipes, round 1 (Muon, batch 32) and round 3 (+ the embeddings' lr x 10; the preset until round 4), over a fixed
1219 iterations (what round 1 reached in nanoGPT's wall time in one speedrun invocation, reports/speedrun.md): a
fixed count, not a time budget, so that both dtypes take the same steps on any CPU and only the precision
differs. A run whose work_dir already holds a finished log is read, not trained again.

--bisect SEEDS looks for where round 3's gap comes from: for each of those seeds, bf16 runs that keep one
group of products in float32, grouped by layer (the tied head, attention's two products, the blocks' Linears;
each forward and backward) and by role (the forward's products, the weight gradients', the input gradients'),
and a float32 control that sums in another order (the native library's portable C path, MINIGPT_ISA=generic),
which shows how far two float32 runs of the same math drift apart by rounding alone.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import command, cpu_line, revision, write_keeping_notes  # noqa: E402
from minigpt import backends, layers, model  # noqa: E402
from minigpt.outdir import OutDir  # noqa: E402
from minigpt.backends import native  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXED = ["--max_iters", "1219", "--lr_decay_iters", "1219"]
ROUND1 = ["--optimizer", "muon", "--batch_size", "32"]
RECIPES = {"config S, 2000 iterations": ("S", []),                    # name: (out_dir prefix, settings)
           "speedrun round 1 (Muon, batch 32), 1219 iterations": ("R", ROUND1 + FIXED),
           "speedrun round 3 (+ embedding lr x 10), 1219 iterations": (
               "R3", ROUND1 + ["--embed_lr_ratio", "10"] + FIXED)}
BISECTED = "speedrun round 3 (+ embedding lr x 10), 1219 iterations"
# --bisect: two ways to split a bf16 step's products into groups, each group kept float32 in one run
LAYERS = {  # group: (owner, the functions that run its products, what they are)
    "head": (model.GPT, ("head_forward", "head_backward"), "the tied head's lnf wte^T"),
    "attention": (layers, ("attention_forward", "attention_backward"), "attention's q k^T and att v"),
    "linears": (layers, ("linear_forward", "linear_backward", "linear_gelu_forward", "linear_gelu_backward",
                         "linear_relu2_forward"), "the blocks' c_attn, attn.c_proj, c_fc and mlp.c_proj")}
ROLES = {"forward": "the forward's products",
         "weight-gradients": "the backward's products into a weight's gradient (those that accumulate: dW += x^T dy)",
         "input-gradients": "the backward's other products (dx = dy W^T, and attention's dq, dk, dv, datt)"}
GROUPS = [*LAYERS, *ROLES]
TOLERANCE = 0.01
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def final(log):
    """(whole-split val loss, iterations, seconds, [training loss of each step]) of a finished run's log.jsonl,
    or None."""
    if not os.path.exists(log):
        return None
    rows = [json.loads(line) for line in open(log)]
    ends = [r for r in rows if r.get("kind") == "eval" and "val_loss_full" in r]
    steps = [r for r in rows if r.get("kind") == "train"]
    return (ends[-1]["val_loss_full"], ends[-1]["iter"], steps[-1]["elapsed"], [r["loss"] for r in steps]
            ) if ends and steps else None


def late(run, base):
    """run's training loss minus base's, averaged over the last quarter of the steps. Runs from one seed draw the
    same batches, so this paired mean over hundreds of steps is far steadier than the one val loss at the end."""
    a, b = np.array(run[3]), np.array(base[3])
    q = len(b) // 4
    return float(np.mean(a[-q:] - b[-q:]))


_now = {"layer": None, "backward": False}                 # what runs now: set by keep_float32's wrappers


def keep_float32(*groups):
    """Within a bf16 model, run the products of the given GROUPS in float32: the functions of LAYERS and
    GPT.backward note what runs, and Ops.matmul/bmm take float32 operands when it is a kept group's. Native's
    fused attention and products with an epilogue (GELU, multiply, residual add) are replaced by Ops'
    compositions, whose products go through Ops.bmm and Ops.matmul."""
    def noting(owner, name, key, value):
        def run_noted(*a, _fn=getattr(owner, name), **k):
            before, _now[key] = _now[key], value
            try:
                return _fn(*a, **k)
            finally:
                _now[key] = before
        setattr(owner, name, run_noted)
    for layer, (owner, names, _) in LAYERS.items():
        for name in names:
            noting(owner, name, "layer", layer)
    noting(model.GPT, "backward", "backward", True)
    kept = set(groups)

    def product(name):
        def in_kept_precision(self, a, b, ta=False, tb=False, out=None, acc=False, bf16=None,
                              _fn=getattr(backends.Ops, name), **causal):
            role = ("weight-gradients" if acc else "input-gradients") if _now["backward"] else "forward"
            if bf16 is None and (_now["layer"] in kept or role in kept):
                bf16 = False
            return _fn(self, a, b, ta, tb, out, acc, bf16, **causal)
        setattr(backends.Ops, name, in_kept_precision)
    product("matmul")
    product("bmm")
    for name in ("attention", "attention_backward", "_matmul_gelu", "_matmul_mul", "_matmul_add"):   # native's
        # fused ops run their products in C, past Ops.bmm and Ops.matmul: the compositions run them here
        setattr(native.NativeOps, name, getattr(backends.Ops, name))


def run(out_dir, flags, args, read, keep=None, env=None):
    """Train one run into out_dir, or read it if it finished there before (its out_dir is then added to read).
    keep: a group of GROUPS kept float32 (the run goes through this script's --child); env: added to the run's."""
    got = final(OutDir(out_dir).log)
    if got is not None:
        read.append(os.path.basename(out_dir))
    else:
        train = [os.path.join(ROOT, "scripts", "train_shakespeare.py")] if keep is None else [
            os.path.abspath(__file__), "--child", keep]
        cmd = [sys.executable, *train, "--out_dir", out_dir,
               "--backend", args.backend, "--threads", str(args.threads), "--report", "false", "--plot", "",
               "--sample_chars", "0"] + (["--data", args.data] if args.data else []) + flags
        print(" ".join(f"{k}={v}" for k, v in (env or {}).items()), " ".join(cmd), flush=True)
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})}).returncode:
            sys.exit(f"error: the run in {out_dir} failed (its message is above)")
        got = final(OutDir(out_dir).log)
    print(f"{out_dir}: whole-split val {got[0]:.4f} at iter {got[1]}", flush=True)
    return got


def bisect(args, seeds, results, read):
    """The --bisect table's lines: round 3 per seed in bf16, bf16 with each group float32, float32, and (native
    backend) the float32 control summed in another order."""
    tag, flags = RECIPES[BISECTED]
    cols = [("bf16", None, None)] + [(f"bf16, {g} float32", g, None) for g in GROUPS] + [
        ("float32", None, None)] + ([("float32, portable C sums", "control", {"MINIGPT_ISA": "generic"})]
                                     if args.backend == "native" else [])   # the same sums on the others
    lines = ["", f"## Bisecting {BISECTED}", "",
             "Whole-split val of bf16 runs that keep one group of products in float32, "
             "beside full bf16 and float32" + (", and a float32 control run on the native library's portable C "
                                               "path (`MINIGPT_ISA=generic`): the same math with its float32 sums "
                                               "rounded in another order." if args.backend == "native" else "."),
             "",
             "| seed | " + " | ".join(c[0] for c in cols) + " |", "|---:|" + "---:|" * len(cols)]
    gaps = {c[0]: [] for c in cols}
    for seed in seeds:
        base = results[BISECTED, seed, "float32"]
        row = []
        for label, keep, env in cols:
            if label in ("bf16", "float32"):
                got = results[BISECTED, seed, label]
            else:
                out_dir = os.path.join(args.work_dir, f"{tag}_{keep}" + (f"_{seed}" if seed != 1337 else ""))
                dtype = "float32" if env else "bf16"
                got = run(out_dir, flags + ["--dtype", dtype, "--seed", str(seed)], args, read,
                          keep=None if env else keep, env=env)
            gaps[label].append((got[0] - base[0], late(got, base)))
            row.append(f"{got[0]:.4f} ({got[0] - base[0]:+.4f}; {late(got, base):+.4f})")
        lines.append(f"| {seed} | " + " | ".join(row) + " |")
    if len(seeds) > 1:
        lines.append("| mean | " + " | ".join("({:+.4f}; {:+.4f})".format(*np.mean(gaps[c[0]], axis=0))
                                              for c in cols) + " |")
    lines += ["", "In brackets: minus float32 of the same seed, at the end (whole-split val) and over the last "
              "quarter of the steps (training loss, paired: the same batches). Two splits of the same products: by "
              "layer, each group forward and backward, "
              + "; ".join(f"{g}: {what}" for g, (*_, what) in LAYERS.items()) + "; and by role, " + "; ".join(f"{g}: {what}" for g, what in ROLES.items()) + "."]
    return lines


def main():
    if sys.argv[1:2] == ["--child"]:                                  # one run of --bisect: a group kept float32
        keep_float32(sys.argv[2])
        import train_shakespeare
        sys.exit(train_shakespeare.main(sys.argv[3:]))
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--seeds", default="1337", help="comma list")
    ap.add_argument("--backend", default="native")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="", help="the text (default: the training script's tiny Shakespeare)")
    ap.add_argument("--work_dir", default="/tmp/minigpt-bf16", help="out_dirs of the runs (kept: a rerun reads them)")
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "bf16.md"))
    ap.add_argument("--bisect", default="", metavar="SEEDS", help="comma list of --seeds whose round-3 gap is "
                    "bisected by groups of products "
                    f"({', '.join(GROUPS)}), with --backend native also a float32 control run on the portable C "
                    "path (its sums in another order)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    bisected_seeds = [int(s) for s in args.bisect.split(",")] if args.bisect else []
    if not set(bisected_seeds) <= set(seeds):
        ap.error(f"--bisect {args.bisect}: each seed it bisects must be among --seeds {args.seeds}")
    results, read = {}, []
    for name, (tag, flags) in RECIPES.items():
        for seed in seeds:
            for dtype in ("float32", "bf16"):
                out_dir = os.path.join(args.work_dir, f"{tag}_{dtype}" + (f"_{seed}" if seed != 1337 else ""))
                results[name, seed, dtype] = run(out_dir, flags + ["--dtype", dtype, "--seed", str(seed)], args, read)
    bisected = bisect(args, bisected_seeds, results, read) if bisected_seeds else []
    lines = ["# bf16 against float32: the same runs, the same seeds", "",
             f"Measured by `{command('bf16_learning.py')}` at {revision(ROOT)} on {cpu_line()}, "
             f"{time.strftime('%Y-%m-%d')}. Each pair trains "
             "from the same seed (the same initial weights and batches), once with float32 products and once with "
             "`--dtype bf16`; the score is the loss over the whole validation split at the end (each of its "
             "targets once)."
             + (f" Read from an earlier invocation's finished runs in {args.work_dir} (trained by an earlier invocation "
                f"of this script on this machine; git log names the revision of that report): {', '.join(read)}." if read else ""), "",
             "| recipe | seed | float32 | bf16 | bf16 - float32 | training loss over the last quarter: "
             "bf16 - float32 |", "|---|---:|---:|---:|---:|---:|"]
    for name in RECIPES:
        deltas = []
        for seed in seeds:
            f32, b16 = results[name, seed, "float32"], results[name, seed, "bf16"]
            deltas.append((b16[0] - f32[0], late(b16, f32)))
            lines.append(f"| {name} | {seed} | {f32[0]:.4f} | {b16[0]:.4f} | {b16[0] - f32[0]:+.4f} | "
                         f"{late(b16, f32):+.4f} |")
        if len(seeds) > 1:
            lines.append("| {} | mean | | | {:+.4f} | {:+.4f} |".format(name, *np.mean(deltas, axis=0)))
    worst = max(abs(results[n, s, "bf16"][0] - results[n, s, "float32"][0]) for n in RECIPES for s in seeds)
    worst_late = max(abs(late(results[n, s, "bf16"], results[n, s, "float32"])) for n in RECIPES for s in seeds)
    lines += ["", f"The largest gap at the end is {worst:.4f} ({'within' if worst <= TOLERANCE else 'outside'} the "
              f"{TOLERANCE} the project asks of bf16); over the last quarter of the steps, where both runs of a "
              f"pair train on the same batches, the training losses differ by at most {worst_late:.4f} on "
              "average. bf16 here rounds the operands of every product (docs/backends.md: bf16); the "
              "weights, gradients, optimizer state, LayerNorm, softmax, loss and residual stream stay float32, so "
              "the runs differ only by those roundings, and two float32 runs from different seeds differ by more "
              "(reports/speedrun.md: a standard deviation of 0.004-0.013 over seeds)."] + bisected
    write_keeping_notes(args.out, "\n".join(lines), NOTES)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
