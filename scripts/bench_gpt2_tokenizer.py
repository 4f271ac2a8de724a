"""GPT-2 tokenizer encoding speed: minigpt's GPT2Tokenizer beside Hugging Face `tokenizers` on the same
tokenizer.json; writes reports/gpt2_tokenizer.md.

    python scripts/bench_gpt2_tokenizer.py --data ../shared/data/tinyshakespeare.txt [--vocab 50257] [--rounds 5]

No network: the tokenizer.json is trained here by `tokenizers` (GPT-2's ByteLevel pre-tokenizer, a BPE trained on
the text up to --vocab, or as far as the text allows), as tests/test_gpt2_tokenizer.py builds its own. In each
round every implementation runs in its own process (`--child NAME`), one after the other: minigpt (pure Python,
one thread), `tokenizers` under RAYON_NUM_THREADS=1, and `tokenizers` with every CPU. A process loads a fresh
tokenizer for each timing (its word cache starts empty; the load is not timed) and encodes the whole text as one
string; `tokenizers` also encodes it as a batch of lines (`encode_batch`, the call that spreads over threads).
The figure is the median over rounds. minigpt's ids on the whole text must equal `tokenizers`' (the script stops
if not), and `tokenizers` must give the same ids on one thread and on many.
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
from bench_util import command, cpu, cpu_line, revision  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_tokenizer(text, vocab, directory):
    """A GPT-2-style tokenizer.json in `directory`, trained by `tokenizers` on text; -> its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)      # GPT-2's regex and byte map
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.save(os.path.join(directory, "tokenizer.json"))
    return tok.get_vocab_size()


def threads_now():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def child(name, directory, data):
    """Times one encoding of each input; saves the ids in directory; prints a JSON row: the wall seconds of each
    input, and the process's CPU seconds over them (all its threads)."""
    with open(data, encoding="utf-8") as f:
        text = f.read()
    times, cpu_s, out = {}, {}, {}

    def timed(mode, fresh, encode):
        """encode(fresh()) -> its result; times the encode only (fresh() loads a tokenizer with an empty cache)."""
        tok = fresh()
        t0, c0 = time.perf_counter(), time.process_time()
        r = encode(tok)
        times[mode], cpu_s[mode] = time.perf_counter() - t0, time.process_time() - c0
        return r

    if name == "minigpt":
        from minigpt.gpt2_tokenizer import GPT2Tokenizer, gpt2_pattern
        t0 = time.perf_counter()
        gpt2_pattern()                                # its regex, built once per process (lru_cache)
        out["pattern_s"] = time.perf_counter() - t0
        load = lambda: GPT2Tokenizer.from_pretrained(directory)  # noqa: E731
        ids = timed("whole", load, lambda tok: tok.encode(text))
        # one non-ASCII letter at the end: the whole text goes through the full regex
        ids_e = timed("non-ASCII", load, lambda tok: tok.encode(text + "\u00e9"))
        out["non_ascii_same_prefix"] = bool(np.array_equal(ids_e[:len(ids)], ids))
        np.save(os.path.join(directory, f"ids_{name}.npy"), ids.astype(np.int32))
    else:
        from tokenizers import Tokenizer
        lines = text.splitlines(keepends=True)
        load = lambda: Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))  # noqa: E731
        # the ByteLevel split alone, returned as a Python list of (piece, span)
        timed("pre-tokenizer", load, lambda tok: tok.pre_tokenizer.pre_tokenize_str(text))
        ids = timed("whole", load, lambda tok: tok.encode(text).ids)
        batch = timed("lines", load, lambda tok: tok.encode_batch(lines))
        tag = f"hf{os.environ['RAYON_NUM_THREADS']}"
        np.save(os.path.join(directory, f"ids_{tag}.npy"), np.asarray(ids, np.int32))
        np.save(os.path.join(directory, f"ids_{tag}_lines.npy"),
                np.asarray([i for e in batch for i in e.ids], np.int32))
        out["threads_seen"] = threads_now()           # the process's threads after encode_batch
    out["times"], out["cpu_s"] = times, cpu_s
    print(json.dumps(out))


