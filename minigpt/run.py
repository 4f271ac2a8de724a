"""A training run: what the loop (minigpt/train.py) reads and a checkpoint holds (Run), made by minigpt/prepare.py.

Run saves checkpoints and snapshots, sums the ranks' gradients and keeps the run's clock. On --resume restore() puts
back the last checkpoint's weights, optimizer state, generators and position, so the loop goes on as if it had
never stopped. say() prints on rank 0; StopFlag turns SIGINT/SIGTERM into a flag the loop checks between steps.
Under mpiexec rank 0 alone writes and prints.
"""
import contextlib
import json
import math
import os
import signal
import time

import numpy as np

from . import checkpoint, distributed
from .config import quiet_stdout
from .errors import CannotSave, StoppedTwice, UserError


@contextlib.contextmanager
def _saving(path):
    """An OSError while writing path (a checkpoint, a snapshot) becomes CannotSave: one line that names the fix."""
    try:
        yield
    except OSError as e:
        raise CannotSave(f"cannot write {path} ({e.strerror or e}); free space or make its directory writable, "
                         "then continue with --resume (the checkpoints written before it are whole)") from None


# ----------------------------------------------------------------------------
# the run: what the loop reads and a checkpoint holds

class Run:
    """What the loop reads and a checkpoint holds: data, model, optimizer, the batch generator, and the
    position (the next iteration, the best val loss so far). save() writes all of it."""

    def __init__(self, cfg, tok, data, model, opt, world=distributed.World()):
        self.cfg, self.tok, self.data, self.model, self.opt, self.world = cfg, tok, data, model, opt, world
        self.batch_rng = np.random.default_rng([cfg.seed, 1])             # the same on every rank
        self.start, self.best_val = 0, math.inf
        self.last_path, self.best_path, self.log_path = last_path(cfg), best_path(cfg), log_path(cfg)
        self.stop = None                                                   # the loop's StopFlag
        self.elapsed = 0.0                                                 # seconds of training (--max_time)
        self.stop_agreed = False
        if world.rank > 0:                 # the same init on every rank, but each its own dropout masks
            model.rng.bit_generator.state = np.random.default_rng([cfg.seed, 3, world.rank]).bit_generator.state

    def save(self, path, it):
        """Rank 0 writes; every rank calls it (it gathers each rank's dropout generator)."""
        states = self.world.allgather(self.model.rng.bit_generator.state)
        if not self.world.root:
            return
        settings = {**self.cfg.to_dict(), "data": os.path.abspath(self.cfg.data)}   # found from any directory
        meta = {"iter": it, "best_val": self.best_val, "tokenizer": self.tok.to_json(),  # (resume, eval, report)
                "model_config": self.model.config.to_dict(), "train_config": settings,
                "rng": {"model": states[0], "batch": self.batch_rng.bit_generator.state}, "elapsed": self.elapsed}
        if self.world.size > 1:
            meta["rng"]["model_ranks"], meta["world_size"] = states, self.world.size
        with _saving(path):
            checkpoint.save(path, self.model, self.opt, meta)

    def save_snapshot(self, it):
        """Rank 0: the weights alone into out_dir/snapshots/ (the report's history of the run)."""
        with _saving(os.path.join(self.cfg.out_dir, checkpoint.SNAPSHOT_DIR)):
            checkpoint.save_snapshot(self.cfg.out_dir, self.model, it, self.elapsed)

    def sync(self, loss):
        """Sum the gradients over the ranks (the model's flat buffer, in place), then the loss and whether a
        signal reached any rank; -> the global loss. Nothing to do in one process."""
        if self.world.size == 1:
            return loss
        self.world.allreduce(self.model.grad_memory)
        both = self.world.allreduce(np.array([loss, self.stop is not None and self.stop.signal is not None]))
        self.stop_agreed = both[1] > 0
        return float(both[0])

    def clock(self, t_start):
        """Seconds of training since t_start; under mpiexec with --max_time, rank 0's (one lr, one end for all)."""
        elapsed = time.perf_counter() - t_start
        return self.world.bcast(elapsed) if self.cfg.max_time and self.world.size > 1 else elapsed

    def schedule(self, it):
        """Where the lr schedule is: iteration it, or with --max_time the elapsed fraction of the budget laid
        over the lr_decay_iters iterations of the schedule (so warmup and decay fit the budget on any machine)."""
        return it if not self.cfg.max_time else self.cfg.lr_decay_iters * self.elapsed / self.cfg.max_time

    def stopping(self, ask=False):
        """A signal asks to stop: in one process, as soon as it arrives; under mpiexec, once the ranks agree,
        which they do in sync() or, with ask=True, in an Allreduce of their own (after the final evaluation,
        which no step's sync follows)."""
        if self.world.size == 1:
            return self.stop.signal is not None
        if ask:
            self.stop_agreed = self.world.allreduce(np.array([self.stop.signal is not None], float))[0] > 0
        return self.stop_agreed


