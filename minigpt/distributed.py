"""Data-parallel training over MPI: `mpiexec -n N python scripts/train_shakespeare.py ...`.

Every rank holds the whole model. Each step, every rank draws the same global batch of N * batch_size start offsets
from the shared batch generator and takes its own slice of them (so the union of the ranks' rows is what one
process with --batch_size N*B would draw), runs forward and backward on its slice with the loss scaled by
1/(grad_accum N), and one Allreduce sums the gradients in place: they live in one flat buffer, the model's
grad_memory (a second, of two numbers, sums the loss and "a rank was signalled"). Every rank then clips and applies
the same update to the same weights, so the replicas stay equal without ever sending weights. Only rank 0 writes
the log, checkpoints, snapshots, plot, sample and report.

One process never imports mpi4py: world() returns a World of size 1 whose collectives do nothing. mpiexec is
recognised by the variables its launcher sets (PMI_SIZE: MPICH, Intel MPI, Slurm; OMPI_COMM_WORLD_SIZE: Open MPI).

Faults. A rank that dies makes mpiexec stop the others (MPICH's Hydra kills them and names the dead process). An
error the ranks settle together exits normally on every rank, with status 3 for a diverged loss and 2 for anything
else: a bad setting, anything a World.settle() block raised (such as a data file missing on one rank: every rank
raises it as "on rank N: ..."). Any other exception on one rank is printed there and aborts the whole job
(MPI_Abort), because the others would wait forever for it in the next collective. A SIGINT/SIGTERM, which mpiexec
forwards to every rank, rides along in the step's second Allreduce (the loss's), so all ranks stop after the same
step and rank 0 saves once; after the final evaluation, which no step follows, the ranks agree on it in an
Allreduce of its own (World.stopping(ask=True)).

What differs between one process and many lives here, in World's methods, so the training loop never asks how many
processes run: settle() (every rank raises the first rank's error), sync() (the gradient sum, the global loss and
the agreed stop), clock() (one clock for --max_time) and stopping().
"""
import contextlib
import os
import shutil
import sys
import time
import traceback
import zlib

import numpy as np

from .errors import UserError

_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
_world = None


def find_mpiexec():
    """mpiexec beside this Python (where the mpich wheel installs it), else the one on PATH; None if neither."""
    near = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return near if os.path.exists(near) else shutil.which("mpiexec")


def launched_size():
    """How many processes the launcher started (1 without one), read from its environment variables."""
    for var in _SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def world():
    """The World this process belongs to, made on first use: MPIWorld under mpiexec -n N>1, else World()."""
    global _world
    if _world is None:
        n = launched_size()
        _world = World() if n <= 1 else MPIWorld(n)
    return _world


class World:
    """One process: rank 0 of 1, and every collective is the identity (nothing is imported, nothing costs)."""
    rank, size, local_size = 0, 1, 1
    stop_agreed = False                          # the ranks agreed to stop (sync, stopping)

    @property
    def root(self):
        return self.rank == 0

    def allreduce(self, buf):                    # in place: buf <- the sum of every rank's buf
        return buf

    def bcast(self, obj):                        # rank 0's obj on every rank
        return obj

    def allgather(self, obj):                    # [rank 0's obj, rank 1's, ...]
        return [obj]

    @contextlib.contextmanager
    def settle(self):
        """A block that may raise a UserError on some ranks only (a step rank 0 alone does, such as reading the
        checkpoint or making out_dir): when it ends, every rank raises the first rank's error, so none is left
        waiting for the others in a collective."""
        yield

    def sync(self, grads, loss, signalled):
        """After a step's backward: sum the gradients over the ranks (the flat buffer, in place), then the loss
        and whether a signal reached any rank (the agreed stop); -> the global loss."""
        self.stop_agreed = signalled
        return loss

    def clock(self, t_start, max_time):
        """Seconds since t_start; with a --max_time budget, rank 0's (one lr, one end for every rank)."""
        return time.perf_counter() - t_start

    def stopping(self, signalled, ask=False):
        """A signal asks to stop: in one process, as soon as it arrives; under mpiexec, once the ranks agree,
        which they do in sync() or, with ask=True, in an Allreduce of their own (after the final evaluation,
        which no step's sync follows)."""
        return signalled

    def same_weights(self, params):
        """Raise if the ranks' weights differ (a checksum per rank): the replicas must never drift apart."""

    def fail(self, code):
        """Leave after an error this rank alone may have met (see the module's docstring)."""
        return code


class MPIWorld(World):
    def __init__(self, expected):
        try:
            from mpi4py import MPI
        except ImportError:
            raise UserError(f"started by mpiexec as {expected} processes, but mpi4py is not installed; run "
                            "`python -m pip install -e \".[mpi]\"` (mpi4py and MPICH), or run one process "
                            "without mpiexec") from None
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_size = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()   # ranks on this machine
        sys.excepthook = self._excepthook        # an uncaught exception on one rank must not hang the others

    def allreduce(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    def allgather(self, obj):
        return self.comm.allgather(obj)

    @contextlib.contextmanager
    def settle(self):
        error = None
        try:
            yield
        except UserError as e:
            error = str(e)
        errors = self.allgather(error)
        for rank, e in enumerate(errors):
            if e is not None:
                raise UserError(e if rank == 0 else f"on rank {rank}: {e}")

    def sync(self, grads, loss, signalled):
        self.allreduce(grads)
        both = self.allreduce(np.array([loss, signalled], float))
        self.stop_agreed = both[1] > 0
        return float(both[0])

    def clock(self, t_start, max_time):
        elapsed = time.perf_counter() - t_start
        return self.bcast(elapsed) if max_time else elapsed

    def stopping(self, signalled, ask=False):
        if ask:
            self.stop_agreed = self.allreduce(np.array([signalled], float))[0] > 0
        return self.stop_agreed

    def same_weights(self, params):
        crc = 0
        for k in sorted(params):
            crc = zlib.crc32(np.ascontiguousarray(params[k]).view(np.uint8), crc)
        crcs = self.allgather(crc)
        if len(set(crcs)) > 1:
            raise RuntimeError(f"the ranks' weights differ (checksums {crcs}); the MPI library's Allreduce does "
                               "not give every rank the same sum. Report this with the MPI you use")

    def fail(self, code):
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)

    def _excepthook(self, kind, value, tb):
        sys.stderr.write(f"[rank {self.rank}] " + "".join(traceback.format_exception(kind, value, tb)))
        self.fail(1)


# ----------------------------------------------------------------------------
# leaving with an error

def launched_rank():
    """This process's rank as the launcher set it (0 without one); known before MPI starts."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def exit_status(error, code):
    """Print a UserError and return the command's exit status. Under mpiexec, an error that every rank meets
    alike (error.everywhere, the default: settings, settle(), divergence) is printed by rank 0 alone and every
    rank exits; one that a rank may meet alone (everywhere = False) is printed by it and aborts the job."""
    everywhere = getattr(error, "everywhere", True)
    if launched_rank() == 0 or not everywhere:
        print(f"error: {error}", file=sys.stderr, flush=True)
    if not everywhere and _world is not None:
        return _world.fail(code)
    return code
