"""Every bad input gets a clear message, no traceback and a non-zero exit; runs survive signals and kills."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minigpt import checkpoint
from helpers import write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--max_iters=4",
        "--eval_interval=2", "--eval_iters=1", "--sample_chars=0", "--plot=", "--backend=numpy"]


def train_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "scripts/train_shakespeare.py", *TINY, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def sample_cli(*args):
    return subprocess.run([sys.executable, "-m", "minigpt.sample", "--backend=numpy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def assert_clear_error(r, *needles, code=2):
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr, r.stderr    # our message, not argparse's
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    write_text(path)
    return path


# ----------------------------------------------------------------------------
# bad data

def test_bad_data_paths(tmp_path):
    assert_clear_error(train_cli("--data", str(tmp_path / "nope.txt")), "does not exist", "--data")
    assert_clear_error(train_cli("--data", str(tmp_path)), "is a directory")
    (tmp_path / "empty.txt").write_bytes(b"")
    assert_clear_error(train_cli("--data", str(tmp_path / "empty.txt")), "is empty")
    (tmp_path / "latin1.txt").write_bytes("to be or not to be, ".encode() * 20 + "caf\xe9".encode("latin-1"))
    assert_clear_error(train_cli("--data", str(tmp_path / "latin1.txt")), "not UTF-8", "byte offset 403")


def test_data_too_short_for_block(tmp_path):
    (tmp_path / "short.txt").write_text("abcdefghij" * 30)                 # val split: 30 tokens < 65
    assert_clear_error(train_cli("--data", str(tmp_path / "short.txt"), "--block_size=64"),
                       "val split has 30 tokens", "block_size 64")


# ----------------------------------------------------------------------------
# bad settings

@pytest.mark.parametrize("args,needle", [
    (["--n_layer=0"], "--n_layer must be positive"), (["--batch_size=-2"], "--batch_size must be positive"),
    (["--n_embd=30", "--n_head=4"], "divisible by --n_head"), (["--dropout=1.5"], "--dropout must lie in [0, 1)"),
    (["--n_layr=2"], "unknown setting --n_layr; did you mean --n_layer?"), (["--lr=fast"], "--lr expects a number"),
    (["--lr=nan"], "--lr expects a number"), (["--weight_decay=inf"], "--weight_decay expects a number"),
    (["--bias=maybe"], "--bias expects true or false"), (["--backend=cuda"], "--backend must be one of"),
    (["--n-layr=2"], "unknown setting --n_layr; did you mean --n_layer?"), (["--lr"], "--lr needs a value"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_settings(text, args, needle):
    assert_clear_error(train_cli("--data", str(text), *args), needle)


def test_unwritable_out_dir(tmp_path, text):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_clear_error(train_cli("--data", str(text), "--out_dir", str(blocker / "sub")), "cannot write to --out_dir")


def test_unavailable_backend_is_an_error_not_a_fallback(text):
    env = {**os.environ, "MINIGPT_NATIVE_LIB": "/nonexistent/libmgk.so"}
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *TINY, "--data", str(text), "--backend=native"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert_clear_error(r, "--backend native")


# ----------------------------------------------------------------------------
# checkpoints and resume

def test_resume_errors(tmp_path, text):
    out = str(tmp_path / "run")
    assert_clear_error(train_cli("--data", str(text), "--out_dir", out, "--resume"), "no checkpoint", "without --resume")
    assert train_cli("--data", str(text), "--out_dir", out).returncode == 0
    assert_clear_error(train_cli("--data", str(text), "--out_dir", out, "--resume", "--block_size=32"),
                       "--block_size 32 does not match the resumed model's block_size=16")
    other = tmp_path / "other.txt"
    other.write_text(text.read_text() + "XYZ" * 50)
    assert_clear_error(train_cli("--data", str(other), "--out_dir", out, "--resume", "--max_iters=6"),
                       "not in the tokenizer's vocabulary", "'X', 'Y', 'Z'")
    with open(os.path.join(out, "log.jsonl"), "a") as f:
        f.write('{"iter": 3, "kind": "tr')                              # a row torn by a kill mid-write
    assert train_cli("--data", str(text), "--out_dir", out, "--resume", "--max_iters=6").returncode == 0
    with open(os.path.join(out, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]                          # the torn row is gone, the rest kept
    assert [r["iter"] for r in rows if r["kind"] == "train"] == list(range(6))


def test_text_without_newline_trains_and_samples(tmp_path):
    (tmp_path / "one_line.txt").write_text("to be or not to be that is the question " * 60)
    r = train_cli("--data", str(tmp_path / "one_line.txt"), "--out_dir", str(tmp_path / "run"), "--sample_chars=20")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "---- sample ----" in r.stdout


def test_bad_checkpoints(tmp_path, text):
    out = tmp_path / "run"
    assert train_cli("--data", str(text), "--out_dir", str(out)).returncode == 0
    good = out / "ckpt_last.npz"
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "none.npz")), "does not exist")
    (tmp_path / "trunc.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "trunc.npz")), "not a readable checkpoint", "truncated")
    (tmp_path / "text.npz").write_text("hello")
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "text.npz")), "not a readable checkpoint")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "other.npz")), "not a minigpt checkpoint")
    meta, params, _ = checkpoint.load(str(good))                      # a config that does not fit its arrays
    meta["model_config"]["n_embd"] = 32
    arrays = {**{f"param/{k}": a for k, a in params.items()}, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    np.savez(tmp_path / "mismatch.npz", **arrays)
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "mismatch.npz")), "has shape", "expects")
    assert_clear_error(sample_cli("--ckpt", str(good), "--prompt", "héllo"), "'é'")
    assert_clear_error(sample_cli("--ckpt", str(good), "--temperature=0"), "--temperature must be positive")
    np.save(tmp_path / "bare.npy", np.zeros(3))                          # np.load gives an array, not an archive
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "bare.npy")), "not a readable checkpoint")
    (tmp_path / "prompt.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert_clear_error(sample_cli("--ckpt", str(good), "--prompt_file", str(tmp_path / "prompt.txt")),
                       "cannot be read as UTF-8", "--prompt")


# ----------------------------------------------------------------------------
# signals, kills, divergence

def _start(args, env=None):
    return subprocess.Popen([sys.executable, "scripts/train_shakespeare.py", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _wait_for(pred, proc, timeout=60):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.002)


def _train_losses(out):
    with open(out / "log.jsonl") as f:                       # complete rows only: a run may be writing the last
        return [r["loss"] for r in map(json.loads, (line for line in f if line.endswith("\n"))) if r["kind"] == "train"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_and_resume_is_exact(tmp_path, text, sig):
    args = ["--data", str(text), *TINY[:-5], "--max_iters=400", "--eval_interval=1000", "--eval_iters=1",
            "--sample_chars=0", "--plot=", "--backend=numpy"]
    straight = tmp_path / "straight"
    assert subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--out_dir", str(straight)],
                          cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    out = tmp_path / "run"
    proc = _start([*args, "--out_dir", str(out)])
    _wait_for(lambda: (out / "log.jsonl").exists() and len(_train_losses(out)) >= 20, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert f"{sig.name} at iter" in stdout and "--resume" in stdout
    stopped_at = checkpoint.load(str(out / "ckpt_last.npz"))[0]["iter"]
    assert 20 <= stopped_at < 400
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--out_dir", str(out), "--resume"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _train_losses(out) == _train_losses(straight)               # bit-identical to the uninterrupted run


def test_second_signal_stops_at_once():
    from minigpt.train import StoppedTwice, _StopFlag, exit_code
    before = signal.getsignal(signal.SIGINT)
    stop = _StopFlag()
    try:
        stop._handle(signal.SIGINT, None)                                 # the first: finish the step, save
        assert stop.signal == "SIGINT"
        with pytest.raises(StoppedTwice, match="second SIGTERM: stopped at once") as e:
            stop._handle(signal.SIGTERM, None)                            # the second: now
        assert exit_code(e.value) == 130
        assert signal.getsignal(signal.SIGINT) is before                  # a third goes to the old handler
    finally:
        stop.restore()


def test_sigkill_while_saving_leaves_previous_checkpoint_loadable(tmp_path, text):
    out = tmp_path / "run"
    args = ["--data", str(text), "--out_dir", str(out), "--n_layer=4", "--n_head=4", "--n_embd=256",
            "--block_size=16", "--batch_size=2", "--max_iters=1000", "--eval_interval=1", "--eval_iters=1",
            "--sample_chars=0", "--plot=", "--backend=numpy"]
    last = out / "ckpt_last.npz"
    tmp_seen = lambda: out.exists() and any(f.startswith(".tmp-") for f in os.listdir(out))
    for attempt in range(3):
        proc = _start(args + (["--resume"] if last.exists() else []))
        _wait_for(lambda: last.exists() and not tmp_seen(), proc)    # a previous checkpoint exists
        _wait_for(tmp_seen, proc)                                    # and the next one is being written now
        proc.kill()
        proc.wait()
        meta, params, _ = checkpoint.load(str(last))              # the previous one is intact
        assert all(np.isfinite(p).all() for p in params.values())
        for f in os.listdir(out):                                   # the half-written temporary is never loaded
            if f.startswith(".tmp-"):
                os.unlink(out / f)


def test_divergence_stops_with_message_and_keeps_checkpoint(tmp_path, text):
    out = tmp_path / "run"
    r = train_cli("--data", str(text), "--out_dir", str(out), "--lr=1e9", "--warmup_iters=0", "--grad_clip=0",
                  "--max_iters=200", "--eval_interval=1")
    assert_clear_error(r, "non-finite", "at iter", "last finite loss", "ckpt_last.npz", "--resume", code=3)
    meta, params, _ = checkpoint.load(str(out / "ckpt_last.npz"))
    assert all(np.isfinite(p).all() for p in params.values())
