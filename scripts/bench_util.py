"""What the benchmark reports state about where they ran: the CPU (lscpu's model name and the SIMD flags that
decide which native kernels can run) and the git revision of a tree; `flag`, the true/false option type;
`write_keeping_notes`, how a report is rewritten. A sibling module of the bench scripts
(`from bench_util import cpu_line`); not part of the package.
"""
import argparse
import os
import shlex
import subprocess
import sys

if __name__ == "__main__":                 # a module the bench scripts import, not a command: say so
    sys.exit(print(__doc__.strip()))

SIMD = ("avx512f", "avx2", "fma", "avx512_bf16", "amx_bf16")


def cpu():
    """{"model": lscpu's model name, "cpus": CPUs this process may use, "flags": {flag: bool for SIMD}}."""
    model, flags = "unknown", set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        ids = {}
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "Model name" and model == "unknown":
                model = val.strip()
            elif key.strip() == "Flags":
                flags = set(val.split())
            elif key.strip() in ("Vendor ID", "CPU family", "Model") and key.strip() not in ids:
                ids[key.strip()] = val.strip()
        if len(ids) == 3:                                   # a model name alone may not say the generation
            model += f" ({ids['Vendor ID']} family {ids['CPU family']} model {ids['Model']})"
    except (OSError, subprocess.CalledProcessError):       # no lscpu: /proc/cpuinfo has the same fields
        try:
            for line in open("/proc/cpuinfo"):
                key, _, val = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = val.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(val.split())
        except OSError:
            pass
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return {"model": model, "cpus": n, "flags": {f: f in flags for f in SIMD}}


def cpu_line():
    """One line for a report: '<model name> (<vendor> family <n> model <n>), 2 CPUs, avx512f yes, avx2 yes, ...
    (lscpu)'."""
    c = cpu()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in c["flags"].items())
    return f"{c['model']}, {c['cpus']} CPUs, {flags} (lscpu)"


def command(script):
    """The command line this run was started with, as a report quotes it: 'python scripts/<script> <args>'."""
    return " ".join(["python", f"scripts/{script}", *map(shlex.quote, sys.argv[1:])])


def revision(tree="."):
    """Short commit of the git tree at `tree`, with '+uncommitted changes' if its tracked files differ from it."""
    try:
        rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git tree)"
    return rev + (" + uncommitted changes" if dirty else "")


def flag(word):
    """An argparse type for true/false options: 1/true/yes or 0/false/no, anything else an error (not False)."""
    w = word.strip().lower()
    if w in ("1", "true", "yes"):
        return True
    if w in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {word!r}")


def tree_env(tree):
    """Environment of a child that must import `tree`'s minigpt: PYTHONPATH first (it precedes the editable
    install's finder, which sits at the end of sys.meta_path), so a clone measures its own code."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([tree] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def write_keeping_notes(path, text, marker):
    """Write text to path, then marker and whatever followed marker in the file already there (hand-written notes,
    other benchmarks' sections), through a temporary file renamed into place."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + "\n\n" + marker + (old.split(marker, 1)[1] if marker in old else "\n"))
    os.replace(path + ".tmp", path)
