"""The one owner of a run's directory (--out_dir): every file a run writes there, by name, and their life cycle.

    out_dir/log.jsonl        one JSON row per step and per evaluation (train.py writes, report.py reads)
    out_dir/ckpt_last.npz    the latest checkpoint (--resume continues from it)
    out_dir/ckpt_best.npz    the checkpoint of the best validation loss (sample, report, eval, export read it)
    out_dir/snapshots/       iter_<it>.npz: float16 weights at a few points of the run (the report's history)
    out_dir/loss_curve.png   the loss curve (--plot names another file inside out_dir)
    out_dir/report.html      what the model learned (python -m minigpt.report)
    out_dir/report.json      every number report.html draws

Every file is written under a temporary name and renamed into place; tidy() removes the temporaries a killed run
left (a checkpoint's while its writer holds no lock on it: remove_stale), and a new run in a directory that holds
another run's files clears them first (start_over). Every other module asks an OutDir for a path instead of
spelling a file name; checkpoint.py writes and reads the files.
"""
import json
import os

from .errors import UserError

try:
    import fcntl                                # POSIX: flock on the checkpoints' temporaries
except ImportError:                             # elsewhere: no locks, and no clean-up either
    fcntl = None

LOG, LAST, BEST = "log.jsonl", "ckpt_last.npz", "ckpt_best.npz"
SNAPSHOTS, CURVE, REPORT, REPORT_JSON = "snapshots", "loss_curve.png", "report.html", "report.json"
PART = ".part"                                  # the temporary suffix of the snapshots, report and curve
TMP_PREFIX, TMP_SUFFIX = ".tmp-", ".npz"        # checkpoint.save's temporaries: mkstemp(prefix, suffix), locked
MAX_SNAPSHOT_PARAMS = 20_000_000                # 40 MB a float16 snapshot: above, runs keep none

# what the commands that read a run's checkpoint (--ckpt FILE, else OutDir.checkpoint()) advise instead of a bad one
CKPT_FIX = f"pass --ckpt FILE (a checkpoint that training wrote), or an --out_dir that holds {BEST} or {LAST}"


