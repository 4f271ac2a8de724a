"""What nanoGPT itself reaches on config S: an independent PyTorch run per seed, for the quality bar's context.

    python scripts/nanogpt_reference.py --seeds 1337 1 2 3 [--gelu erf|tanh] [--threads 2] [--key value ...]

Each seed trains scripts/torch_twin.py's TorchGPT the way nanoGPT's train.py does, with nothing from minigpt
but the text and the tokenizer: torch.manual_seed(seed), GPT-2 init drawn by torch, batches and eval batches
drawn by torch.randint from the one global generator, torch.optim.AdamW with nanoGPT's two decay groups,
clip_grad_norm_, and the same warmup + cosine schedule (minigpt.optim.get_lr, a pure function). The GELU is
nanoGPT's exact erf form by default. Other `--key value` pairs override config S as in train_shakespeare.py
(e.g. `--bias true`). Needs PyTorch (not a minigpt dependency). Writes reports/nanogpt_reference.md.
"""
import argparse
import os
import statistics
import sys
import time

from minigpt.config import parse_args
from minigpt.errors import UserError
from minigpt.data import CharTokenizer, Dataset, load_text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1337, 1, 2, 3])
    ap.add_argument("--gelu", choices=("erf", "tanh"), default="erf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report", default="reports/nanogpt_reference.md")
    a, rest = ap.parse_known_args()
    try:
        cfg = parse_args(rest)                                  # config S, with any overrides
        text = load_text(cfg.data)
        tok = CharTokenizer.from_text(text)
        data = Dataset(text, tok, cfg.block_size, source=cfg.data)
    except UserError as e:
        sys.exit(f"error: {e}")
    try:
        import torch
    except ImportError:
        sys.exit("this script needs PyTorch, which minigpt does not depend on: pip install torch")
    from torch_twin import train_like_nanogpt            # scripts/torch_twin.py, a sibling module
    torch.set_num_threads(a.threads)
    rows, t0 = [], time.time()
    for seed in a.seeds:
        curve, _ = train_like_nanogpt(seed, data, tok.vocab_size, cfg, a.gelu)
        rows.append((seed, curve[-1][1]["train"], curve[-1][1]["val"]))
    vals = [r[2] for r in rows]
    cmd = "python scripts/nanogpt_reference.py " + " ".join(sys.argv[1:])
    lines = [f"# nanoGPT's own distribution on config S (PyTorch {torch.__version__}, GELU {a.gelu})", "",
             f"Command: `{cmd}` ({(time.time() - t0) / 60:.0f} min). Each seed is an independent PyTorch run in",
             "nanoGPT's manner (torch init, torch.randint batches and eval batches, torch.optim.AdamW); see the",
             "script's docstring. Loss at the last iteration from eval_iters batches, as nanoGPT's CPU run reports it.", "",
             f"| seed | train loss at {cfg.max_iters} | val loss at {cfg.max_iters} |", "|---|---|---|"]
    lines += [f"| {s} | {tr:.4f} | {v:.4f} |" for s, tr, v in rows]
    sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
    lines += ["", f"Val loss over {len(vals)} seeds: mean {statistics.mean(vals):.4f}, sd {sd:.4f}, "
              f"min {min(vals):.4f}, max {max(vals):.4f}; {sum(v <= 1.88 for v in vals)} of {len(vals)} at or below 1.88.", ""]
    os.makedirs(os.path.dirname(a.report) or ".", exist_ok=True)
    with open(a.report, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
