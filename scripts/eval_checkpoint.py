"""Loss of a checkpoint over whole splits, and the spread of the training loop's eval_iters-batch estimate.

    python scripts/eval_checkpoint.py --out_dir out [--ckpt FILE] [--data PATH] [--draws 10]
    python scripts/eval_checkpoint.py --out_dir out --context 64 --splits val --draws 0   # a shorter context

The training loop estimates train/val loss from eval_iters random batches (a fixed generator, so curves are
comparable). This script measures the same weights two more ways: over every non-overlapping block of each
split (each target once, with a context of up to block_size tokens: minigpt.train.whole_split_loss), and
over `--draws` independent draws of eval_iters batches, to show how much the training loop's figure moves with
the batches alone. --context N measures both ways with blocks of at most N tokens instead of block_size (so its
draws are no longer the training loop's batches), to show how much of a long-context model's loss its context buys.
Every mistake is one line, "error: ...", and exit status 2; --help lists the options.
"""
import os
import sys

import numpy as np

from minigpt import checkpoint
from minigpt.config import EvalConfig, check_common, check_ranges, parse_args, run_command
from minigpt.errors import UserError
from minigpt.backends import select_backend
from minigpt.sample import load_model
from minigpt.outdir import OutDir
from minigpt.train import open_data, whole_split_loss


def main(argv):
    try:
        a = check_ranges(parse_args(argv, EvalConfig, prog="eval_checkpoint.py", description=__doc__),
                         non_negative=("draws", "context", "max_tokens"))
        if a.max_tokens == 1:
            raise UserError("--max_tokens 1 holds no next token to score; pass 0 (the whole split) or at least 2")
        splits = [x.strip() for x in a.splits.split(",") if x.strip()]
        if not splits or set(splits) - {"train", "val"}:
            raise UserError(f"--splits {a.splits!r}: name train, val or both, comma-separated (e.g. --splits val)")
        check_common(a)
        path = a.ckpt or OutDir(a.out_dir).checkpoint()
        loaded = checkpoint.load(path)
        if "train_config" not in loaded[0]:
            raise UserError(f"{path} has no train_config (the run's batch_size, eval_iters, seed); pass a checkpoint "
                            "that training wrote")
        cfg = loaded[0]["train_config"]
        text = a.data or cfg.get("data", "")
        if not a.data and not os.path.exists(text):
            raise UserError(f"the run's training text {text!r} (its --data, from the checkpoint) is not here; "
                            "pass --data PATH")
        ops = select_backend(a, verbose=False)              # said below, once every setting has passed
        model, tok = load_model(path, loaded, ops, bf16=a.dtype == "bf16")
        if a.context > model.config.block_size:
            raise UserError(f"--context {a.context} is longer than the model's block_size {model.config.block_size}, "
                            "the positions it learned: pass at most that, or 0 for all of it")
        tok, data = open_data(text, tok, model.config.block_size)       # a text file, or a directory of shards
        select_backend(a)                                   # its "backend" line: once every setting has passed
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    T, B, iters = a.context or model.config.block_size, cfg["batch_size"], cfg["eval_iters"]
    print(f"{path} on {text}: block {model.config.block_size}, context {T}, batch {B}, eval_iters {iters}, "
          f"{a.dtype} products")
    for split in splits:
        ids = data.ids(split, a.max_tokens or None)
        whole = "whole split" if len(ids) == data.num_tokens(split) else f"first {len(ids):,} tokens of the split"
        full = whole_split_loss(model, ids, T, B)
        line = f"{split:5s}: {whole} {full:.4f} ({len(ids):,} tokens)"
        est = []
        for d in range(a.draws):
            rng = np.random.default_rng([cfg["seed"], 100 + d])  # not the loop's generator [seed, 2]
            est.append(np.mean([model.forward(*data.batch(split, B, T, rng))[1] for _ in range(iters)]))
        if est:
            line += (f"; {iters}-batch estimate over {a.draws} draws: mean {np.mean(est):.4f}, std {np.std(est):.4f}, "
                     f"min {np.min(est):.4f}, max {np.max(est):.4f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))