class OutDir:
    """The paths of one run's directory, and what may be done to its files."""

    def __init__(self, path):
        self.path = path
        self.log, self.last, self.best = (os.path.join(path, n) for n in (LOG, LAST, BEST))
        self.report, self.snapshots = os.path.join(path, REPORT), os.path.join(path, SNAPSHOTS)
        self.report_json = os.path.join(path, REPORT_JSON)

    def curve(self, plot=CURVE):
        """Where the loss curve goes: None for --plot '', else out_dir/<plot> (config.check keeps it inside)."""
        return os.path.join(self.path, plot) if plot else None

    def snapshot(self, it):
        return os.path.join(self.snapshots, f"iter_{it:07d}.npz")

    # ------------------------------------------------------------------
    # reading a run

    def checkpoint(self):
        """The checkpoint of the run that the reading commands use: ckpt_best.npz, else ckpt_last.npz."""
        for path in (self.best, self.last):
            if os.path.exists(path):
                return path
        raise UserError(f"no checkpoint in --out_dir {self.path!r} (no {BEST} or {LAST}); pass the --out_dir of a "
                        "training run, or --ckpt FILE")

    def resume_path(self):
        """--resume's checkpoint, ckpt_last.npz, and what to do if it is unreadable; a UserError naming
        ckpt_best.npz, if there is one, when it is missing."""
        if not os.path.exists(self.last):
            copy = (f"copy {self.best} to {self.last} to continue from the best one, or "
                    if os.path.exists(self.best) else "")
            raise UserError(f"--resume: no checkpoint at {self.last}; {copy}train without --resume first, or point "
                            "--out_dir at the directory of an earlier run")
        fix = "start a new --out_dir"
        if os.path.exists(self.best) and os.path.abspath(self.best) != os.path.abspath(self.last):
            fix = f"copy {self.best} over {self.last} to resume from the best one, or {fix}"
        return self.last, fix

    def snapshot_iters(self):
        """Iterations of the snapshots in out_dir/snapshots/, sorted."""
        return sorted(self._snapshot_names())

    def _snapshot_names(self):
        """{iteration: file name} of the snapshots (iter_<it>.npz)."""
        names = os.listdir(self.snapshots) if os.path.isdir(self.snapshots) else []
        return {int(n[5:-4]): n for n in names if n.startswith("iter_") and n.endswith(".npz") and n[5:-4].isdigit()}

    # ------------------------------------------------------------------
    # the life cycle: writable, tidy, start over, a resumed log

    def ensure_writable(self):
        """Make out_dir if missing and check that a file can be written there: a UserError naming the fix before a
        command does its work, not a traceback after it."""
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise UserError(f"--out_dir {self.path!r} is a file, not a directory; pass a directory (made if missing)")
        try:
            os.makedirs(self.path, exist_ok=True)
            probe = os.path.join(self.path, ".write-test")
            with open(probe, "w") as f:
                f.write("ok")
            os.unlink(probe)
        except OSError as e:
            raise UserError(f"cannot write to --out_dir {self.path!r} ({e.strerror}); pass a writable "
                            "directory") from None

    def tidy(self, new_run, plot, data, say):
        """Rank 0, once every setting has passed: the temporaries of a run killed while saving go (checkpoints'
        with a note; the log's, snapshots', report's and curve's silently), and a new run clears an old one's
        files (start_over). plot: the run's --plot; data: the text it trains on, never removed."""
        stale = remove_stale(self.path)
        for path in self._partial_files(plot):
            if os.path.isfile(path):
                os.remove(path)
        if new_run:
            self.start_over(plot, data, say)
        if stale:
            say(f"note: removed {len(stale)} temporary checkpoint file(s) that a run killed while saving left in "
                f"{self.path} ({', '.join(n for n, _ in stale)}: {sum(b for _, b in stale) / 2 ** 20:.1f} MB)")

    def _partial_files(self, plot):
        """The temporary names under which a run writes its other files before renaming them into place."""
        names = os.listdir(self.snapshots) if os.path.isdir(self.snapshots) else ()
        return [self.log + ".tmp", self.report + PART, self.report_json + PART, (self.curve(plot) or "") + PART,
                *(os.path.join(self.snapshots, n) for n in names
                  if n.startswith("iter_") and n.endswith(".npz" + PART))]

    def start_over(self, plot, data, say):
        """A new run (no --resume) in an out_dir that holds another (its log, last checkpoint or snapshots): the
        old log, snapshots, checkpoints, report and loss curve go, so that what the directory shows is this run's
        alone (also when this run makes no report or plot, or stops before its first checkpoint: --resume must
        not continue the old run under the new one's log). An out_dir that holds no run keeps every file: a
        report.html or a PNG there is someone else's."""
        logged = os.path.exists(self.log) and os.path.getsize(self.log) > 0
        if not (logged or os.path.exists(self.last) or self.snapshot_iters()):
            return
        gone = self.remove_snapshots()
        say(f"note: {self.path} held a run (a {LOG}, {gone} snapshot(s)): this new run replaces its log, "
            "snapshots, report, loss curve and checkpoints; --resume would have continued it")
        for path in [self.log, self.last, self.best, self.report, self.report_json, self.curve(),
                     self.curve(plot) or ""]:
            if os.path.isfile(path) and not _same_file(path, data):     # never the text it trains on
                os.remove(path)

    def remove_snapshots(self):
        """Delete out_dir/snapshots/iter_<it>.npz (a new run there starts its own); -> how many went."""
        names = self._snapshot_names().values()
        for n in names:
            os.remove(os.path.join(self.snapshots, n))
        return len(names)

    def truncate_log(self, start):
        """Keep the rows of iterations before `start`, so a resumed log equals an uninterrupted one."""
        if not os.path.exists(self.log):
            return
        rows = []
        with open(self.log) as f:
            for line in f:
                try:
                    if json.loads(line)["iter"] < start:
                        rows.append(line)
                except (ValueError, KeyError, TypeError):              # blank, or torn by a kill mid-write
                    pass
        with open(self.log + ".tmp", "w") as f:                        # rewritten beside it, then renamed:
            f.writelines(rows)                                         # a crash here leaves the old log whole
        os.replace(self.log + ".tmp", self.log)


def remove_stale(directory):
    """Delete the temporaries checkpoint.save left in directory when its process was killed mid-write; -> [(name,
    bytes)]. Only files named .tmp-*.npz whose lock is free: a live save() holds its temporary's until the rename
    (the kernel drops a killed process's locks). Meant for the one process that writes checkpoints (rank 0)."""
    removed = []
    if fcntl is None or not os.path.isdir(directory):
        return removed
    for name in sorted(os.listdir(directory)):
        if not (name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:                                        # renamed into place meanwhile, or not a file
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # fails while a live save() writes it
            os.unlink(path)
            removed.append((name, os.fstat(fd).st_size))
        except OSError:                                        # locked (BlockingIOError), or already gone
            pass
        finally:
            os.close(fd)
    return removed


def snapshot_fix(path):
    """What to do instead of reading a snapshot as a checkpoint: its run's checkpoints sit next to snapshots/."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.basename(d) != SNAPSHOTS:
        return f"pass --ckpt with its run's {BEST} or {LAST}"
    run = OutDir(os.path.dirname(d))
    return f"pass --ckpt {run.best} (or {LAST}), or --out_dir {run.path}"


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:                                                  # b is gone (or a): not the same
        return False
