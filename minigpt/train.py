"""The training loop, top to bottom: lr -> eval/checkpoint -> forward/backward (accumulated) -> clip -> step -> log.

Three generators, all seeded from cfg.seed: the model's (init, then dropout's seeds), the batch sampler's,
and the evaluation one, re-created at every eval so that curves are comparable between runs. Checkpoints
carry every state that the next step reads, so a resumed run is bit-identical to an uninterrupted one (with
--max_time the lr follows the clock, so only the budget carries over). The last evaluation also scores the whole
validation split (whole_split_loss), in nats per token and bits per character.
This file is the loop (with evaluate_and_checkpoint and step); what it runs on, the Run (minigpt/run.py), is made by
minigpt/prepare.py (setup: settings, backend, out_dir, tokenizer, data, model, optimizer; --resume).
Run it with scripts/train_shakespeare.py (which also downloads the text, plots the loss curve, samples and writes
report.html) or `python -m minigpt.train --data PATH ...` (training only); --help lists every setting. Under
`mpiexec -n N` it trains data-parallel (minigpt/distributed.py): each rank takes its slice of every batch, one
Allreduce sums the gradients, and rank 0 alone prints and writes.
"""
import json
import math
import os
import signal
import sys
import time

import numpy as np

from . import checkpoint, distributed
from .config import parse_args, run_command
from .errors import Diverged, OutOfMemory, UserError, exit_code
from .evaluate import estimate_loss, whole_split_loss
from .optim import clip_grad_norm, get_lr
from .prepare import setup
from .run import StopFlag, StoppedTwice, say


def interrupted_status(result):
    """The command's exit status after a run stopped by a signal and saved: 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), as a shell reports a command a signal stopped, so `train && sample` stops too;
    130 on the ranks that stopped because another rank had the signal. 0 for a run that finished."""
    name = result["interrupted"]
    if not name:
        return 0
    return 128 + signal.Signals[name] if name in signal.Signals.__members__ else 130


def train(cfg, given=None, fetch=None):
    """Train per cfg. From the command line, `given` names the settings the user typed: on --resume the others
    come from the checkpoint, and a typed model setting must match it. given=None (a config built in code):
    on --resume only the model's shape and tokenizer come from the checkpoint, every other setting is cfg's.
    fetch(path), if given, is called when the data file is missing (the script's download)."""
    try:
        run = setup(cfg, given, fetch)
        with np.errstate(over="ignore", invalid="ignore"):  # a run that diverges says so once (Diverged below), not
            return loop(run)                                # in a warning of numpy's (numpy backend) per overflow
    except MemoryError as e:                   # past prepare.py's _check_memory estimate: one line, not a traceback
        raise OutOfMemory(f"out of memory ({e}); lower --batch_size, --block_size, --n_embd or --n_layer") from None


# ----------------------------------------------------------------------------
# the loop: lr -> eval/checkpoint -> accumulate -> clip -> step -> log

def loop(run):
    """Iterations run.start .. max_iters, or until --max_time seconds are spent; returns the result dict (a
    shorter one when a signal stopped it)."""
    cfg = run.cfg
    # log.jsonl, line-buffered: each row reaches disk as it is made
    log = open(run.log_path if run.world.root else os.devnull, "a", buffering=1)
    run.stop = stop = StopFlag()                            # SIGINT/SIGTERM handlers, restored in the finally below
    last_loss, t_train, n_timed = None, 0.0, 0
    t_start = time.perf_counter() - run.elapsed              # a resumed run spends what is left of the budget
    try:
        for it in range(run.start, cfg.max_iters + 1):
            run.elapsed = run.clock(t_start)
            if run.stopping():                               # SIGINT/SIGTERM: save this step, exit cleanly
                run.save(run.last_path, it)
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} at iter {it}: saved {run.last_path}; continue with --resume")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            last = it == cfg.max_iters or 0 < cfg.max_time <= run.elapsed
            lr = get_lr(run.schedule(it), cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters, cfg.cooldown)
            if it % cfg.eval_interval == 0 or last:
                losses = evaluate_and_checkpoint(run, it, log, final=last)
            if last and run.stopping(ask=True):              # a signal during the final evaluation: saved
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} during the final evaluation: saved {run.last_path} at iter {it}, the run's end")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            if last:
                if cfg.max_time and run.elapsed < cfg.max_time:
                    say(f"note: --max_iters {cfg.max_iters} ended the run {cfg.max_time - run.elapsed:.0f} s before "
                        f"--max_time, with the lr still at {lr:.2e}; raise --max_iters to spend the budget")
                break
            loss, gnorm, dt = step(run, it, lr, last_loss)
            last_loss, t_train, n_timed = loss, t_train + dt, n_timed + 1
            eta = (cfg.max_iters - it - 1) * t_train / n_timed
            if cfg.max_time:
                eta = min(eta, cfg.max_time - run.elapsed)
            _log_step(log, run, it, loss, lr, gnorm, dt, eta)
    finally:
        log.close()
        stop.restore()
    return {"iter": it, "interrupted": None, "best_val": run.best_val, "final": losses,
            "train_seconds": t_train, "ms_per_iter": 1000 * t_train / max(1, n_timed), "model": run.model,
            "tokenizer": run.tok, "log": run.log_path}