def last_path(cfg):
    return os.path.join(cfg.out_dir, "ckpt_last.npz")


def best_path(cfg):
    return os.path.join(cfg.out_dir, "ckpt_best.npz")


def log_path(cfg):
    return os.path.join(cfg.out_dir, "log.jsonl")


# ----------------------------------------------------------------------------
# --resume: the checkpoint's state, put back (its settings: prepare.py)

def restore(run, ckpt):
    """Continue where ckpt = checkpoint.load(...) stopped: weights, optimizer state, generators, position, time.
    The log keeps only the rows before that point, so it ends up equal to an uninterrupted run's."""
    meta, params, state = ckpt
    checkpoint.load_params(run.model, params, run.last_path)
    try:
        run.opt.load_state(state["t"], state["slots"], state["name"])
    except ValueError as e:
        was = meta["train_config"].get("optimizer", "adamw")
        raise UserError(f"{run.last_path}: {e}; the run used --optimizer {was}: resume with it, or start a new "
                        "--out_dir") from None
    dropout = meta["rng"].get("model_ranks", [meta["rng"]["model"]])  # one state per rank that saved it
    if run.world.rank < len(dropout):                                  # a rank new to the run keeps its fresh seed
        run.model.rng.bit_generator.state = dropout[run.world.rank]
    run.batch_rng.bit_generator.state = meta["rng"]["batch"]
    run.start, run.best_val, run.elapsed = meta["iter"], meta["best_val"], meta.get("elapsed", 0.0)
    if run.start > run.cfg.max_iters:
        raise UserError(f"{run.last_path} is at iter {run.start}, past --max_iters {run.cfg.max_iters}; "
                        "raise --max_iters")
    if 0 < run.cfg.max_time <= run.elapsed:
        raise UserError(f"{run.last_path} has spent its time budget ({run.elapsed:.0f} s of --max_time "
                        f"{run.cfg.max_time:g}); raise --max_time to continue")
    if run.world.root:
        _truncate_log(run.log_path, run.start)
    say(f"resuming from {run.last_path} at iter {run.start}")
    if run.start == run.cfg.max_iters:
        say(f"note: iter {run.start} is --max_iters: no steps are left to train, only the final evaluation; raise "
            "--max_iters to train on")
    saved, batch = meta.get("world_size", 1), meta["train_config"].get("batch_size", run.cfg.batch_size)
    if saved != run.world.size:                                # a step draws ranks x B rows from one generator
        same = saved * batch == run.world.size * run.cfg.batch_size
        say(f"note: the checkpoint was made by {saved} process(es) and {run.world.size} continue: each step now "
            f"takes {run.world.size} x {run.cfg.batch_size} sequences (before: {saved} x {batch}), " +
            ("the same rows as before" if same else "so the data order from here on differs from the run's"))


def _truncate_log(log_path, start):
    """Keep the rows of iterations before `start`, so a resumed log equals an uninterrupted one."""
    if not os.path.exists(log_path):
        return
    rows = []
    with open(log_path) as f:
        for line in f:
            try:
                if json.loads(line)["iter"] < start:
                    rows.append(line)
            except (ValueError, KeyError, TypeError):              # blank, or torn by a kill mid-write
                pass
    with open(log_path + ".tmp", "w") as f:                        # rewritten beside it, then renamed:
        f.writelines(rows)                                         # a crash here leaves the old log whole
    os.replace(log_path + ".tmp", log_path)


# ----------------------------------------------------------------------------
# messages and signals

def say(msg):
    """Print on rank 0 only: every rank of a data-parallel run has the same thing to say. If stdout's reader
    went away (`| head`), the loop stops as on a signal, saving (SIGPIPE); outside the loop the command ends."""
    if distributed.world().root:
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            quiet_stdout()
            if StopFlag.active is None:
                raise                                        # run_command: exit status 141
            StopFlag.active.signal = StopFlag.active.signal or "SIGPIPE"


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps; a second one stops at once."""

    active = None                                            # the running loop's flag (say() sets SIGPIPE)

    def __init__(self):
        self.signal = None
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        StopFlag.active = self

    def _handle(self, signum, frame):
        if self.signal is not None:                          # the second one: the user means now
            self.restore()
            raise StoppedTwice(f"second {signal.Signals(signum).name}: stopped at once without saving this step; "
                               "the checkpoints in --out_dir are intact, continue with --resume")
        self.signal = signal.Signals(signum).name

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        StopFlag.active = None
