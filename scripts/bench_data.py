"""Preparing a corpus into token shards, against Hugging Face `tokenizers`; then training on it. Writes reports/data.md.

    python scripts/bench_data.py                          # corpora of 100 MB and 1 GB in /tmp
    python scripts/bench_data.py --sizes 20 --out /tmp/data.md      # a quick look

The corpora: tiny Shakespeare repeated, a line number before every line, generated into --tmp (never the repo).
Each row runs in its own process, one after the other: scripts/prepare_data.py with a GPT-2-style tokenizer (one
worker per CPU) and with characters; `tokenizers`' encode_batch of the same text (its lines, 10 MB at a time, one
thread per CPU; only the encode_batch calls are timed) with the same tokenizer.json; then `python -m minigpt.train
--data DIR --max_iters 1` on each prepared directory: the time to its first step and its peak resident memory.
Peak memory is the process's and its workers' (wait4's ru_maxrss). --tokenizer takes GPT-2's own tokenizer.json;
without it one is trained here by `tokenizers` on the first 20 MB (GPT-2's pre-tokenizer, 50,257 tokens).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import command, cpu, cpu_line, revision, write_keeping_notes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "data", "tinyshakespeare.txt"), os.path.join(ROOT, "..", "shared", "data",
                                                                            "tinyshakespeare.txt")]
FIRST_STEP = re.compile(r"\biter\s+0\s*[/|]")                # the first step's log line: "iter     0/1 | loss ..."


def generate(path, mb):
    """Tiny Shakespeare repeated, 'N ' before every line, until mb MB; kept if already there."""
    if os.path.exists(path) and os.path.getsize(path) >= mb * 1e6:
        return
    src = next((p for p in SOURCES if os.path.exists(p)), None)
    if src is None:
        sys.exit("error: tiny Shakespeare is neither in data/ nor in ../shared/data/")
    lines = open(src, encoding="utf-8").read().splitlines(keepends=True)
    n, i = 0, 0
    with open(path + ".part", "w", encoding="utf-8") as f:
        while n < mb * 1e6:
            block = "".join(f"{i + k} {ln}" for k, ln in enumerate(lines))
            f.write(block)
            n, i = n + len(block), i + len(lines)
    os.replace(path + ".part", path)


def train_tokenizer(corpus, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    with open(corpus, encoding="utf-8") as f:
        text = f.read(20_000_000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)      # GPT-2's regex and byte map
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.splitlines(keepends=True), trainers.BpeTrainer(
        vocab_size=50257, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def run(cmd, env=None):
    """(wall s, peak RSS MB, stdout lines with the seconds they came at, return code, stderr, CPU s) of a
    command (CPU s: its and its workers' user + system time)."""
    env = dict(env or os.environ, PYTHONUNBUFFERED="1")                  # lines as they are printed
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
        lines = [(time.perf_counter() - t0, ln) for ln in p.stdout]
        _, status, usage = os.wait4(p.pid, 0)                             # ru_maxrss: it and its workers
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return (time.perf_counter() - t0, usage.ru_maxrss / 1024, lines, p.returncode, err.read(),
                usage.ru_utime + usage.ru_stime)


def child(kind, *args, env=None):
    """What `bench_data.py --child kind args...` returns, run in its own process."""
    _, _, lines, rc, err, _ = run([sys.executable, __file__, "--child", kind, *args], env)
    if rc:
        sys.exit(f"error: the {kind} child failed: {err.strip()[-800:]}")
    return json.loads(lines[-1][1])


def hf_child(corpus, tokenizer):
    """encode_batch over the corpus's lines, 10 MB at a time: {"seconds", "tokens"}."""
    from tokenizers import Tokenizer
    tok, secs, cpu_s, tokens = Tokenizer.from_file(tokenizer), 0.0, 0.0, 0
    with open(corpus, encoding="utf-8") as f:
        while True:
            lines = f.readlines(10_000_000)
            if not lines:
                break
            t0, c0 = time.perf_counter(), time.process_time()
            enc = tok.encode_batch(lines)
            secs, cpu_s = secs + time.perf_counter() - t0, cpu_s + time.process_time() - c0
            tokens += sum(len(e.ids) for e in enc)
    return {"seconds": secs, "tokens": tokens, "cpu": cpu_s / secs}


def check_ids(corpus, tokenizer, prepared):
    """The prepared train split begins with `tokenizers`' ids of the corpus's first MB (cut between words)."""
    import numpy as np
    from tokenizers import Tokenizer
    from minigpt.data import cut_point
    from minigpt.shards import open_prepared
    raw = open(corpus, "rb").read(1 << 20)
    text = raw[:cut_point(raw, "words", 0, b"<")].decode("utf-8")
    want = Tokenizer.from_file(tokenizer).encode(text).ids
    _, ds, _ = open_prepared(prepared, 8)
    return bool(np.array_equal(ds.ids("train", len(want)), want))


def train_row(d, tmp):
    """(seconds to the first step, peak RSS MB, note) of a 1-step training run on directory d."""
    out = os.path.join(tmp, "run")
    wall, rss, lines, rc, err, _ = run([sys.executable, "-m", "minigpt.train", "--data", d, "--max_iters", "1",
                                        "--out_dir", out, "--eval_iters", "1", "--log_interval", "1"])
    if rc:
        last = (err.strip().splitlines() or ["(no output)"])[-1].replace(d, "DIR")
        return None, None, f"not yet wired: `python -m minigpt.train --data DIR` said `{last[:200]}`"
    first = next((t for t, ln in lines if FIRST_STEP.search(ln)), None)
    return first, rss, "" if first is not None else f"no step-0 line seen; the whole run took {wall:.1f} s"


NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000", help="corpus sizes in MB, comma-separated")
    ap.add_argument("--tmp", default="/tmp/minigpt_bench_data", help="where corpora and shards go")
    ap.add_argument("--tokenizer", default="", help="a GPT-2 tokenizer.json (default: train one here)")
    ap.add_argument("--out", default="reports/data.md")
    ap.add_argument("--render", default="", help="rewrite the report from a run's measurements (the JSON it "
                    "saved in --tmp) without measuring again")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.render:
        return write_report(**json.load(open(a.render)), out=a.out)
    if a.child:                                   # heavy work in children: this process stays small, so its
        kind, *args = a.child                     # children's peak memory (inherited at fork) is their own
        return print(json.dumps({"hf": hf_child, "tokenizer": train_tokenizer, "check": check_ids}[kind](*args)))
    os.makedirs(a.tmp, exist_ok=True)
    sizes = [int(s) for s in a.sizes.split(",")]
    corpora = {mb: os.path.join(a.tmp, f"shakespeare_numbered_{mb}mb.txt") for mb in sizes}
    for mb, path in corpora.items():
        generate(path, mb)
    tok = a.tokenizer or os.path.join(a.tmp, "gpt2like_tokenizer.json")
    if not a.tokenizer and not os.path.exists(tok):
        child("tokenizer", corpora[min(sizes)], tok)
    n = cpu()["cpus"]
    env = dict(os.environ, RAYON_NUM_THREADS=str(n), TOKENIZERS_PARALLELISM="true")
    rows, load = [], [os.getloadavg()[0]]
    for mb, path in corpora.items():
        size, r = os.path.getsize(path), {"mb": mb}
        for kind, spec in (("gpt2", tok), ("char", "char")):
            d = os.path.join(a.tmp, f"prepared_{kind}_{mb}mb")
            shutil.rmtree(d, ignore_errors=True)                            # prepare it again, timed
            wall, rss, _, rc, err, cpu_s = run([sys.executable, "scripts/prepare_data.py", path, "--out", d,
                                                "--tokenizer", spec, "--quiet"])
            if rc:
                sys.exit(f"error: prepare_data.py failed on {path}: {err.strip()[-500:]}")
            m = json.load(open(os.path.join(d, "manifest.json")))
            r[kind] = {"mbs": size / 1e6 / m["seconds"], "rss": rss, "tokens": sum(m["tokens"].values()),
                       "seconds": m["seconds"], "cpu": cpu_s / wall, "first": train_row(d, a.tmp)}
            print(mb, kind, r[kind], flush=True)
        r["ids_equal"] = child("check", path, tok, os.path.join(a.tmp, f"prepared_gpt2_{mb}mb"))
        hf = child("hf", path, tok, env=env)
        r["hf"] = {"mbs": size / 1e6 / hf["seconds"], "tokens": hf["tokens"], "seconds": hf["seconds"],
                   "cpu": hf["cpu"]}
        print(mb, "hf", r["hf"], flush=True)
        rows.append(r)
    load.append(os.getloadavg()[0])
    import tokenizers
    run_info = {"command": command("bench_data.py"), "revision": revision(ROOT), "cpu": cpu_line(),
                "date": time.strftime("%Y-%m-%d %H:%M"), "tokenizers": tokenizers.__version__, "load": load,
                "tokenizer": a.tokenizer, "n": n, "rows": rows}
    with open(os.path.join(a.tmp, "bench_data.json"), "w") as f:           # for --render
        json.dump(run_info, f, indent=1)
    write_report(**run_info, out=a.out)


def write_report(command, revision, cpu, date, tokenizers, load, tokenizer, n, rows, out):
    """reports/data.md from one run's measurements."""

    def mem(x):
        return f"{x:,.0f} MB" if x is not None else "-"

    def first(x):
        return f"{x[0]:.1f} s / {mem(x[1])}" if x[0] is not None else "not measured"
    lo, hi = rows[0], rows[-1]
    made = (f"GPT-2's own, read from `{tokenizer}` (--tokenizer)" if tokenizer else
            "trained here by `tokenizers` on the first 20 MB of the smallest corpus (ByteLevel pre-tokenizer with "
            "GPT-2's regex, BPE, 50,257 tokens with `<|endoftext|>`): GPT-2's own tokenizer.json is not on this "
            "machine and nothing is downloaded")
    L = ["# Preparing a corpus: token shards, against Hugging Face `tokenizers`", "",
         f"Command: `{command}` at {revision}, on {cpu}, {date}; 1-minute load average {load[0]:.2f} before, "
         f"{load[1]:.2f} after.", "",
         "Corpora: tiny Shakespeare repeated with a line number before every line. The GPT-2 tokenizer: "
         f"{made}; `tokenizers` {tokenizers}. Each row ran in its own process, one after the other.", "",
         "Prepare with the GPT-2 tokenizer encoded " + ", ".join(
             f"{r['gpt2']['mbs'] / r['hf']['mbs']:.1f}x as fast as `tokenizers`' encode_batch at {r['mb']:,} MB"
             for r in rows) + f" (both on {n} CPUs). Peak resident memory from the {lo['mb']:,} MB corpus to the "
         f"{hi['mb']:,} MB one: prepare {mem(lo['gpt2']['rss'])} and {mem(hi['gpt2']['rss'])} (GPT-2), training "
         f"{mem(lo['gpt2']['first'][1])} and {mem(hi['gpt2']['first'][1])} (GPT-2 dir), "
         f"{mem(lo['char']['first'][1])} and {mem(hi['char']['first'][1])} (char dir).", "",
         f"| corpus | prepare, GPT-2 tokenizer, {n} workers | `tokenizers` encode_batch, {n} threads | prepare, "
         "characters | prepare peak RSS (GPT-2 / char) | first training step / peak RSS (GPT-2 dir) | "
         "first training step / peak RSS (char dir) |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g, c, h = r["gpt2"], r["char"], r["hf"]
        L.append(f"| {r['mb']:,} MB | {g['mbs']:.2f} MB/s ({g['seconds']:.0f} s; {g['cpu']:.2f}) | {h['mbs']:.2f} "
                 f"MB/s ({h['seconds']:.0f} s; {h['cpu']:.2f}) | {c['mbs']:.1f} MB/s ({c['seconds']:.1f} s) | "
                 f"{mem(g['rss'])} / {mem(c['rss'])} | {first(g['first'])} | {first(c['first'])} |")
    notes = sorted({x[kind]["first"][2] for x in rows for kind in ("gpt2", "char") if x[kind]["first"][2]})
    busy = [f"{r['mb']:,} MB {k} {r[k]['cpu']:.2f}" for r in rows for k in ("gpt2", "hf") if r[k]["cpu"] < 0.9 * n]
    L += ["", "MB/s is the corpus's bytes over the time: prepare's whole run as its manifest records it (scan, "
          "encoding in worker processes, shards written), `tokenizers`' encode_batch calls alone (reading the "
          "lines and gathering the ids not counted). After the seconds: CPU seconds over wall seconds (prepare: "
          "its process and workers over the whole process; `tokenizers`: its threads over the encode_batch calls), "
          f"at most {n}: lower when other jobs took turns on the CPUs (see the load averages) or, for prepare, in "
          "its serial parts (start-up, the scan)"
          + (f"; below 90% of {n} here: {', '.join(busy)}, rows that may understate the speed" if busy else "")
          + ". Tokens: " + "; ".join(
              f"{r['mb']:,} MB: prepare {r['gpt2']['tokens']:,}, `tokenizers` (lines) {r['hf']['tokens']:,}"
              for r in rows) + " (a batch of lines cuts whitespace runs at every line end, the whole text does "
          "not). minigpt's ids equal `tokenizers`' encode of the corpus's first MB: "
          + ", ".join(f"{r['mb']:,} MB {'yes' if r['ids_equal'] else 'NO'}" for r in rows) + "."]
    L += ["", "Training: `python -m minigpt.train --data DIR --max_iters 1 --eval_iters 1 --log_interval 1` (the "
          "default model and settings otherwise) on each prepared directory; the first step is the seconds from "
          "starting the command to its `iter 0` line (start-up, opening the shards, the model, one evaluation "
          "batch per split, one step); the peak resident memory is the whole run's, its final score of at most "
          "--val_tokens validation tokens included."
          + (" " + "; ".join(notes) + "." if notes else "")]
    write_keeping_notes(out if os.path.isabs(out) else os.path.join(ROOT, out), "\n".join(L), NOTES)
    print("wrote", out)


if __name__ == "__main__":
    main()