def evaluate_and_checkpoint(run, it, log, final=False):
    """Both splits' loss into the log; checkpoint ckpt_last (and ckpt_best when val improved). The final one
    also measures the whole validation split, in nats per token and bits per character."""
    losses = estimate_loss(run.model, run.data, run.cfg, run.world)
    run.world.same_weights(run.model.params())
    row = {"iter": it, "kind": "eval", "train_loss": losses["train"], "val_loss": losses["val"],
           "elapsed": run.elapsed, "rss_mb": _rss_mb()}
    say(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if final:
        val = run.data.splits["val"]
        full = whole_split_loss(run.model, val, run.cfg.block_size, run.cfg.batch_size, run.world)
        chars = len(run.tok.decode(val[1:]))                 # the characters the targets spell
        losses["val_full"] = row["val_loss_full"] = full
        losses["val_bpc"] = row["val_bpc"] = full * (len(val) - 1) / (chars * math.log(2))
        say(f"iter {it}: val loss over the whole split {full:.4f} ({losses['val_bpc']:.4f} bits per character)")
    log.write(json.dumps(row) + "\n")
    if losses["val"] < run.best_val:
        run.best_val = losses["val"]
        run.save(run.best_path, it)
    run.save(run.last_path, it)
    if run.world.root and _snapshot_due(run, it, final):
        run.save_snapshot(it)
    return losses


def _snapshot_due(run, it, final):
    """--snapshots N spread over the run: at the first evaluation at or past each of the fractions 0, 1/(N-1),
    ..., 1 of --max_iters (of --max_time when it is set), the final evaluation always among them (a resumed run
    that raised --max_iters adds its own end to the N it took before)."""
    n, cfg = run.cfg.snapshots, run.cfg
    if n == 0 or run.model.num_params() > checkpoint.MAX_SNAPSHOT_PARAMS:
        return False
    if final or n == 1:
        return final
    taken = sum(i < it for i in checkpoint.snapshot_iters(cfg.out_dir))
    if taken >= n - 1:                                       # the last of the N is the final evaluation's
        return False
    progress = run.elapsed / cfg.max_time if cfg.max_time else it / max(1, cfg.max_iters)
    return progress >= taken / (n - 1)


def step(run, it, lr, last_loss):
    """One optimisation step: grad_accum micro-batches on each of the N ranks, each backward seeded with
    1/(grad_accum N), the ranks' gradients summed (run.sync), then clip and the optimizer's step. A non-finite loss
    or gradient norm raises Diverged before the weights change. -> (loss, gnorm, seconds)"""
    cfg, model, world = run.cfg, run.model, run.world
    t0 = time.perf_counter()
    model.zero_grad()
    loss, k = 0.0, cfg.grad_accum * world.size                # k: micro-batches in the step, over all ranks
    for _ in range(cfg.grad_accum):
        x, y = run.data.batch("train", cfg.batch_size, cfg.block_size, run.batch_rng, world.rank, world.size)
        loss += model.forward(x, y)[1] / k
        model.backward(scale=1.0 / k)
    loss = run.sync(loss)
    gnorm = clip_grad_norm(model.grad_memory, cfg.grad_clip)
    if not (math.isfinite(loss) and math.isfinite(gnorm)):
        raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at iter {it} "
                       f"(last finite loss {last_loss}); the weights were not updated or saved. Resume "
                       f"from {run.last_path} with --resume and a lower --lr (now {cfg.lr}) or --grad_clip")
    run.opt.step(model.params(), model.grads(), lr)
    return loss, gnorm, time.perf_counter() - t0


def _log_step(log, run, it, loss, lr, gnorm, dt, eta):
    """Every step into the log; a progress line every log_interval steps and at the last (tokens of all ranks)."""
    cfg = run.cfg
    tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.grad_accum * run.world.size
    log.write(json.dumps({"iter": it, "kind": "train", "loss": loss, "lr": lr, "grad_norm": gnorm,
                          "elapsed": run.elapsed, "ms": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                          "rss_mb": _rss_mb()}) + "\n")
    if it % cfg.log_interval == 0 or it == cfg.max_iters - 1:
        where = f"{it:5d} | {run.elapsed:.0f}/{cfg.max_time:g} s" if cfg.max_time else f"{it:5d}/{cfg.max_iters}"
        say(f"iter {where} | loss {loss:.4f} | lr {lr:.2e} | {1000 * dt:6.1f} ms | "       # --max_time: the budget,
            f"{tokens_per_iter / dt:8,.0f} tok/s | ETA {_fmt_time(eta)}")                   # not the iteration cap


def _rss_mb():
    """Resident memory of this process now (Linux /proc), in MiB; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):
        return None


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


SCRIPT_ONLY = {"plot", "report", "sample_chars"}       # settings only scripts/train_shakespeare.py acts on
DESCRIPTION = ("Train a GPT on a UTF-8 text file; writes out_dir/log.jsonl, checkpoints and snapshots/ (training only: "
               "scripts/train_shakespeare.py also downloads, plots, samples and writes report.html).")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(argv, prog="python -m minigpt.train", description=DESCRIPTION)   # --help: SystemExit(0)
        skipped = sorted(k for k in SCRIPT_ONLY & cfg.given if getattr(cfg, k))   # asked for: not --plot '' etc.
        if skipped:
            flags = ", ".join("--" + k for k in skipped)
            say(f"note: python -m minigpt.train does not plot, sample or report: {flags} ignored "
                "(scripts/train_shakespeare.py does all three)")
        result = train(cfg, given=cfg.given)
    except UserError as e:
        return distributed.exit_status(e, exit_code(e))
    return interrupted_status(result)


if __name__ == "__main__":
    sys.exit(run_command(main))