def run_child(name, directory, data, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, "--dir", directory, "--data",
                        data], capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"error: the {name} child failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def first_difference(a, b):
    n = min(len(a), len(b))
    k = int(np.argmax(a[:n] != b[:n])) if n and (a[:n] != b[:n]).any() else n
    return f"lengths {len(a)} and {len(b)}, first difference at token {k}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/tinyshakespeare.txt")
    ap.add_argument("--vocab", type=int, default=50257, help="the BPE's target vocabulary (GPT-2's by default)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each runs every implementation once")
    ap.add_argument("--out", default="reports/gpt2_tokenizer.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.dir, a.data)
    if not os.path.exists(a.data):
        sys.exit(f"error: {a.data} is missing; pass --data (tiny Shakespeare: scripts/train_shakespeare.py "
                 "downloads it to data/)")
    with open(a.data, encoding="utf-8") as f:
        text = f.read()
    n_bytes, n_cpus = len(text.encode("utf-8")), cpu()["cpus"]
    load = [os.getloadavg()[0]]                       # other jobs on the machine, before and after
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        vocab = train_tokenizer(text, a.vocab, d)
        train_s = time.perf_counter() - t0
        plan = [("minigpt", "minigpt", 1), ("tokenizers 1", "hf", 1)]
        plan += [(f"tokenizers {n_cpus}", "hf", n_cpus)] if n_cpus > 1 else []
        runs = {}                                     # name -> the last round's row, times and cpu_s over rounds
        for _ in range(a.rounds):
            for name, kind, threads in plan:
                row = run_child(kind, d, a.data, threads)
                run = runs.setdefault(name, {"times": {}, "cpu_s": {}})
                for key in ("times", "cpu_s"):
                    for mode, t in row.pop(key).items():
                        run[key].setdefault(mode, []).append(t)
                run.update(row)
        ids = {f[4:-4]: np.load(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("ids_")}
    load.append(os.getloadavg()[0])
    if not np.array_equal(ids["minigpt"], ids["hf1"]):
        sys.exit(f"error: minigpt's ids differ from tokenizers' ({first_difference(ids['minigpt'], ids['hf1'])})")
    if not runs["minigpt"]["non_ascii_same_prefix"]:
        sys.exit("error: minigpt's ids of the text + one non-ASCII letter do not begin with the text's ids")
    for k in ids:
        if k.startswith("hf") and k != "hf1" and not np.array_equal(ids[k], ids["hf1_lines" if "lines" in k else
                                                                                "hf1"]):
            sys.exit(f"error: tokenizers' ids on one thread and on {k[2:].split('_')[0]} differ")
    for name, r in runs.items():
        for mode, t in r["times"].items():
            print(f"{name} {mode}: {n_bytes / np.median(t) / 1e6:.2f} MB/s", flush=True)
    write_report(a, runs, n_bytes, len(text), text.isascii(), len(ids["minigpt"]), len(ids["hf1_lines"]), vocab,
                 train_s, load)


def write_report(a, runs, n_bytes, n_chars, is_ascii, n_tokens, n_tokens_lines, vocab, train_s, load):
    import tokenizers
    med = {(name, mode): float(np.median(t)) for name, r in runs.items() for mode, t in r["times"].items()}

    def row(label, threads, what, name, mode):
        t, c = runs[name]["times"][mode], runs[name]["cpu_s"][mode]
        return (f"| {label} | {what} | {threads} | {med[name, mode]:.3f} | {n_bytes / med[name, mode] / 1e6:.2f} | "
                f"{sum(c) / sum(t):.2f} | {', '.join(f'{x:.3f}' for x in t)} |")

    whole = "the text as one string (`encode`)"
    L = ["# GPT-2 tokenizer: encoding speed", "",
         f"Command: `{command('bench_gpt2_tokenizer.py')}` at {revision(ROOT)}, on {cpu_line()}, "
         f"{time.strftime('%Y-%m-%d %H:%M')}; 1-minute load average {load[0]:.2f} before, {load[1]:.2f} after.",
         "",
         f"The text: {os.path.basename(a.data)}, {n_chars:,} characters, {n_bytes / 1e6:.3f} MB of UTF-8"
         f"{' (all ASCII)' if is_ascii else ''}, {n_tokens:,} tokens. The tokenizer.json: trained here by Hugging "
         f"Face `tokenizers` {tokenizers.__version__} on that text in {train_s:.1f} s (ByteLevel pre-tokenizer with "
         f"GPT-2's regex, BPE, `<|endoftext|>`), asked for {a.vocab:,} tokens; the text allows {vocab:,}, at which "
         "point every word of it is one token (GPT-2's own vocabulary is 50,257). minigpt's `GPT2Tokenizer` and "
         "`tokenizers` read the same file, and their ids on the whole text are identical (the script checks and "
         "stops if they are not).", "",
         f"{a.rounds} round{'s' if a.rounds > 1 else ''}; in each, every implementation runs in its own process, "
         "one after the other, and times each input once with a freshly loaded tokenizer (an empty word cache; "
         "loading is not timed). The table gives the median over rounds. `tokenizers`' threads are set by "
         "RAYON_NUM_THREADS; minigpt is pure Python on one thread. MB/s is the text's bytes over the time, whatever "
         "the row's input. CPU s / wall s is the process's CPU time (all its threads) over the wall time, summed "
         "over the rounds: near 1 for one thread that had a CPU to itself, lower when other jobs took turns on it.",
         "",
         "| implementation | input | threads | median s | MB/s | CPU s / wall s | per round, s |",
         "|---|---|---:|---:|---:|---:|---|",
         row("minigpt `GPT2Tokenizer`", 1, whole, "minigpt", "whole"),
         row("minigpt `GPT2Tokenizer`", 1, "the text + one non-ASCII letter (`encode`)", "minigpt", "non-ASCII")]
    for name in runs:
        if name.startswith("tokenizers"):
            threads = int(name.split()[1])
            L.append(row("`tokenizers`", threads, whole, name, "whole"))
            L.append(row("`tokenizers`", threads, "its lines (`encode_batch`)", name, "lines"))
            L.append(row("`tokenizers`", threads, "the text, pre-tokenizer only (`pre_tokenize_str`)", name,
                         "pre-tokenizer"))
    m, h = med["minigpt", "whole"], med["tokenizers 1", "whole"]
    mu, hl = med["minigpt", "non-ASCII"], med["tokenizers 1", "lines"]
    many = [n for n in runs if n.startswith("tokenizers") and n != "tokenizers 1"]
    seen = ", ".join(f"{r['threads_seen']} with RAYON_NUM_THREADS={k.split()[1]}" for k, r in runs.items()
                     if "threads_seen" in r)
    L += ["", f"On one thread, minigpt encodes the text {h / m:.1f}x as fast as `tokenizers` encodes the same "
          f"string, and {hl / m:.1f}x as fast as `tokenizers` encodes its lines as a batch"
          + (f" ({med[many[0], 'lines'] / m:.1f}x on {many[0].split()[1]} threads)." if many else ".")
          + " minigpt splits ASCII text with an ASCII-only copy of GPT-2's regex (the same pieces, checked against "
          "the full one and against `tokenizers` in tests/test_gpt2_tokenizer.py); one non-ASCII letter anywhere "
          f"sends the whole text through the full regex, {n_bytes / mu / 1e6:.2f} MB/s. Its word cache is keyed by "
          "the piece as the regex cuts it, so a repeated word costs one dict lookup; the BPE runs once per distinct "
          "word. Not in the table: minigpt builds its regex once per process "
          f"({runs['minigpt']['pattern_s']:.2f} s here). `tokenizers`' ByteLevel split alone (`pre_tokenize_str`, "
          f"which also returns the pieces as a Python list) takes {med['tokenizers 1', 'pre-tokenizer']:.2f} s, "
          f"about as long as its whole `encode` ({h:.2f} s): on this text its time goes into the split rather than "
          "the BPE. It also keeps the offsets of every piece and token, which minigpt does not; its maintainers "
          "name that as one reason it trails tiktoken (huggingface/tokenizers#1519).", "",
          f"The batch of lines gives {n_tokens_lines:,} tokens against the whole text's {n_tokens:,}: in the whole "
          "text a run of blank lines is one whitespace piece, and `\\n\\n` one token, while the lines cut it at "
          f"every line break. Threads the `tokenizers` process held after `encode_batch`: {seen}."]

    def cpus(name, mode):                             # the CPUs a row can keep busy: encode_batch uses its threads
        return int(name.split()[1]) if name.startswith("tokenizers") and mode == "lines" else 1

    busy = {(n, mode): sum(runs[n]["cpu_s"][mode]) / sum(runs[n]["times"][mode]) for n, mode in med}
    short = [f"{n}, {mode} ({b:.2f} of {cpus(n, mode)})" for (n, mode), b in busy.items() if b < 0.9 * cpus(n, mode)]
    if short:
        L += ["", "Other jobs took turns on the CPUs during this run (CPU s / wall s below 90% of the CPUs the row "
              f"can use): {'; '.join(short)}. Those rows understate the speed."]
    out = a.out if os.path.isabs(a.out) else os.path.join(ROOT, a.out)
    with open(out, "w") as f:
        f.write("\n".join(L) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
