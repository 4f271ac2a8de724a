"""Evaluation: the training loop's estimate from random batches, and the loss over a whole split.

estimate_loss draws eval_iters batches of each split from a generator seeded afresh at every call, so curves are
comparable between evaluations and runs; whole_split_loss scores every target of a split once, the figure to
compare tokenizers and runs by (bits per character: train.evaluate_and_checkpoint). Both leave the model in the
mode it was in, and under mpiexec share the work between the ranks (minigpt/distributed.py).
"""
import numpy as np

from . import distributed


def estimate_loss(model, data, cfg, world=distributed.World()):
    """Mean loss over cfg.eval_iters batches of each split, drawn from a fixed evaluation generator. Under
    mpiexec each rank evaluates its slice of every batch and the ranks average (the batches of one process
    with --batch_size N*B)."""
    rng = np.random.default_rng([cfg.seed, 2])
    was_training = model.training
    model.eval()
    means = np.zeros(2)                                      # train, val
    for i, split in enumerate(("train", "val")):
        losses = [model.forward(*data.batch(split, cfg.batch_size, cfg.block_size, rng, world.rank, world.size))[1]
                  for _ in range(cfg.eval_iters)]
        means[i] = np.mean(losses)
    if world.size > 1:
        means = world.allreduce(means) / world.size
    model.train(was_training)
    return {"train": float(means[0]), "val": float(means[1])}


def whole_split_loss(model, ids, block_size, batch_size, world=distributed.World()):
    """Mean loss over every target of ids (N,): the blocks ids[i : i+T+1] for i = 0, T, 2T, ... and a last,
    shorter one, so each target counts once with up to T tokens of context. Ranks share the blocks."""
    n = len(ids) - 1                                         # targets
    if n < 1:
        raise ValueError(f"whole_split_loss: {len(ids)} token(s) hold no target; it needs at least 2")
    starts = np.arange(0, n - block_size + 1, block_size)     # full blocks
    mine = starts[world.rank::world.size]
    total = np.zeros(1)                                      # the sum of the losses of this rank's targets
    was_training = model.training
    model.eval()
    for s in range(0, len(mine), batch_size):
        rows = mine[s:s + batch_size, None] + np.arange(block_size + 1)            # (b, T+1)
        chunk = ids[rows].astype(np.int32)
        total += model.forward(chunk[:, :-1], chunk[:, 1:])[1] * chunk[:, 1:].size
    tail = n - len(starts) * block_size
    if tail and world.root:                                  # the last targets, in one shorter block
        chunk = ids[None, len(starts) * block_size:].astype(np.int32)                # (1, tail+1)
        total += model.forward(chunk[:, :-1], chunk[:, 1:])[1] * tail
    model.train(was_training)
    return float(world.allreduce(total)[0] / n)
