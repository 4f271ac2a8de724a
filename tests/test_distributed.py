"""Data-parallel training under mpiexec (minigpt/distributed.py): 2 ranks x batch B take the same steps as one
process with batch 2B; resume, signals, a killed rank and errors on one rank end cleanly, never in a hang.
The runs on 2 ranks skip, saying why, where mpi4py or mpiexec is missing (pip install -e ".[mpi]")."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minigpt import checkpoint, distributed
from minigpt.errors import UserError
from minigpt.outdir import OutDir
from helpers import write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--sample_chars=0", "--plot=",
         "--backend=numpy", "--warmup_iters=5", "--lr=3e-3", "--eval_iters=3"]
LAUNCHER_VARS = [v for v in os.environ if v.startswith(("PMI_", "OMPI_", "PMIX_", "MV2_", "HYDRA_"))]


def _have_mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return distributed.find_mpiexec() is not None


needs_mpi = pytest.mark.skipif(not _have_mpi(), reason="mpi4py or mpiexec not installed "
                                                       "(pip install -e \".[mpi]\" installs mpi4py and MPICH)")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}   # not a rank of an outer mpiexec
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _cmd(n, args):
    script = [sys.executable, "scripts/train_shakespeare.py", *MODEL, *args]
    return script if n is None else [distributed.find_mpiexec(), "-n", str(n), *script]


def run(n, *args, timeout=180):
    """train_shakespeare.py on n ranks under mpiexec (n=None: one plain process)."""
    return subprocess.run(_cmd(n, args), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def start(n, *args):
    return subprocess.Popen(_cmd(n, args), cwd=ROOT, env=_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def rows(out, kind):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [r for r in map(json.loads, (line for line in f if line.endswith("\n"))) if r["kind"] == kind]


def wait_for_rows(out, proc, n, timeout=120):
    t0 = time.time()
    while not (os.path.exists(os.path.join(out, "log.jsonl")) and len(rows(out, "train")) >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "timed out waiting for the log"
        time.sleep(0.01)


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    write_text(path, n_chars=20000)
    return str(path)


# ----------------------------------------------------------------------------
# one process: no MPI at all

def test_one_process_never_imports_mpi(tmp_path, text):
    code = ("import sys; from minigpt.train import main; "
            f"assert main(['--data', {text!r}, '--out_dir', {str(tmp_path / 'out')!r}, '--max_iters=3', "
            "'--eval_interval=3', '--n_layer=1', '--n_embd=8', '--n_head=2', '--block_size=8', '--batch_size=2', "
            "'--backend=numpy']) == 0; "
            "assert 'mpi4py' not in sys.modules, 'imported mpi4py'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_world_of_one_process_is_the_identity():
    w = distributed.World()
    buf = np.arange(3.0)
    assert w.allreduce(buf) is buf and list(buf) == [0, 1, 2]
    assert w.size == 1 and w.root and w.allgather("x") == ["x"] and w.bcast(5) == 5
    with pytest.raises(UserError, match="bad"):                # settle() lets the error through, unchanged
        with w.settle():
            raise UserError("bad")
    grads = np.ones(2)
    assert w.sync(grads, 0.5, True) == 0.5 and list(grads) == [1, 1] and w.stopping(True)
    assert not w.stopping(False) and w.stopping(True, ask=True)


def test_mpiexec_without_mpi4py_says_what_to_install(tmp_path, text):
    fake = tmp_path / "fake"                                  # an mpi4py that cannot be imported
    (fake / "mpi4py").mkdir(parents=True)
    (fake / "mpi4py" / "__init__.py").write_text("raise ImportError('No module named mpi4py')\n")
    env = _env(PMI_SIZE="2", PMI_RANK="0", PYTHONPATH=f"{fake}{os.pathsep}{ROOT}")
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", "--data", text, "--out_dir",
                        str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "mpi4py is not installed" in r.stderr and '.[mpi]' in r.stderr


# ----------------------------------------------------------------------------
# two ranks

@needs_mpi
def test_two_ranks_take_the_steps_of_one_process_with_twice_the_batch(tmp_path, text):
    args = ["--data", text, "--max_iters=40", "--eval_interval=20", "--log_interval=5"]
    one = run(None, *args, "--batch_size=8", "--out_dir", str(tmp_path / "one"))
    two = run(2, *args, "--batch_size=4", "--out_dir", str(tmp_path / "two"))
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = rows(tmp_path / "one", "train"), rows(tmp_path / "two", "train")
    assert len(a) == len(b) == 40
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=2e-5)
    ea, eb = rows(tmp_path / "one", "eval"), rows(tmp_path / "two", "eval")
    np.testing.assert_allclose([r["val_loss"] for r in eb], [r["val_loss"] for r in ea], rtol=0, atol=1e-4)
    assert eb[-1]["val_loss_full"] == pytest.approx(ea[-1]["val_loss_full"], abs=1e-4)   # ranks share the blocks
    assert two.stdout.count("done: val loss") == 1               # rank 0 alone prints and writes
    assert "2 ranks x 1 threads" in two.stdout
    assert sorted(os.listdir(tmp_path / "two")) == ["ckpt_best.npz", "ckpt_last.npz", "log.jsonl", "report.html",
                                                    "report.json", "snapshots"]
    assert OutDir(str(tmp_path / "two")).snapshot_iters() == OutDir(str(tmp_path / "one")).snapshot_iters()
    meta = checkpoint.load(str(tmp_path / "two" / "ckpt_last.npz"))[0]
    assert meta["world_size"] == 2 and len(meta["rng"]["model_ranks"]) == 2


@needs_mpi
def test_sigint_saves_once_and_resume_continues_exactly_then_with_one_process(tmp_path, text):
    args = ["--data", text, "--max_iters=300", "--eval_interval=1000", "--batch_size=4", "--dropout=0.1"]
    straight = tmp_path / "straight"
    assert run(2, *args, "--out_dir", str(straight)).returncode == 0
    out = tmp_path / "run"
    proc = start(2, *args, "--out_dir", str(out))
    wait_for_rows(out, proc, 20)
    os.killpg(proc.pid, signal.SIGINT)                           # as Ctrl-C in a terminal: the whole group
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr                        # stopped (and saved): 128 + SIGINT
    assert stdout.count("saved") == 1 and "--resume" in stdout, stdout
    stopped_at = checkpoint.load(str(out / "ckpt_last.npz"))[0]["iter"]
    assert 20 <= stopped_at < 300
    shutil.copytree(out, tmp_path / "other_n")
    r = run(2, "--out_dir", str(out), "--resume")                  # the same N: every setting from the checkpoint
    assert r.returncode == 0, r.stderr
    assert [x["loss"] for x in rows(out, "train")] == [x["loss"] for x in rows(straight, "train")]  # dropout too
    r = run(None, "--out_dir", str(tmp_path / "other_n"), "--resume", "--max_iters=310")
    assert r.returncode == 0, r.stderr
    assert "made by 2 process(es) and 1 continue" in r.stdout and "data order" in r.stdout
    losses = [x["loss"] for x in rows(tmp_path / "other_n", "train")]
    assert len(losses) == 310 and np.all(np.isfinite(losses))
    ref = [x["loss"] for x in rows(straight, "train")]               # the trained weights and moments came back:
    assert np.mean(losses[stopped_at:stopped_at + 10]) == pytest.approx(np.mean(ref[stopped_at:stopped_at + 10]),
                                                                         rel=0.1)
    assert np.mean(losses[stopped_at:stopped_at + 10]) < losses[0] - 0.3  # not the untrained model's loss


@needs_mpi
def test_a_signal_to_one_rank_during_the_final_evaluation_stops_every_rank(tmp_path):
    """No step's Allreduce follows the final evaluation, so the ranks agree on a signal that arrived during it in
    one of their own: every rank stops there, rank 0 says so, and the job's status is 130."""
    write_text(tmp_path / "text.txt", n_chars=20000)
    code = ("import os, signal, sys; from minigpt import distributed; import minigpt.train as T\n"
            "whole = T.whole_split_loss\n"
            "def ctrl_c(*a, **k):\n"
            "    if distributed.world().rank == 1: os.kill(os.getpid(), signal.SIGINT)\n"
            "    return whole(*a, **k)\n"
            "T.whole_split_loss = ctrl_c\n"
            f"sys.exit(T.main(['--data', {str(tmp_path / 'text.txt')!r}, '--out_dir', {str(tmp_path / 'out')!r}, "
            "'--max_iters=4', '--eval_interval=2', *" + repr(MODEL[:4] + MODEL[6:]) + "]))")
    r = subprocess.run([distributed.find_mpiexec(), "-n", "2", sys.executable, "-c", code], cwd=ROOT,
                       env=_env(PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert r.stdout.count("a signal to another rank during the final evaluation") == 1, r.stdout
    assert checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["iter"] == 4


@needs_mpi
def test_two_ranks_with_a_time_budget_muon_and_bpe(tmp_path, text):
    """The paths with collectives of their own: rank 0's clock for --max_time, BPE trained on every rank."""
    out = tmp_path / "run"
    r = run(2, "--data", text, "--out_dir", str(out), "--max_time=3", "--max_iters=100000", "--eval_interval=40",
            "--batch_size=4", "--optimizer=muon", "--tokenizer=bpe", "--vocab_size=280", "--sample_chars=20")
    assert r.returncode == 0, r.stderr
    final = rows(out, "eval")[-1]
    assert 3.0 <= final["elapsed"] < 8 and final["iter"] > 10 and "val_bpc" in final
    assert r.stdout.count("---- sample ----") == 1 and r.stdout.count("BPE: 280 tokens") == 1


@needs_mpi
def test_a_killed_rank_stops_the_job_and_leaves_the_checkpoints_loadable(tmp_path, text):
    out = tmp_path / "run"
    proc = start(2, "--data", text, "--max_iters=100000", "--eval_interval=10", "--batch_size=4",
                 "--out_dir", str(out))
    wait_for_rows(out, proc, 30)
    rank1 = _rank_pid(proc.pid, 1)
    os.kill(rank1, signal.SIGKILL)
    t0 = time.time()
    stdout, stderr = proc.communicate(timeout=30)
    assert time.time() - t0 < 10 and proc.returncode != 0
    assert "Killed" in stdout + stderr or "KILLED" in stdout + stderr, stdout[-2000:] + stderr[-2000:]
    for name in ("ckpt_last.npz", "ckpt_best.npz"):
        assert checkpoint.load(str(out / name))[0]["iter"] >= 10


@needs_mpi
def test_an_error_on_rank_0_alone_ends_every_rank_with_one_message(tmp_path, text):
    r = run(2, "--data", text, "--out_dir", str(tmp_path / "none"), "--resume", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("error: --resume: no checkpoint") == 1, r.stderr


@needs_mpi
def test_an_error_on_one_rank_only_ends_every_rank_with_its_message(tmp_path):
    """Rank 1 alone lacks the data file (as a second machine might): its message, exit 2 everywhere, no hang."""
    (tmp_path / "r0").mkdir()
    (tmp_path / "r1").mkdir()
    write_text(tmp_path / "r0" / "text.txt", n_chars=20000)          # rank 0 runs in r0, rank 1 in the empty r1
    code = ("import os, sys; from minigpt import distributed; from minigpt.train import main; "
            f"os.chdir(os.path.join({str(tmp_path)!r}, 'r%d' % distributed.world().rank)); "
            f"sys.exit(main(['--data', 'text.txt', '--out_dir', {str(tmp_path / 'out')!r}, '--backend=numpy']))")
    r = subprocess.run([distributed.find_mpiexec(), "-n", "2", sys.executable, "-c", code], cwd=ROOT,
                       env=_env(PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("error: on rank 1: data file 'text.txt' does not exist") == 1, r.stderr


def _rank_pid(mpiexec_pid, rank, timeout=10):
    """The pid of the given rank among mpiexec's descendants (its environment holds PMI_RANK)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        parent = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
        for pid in parent:
            p = pid
            while p in parent and p != mpiexec_pid:
                p = parent[p]
            if p != mpiexec_pid:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"PMI_RANK={rank}".encode() in f.read().split(b"\0"):
                        return pid
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process of rank {rank} under mpiexec {mpiexec_pid}")
