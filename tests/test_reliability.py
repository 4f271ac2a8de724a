"""Every bad input gets a clear message, no traceback and a non-zero exit; runs survive signals and kills."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minigpt import checkpoint, outdir
from helpers import spec, write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--max_iters=4",
        "--eval_interval=2", "--eval_iters=1", "--sample_chars=0", "--plot=", "--backend=numpy"]


def train_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "scripts/train_shakespeare.py", *TINY, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def sample_cli(*args):
    return subprocess.run([sys.executable, "-m", "minigpt.sample", "--backend=numpy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def assert_clear_error(r, *needles, code=2, started=False):
    """r failed with one line on stderr, holding every needle. started: the command got as far as its work (a run
    that diverged), so the line naming its backend comes first; before that, the error is the only line."""
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr, r.stderr    # our message, not argparse's
    lines = r.stderr.splitlines()
    assert len([x for x in lines if not (started and x.startswith("minigpt: backend"))]) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    write_text(path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(text, out_dir) of one finished tiny run, shared by the tests that only read its checkpoint."""
    d = tmp_path_factory.mktemp("trained")
    write_text(d / "text.txt")
    r = train_cli("--data", str(d / "text.txt"), "--out_dir", str(d / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "text.txt", d / "run"


def eval_cli(*args):
    return subprocess.run([sys.executable, "scripts/eval_checkpoint.py", "--backend=numpy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def export_cli(*args):
    return subprocess.run([sys.executable, "scripts/export_hf.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def assert_one_error(r, *needles):
    """assert_clear_error, and stderr is that one line: nothing printed before it."""
    assert_clear_error(r, *needles)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


# ----------------------------------------------------------------------------
# bad data

def test_bad_data_paths(tmp_path):
    assert_clear_error(train_cli("--data", str(tmp_path / "nope.txt")), "does not exist", "--data")
    assert_clear_error(train_cli("--data", str(tmp_path)), "has no token shards", "scripts/prepare_data.py")
    (tmp_path / "empty.txt").write_bytes(b"")
    assert_clear_error(train_cli("--data", str(tmp_path / "empty.txt")), "is empty")
    (tmp_path / "latin1.txt").write_bytes("to be or not to be, ".encode() * 20 + "caf\xe9".encode("latin-1"))
    assert_clear_error(train_cli("--data", str(tmp_path / "latin1.txt")), "not UTF-8", "byte offset 403")
    (tmp_path / "model.bin").write_bytes(np.arange(300, dtype=np.float32).tobytes())   # a binary, not a text
    r = train_cli("--data", str(tmp_path / "model.bin"))
    assert_clear_error(r, "is a binary file (NUL bytes), not text")
    assert "iconv" not in r.stderr


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
    (["stray"], "unexpected argument 'stray'"), (["--cooldown=1.5"], "--cooldown must lie in [0, 1]"),
    (["--cooldown=-0.1"], "--cooldown must lie in [0, 1]"),
    (["--min_lr=0.01"], "--min_lr 0.01 is above --lr 0.001, so the decay would raise the learning rate"),
    (["--plot=/tmp/curve.png"], "--plot '/tmp/curve.png' lies outside --out_dir"),
])
def test_bad_settings(text, args, needle):
    assert_clear_error(train_cli("--data", str(text), *args), needle)


def test_min_lr_not_typed_above_a_typed_lr_is_lowered_to_it(tmp_path, text):
    """A typed --lr below the default --min_lr (1e-4) trains, after one note, with the lr never above --lr;
    the same --min_lr typed is refused (test_bad_settings)."""
    r = train_cli("--data", str(text), "--out_dir", str(tmp_path / "run"), "--lr=5e-5", "--warmup_iters=1",
                  "--lr_decay_iters=4")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: --min_lr 0.0001 (not typed) is above --lr 5e-05; the lr decays to --lr instead" in r.stdout
    with open(tmp_path / "run" / "log.jsonl") as f:
        lrs = [row["lr"] for row in map(json.loads, f) if "lr" in row]
    assert lrs[1:] == [5e-5] * 3 and lrs[0] < 5e-5                           # after warmup it stays at --lr
    assert checkpoint.load(str(tmp_path / "run" / "ckpt_last.npz"))[0]["train_config"]["min_lr"] == 5e-5


def test_bpe_vocabulary_smaller_than_asked_is_said(tmp_path, text):
    r = train_cli("--data", str(text), "--out_dir", str(tmp_path / "run"), "--tokenizer=bpe", "--vocab_size=99991")
    assert r.returncode == 0, r.stderr[-2000:]
    vocab = checkpoint.load(str(tmp_path / "run" / "ckpt_last.npz"))[0]["model_config"]["vocab_size"]
    notes = [line for line in r.stdout.splitlines() if line.startswith("note: --vocab_size 99991")]
    assert len(notes) == 1 and f"has {vocab} tokens" in notes[0] and "no more pairs to merge" in notes[0], r.stdout
    assert vocab < 99991
    r = train_cli("--data", str(text), "--out_dir", str(tmp_path / "fits"), "--tokenizer=bpe", "--vocab_size=260")
    assert r.returncode == 0 and "note: --vocab_size" not in r.stdout              # filled: nothing to say


@pytest.mark.parametrize("args,needle", [
    (["--threads=-1"], "--threads must be zero or more, got -1"), (["--seed=-1"], "--seed must be zero or more"),
])
def test_sample_and_train_share_range_checks(trained, args, needle):
    text, out = trained
    assert_clear_error(train_cli("--data", str(text), "--out_dir", str(out.parent / "other"), *args), needle)
    assert_clear_error(sample_cli("--ckpt", str(out / "ckpt_last.npz"), "--max_new_tokens=3", *args), needle)


@pytest.mark.parametrize("args,needle", [
    (["--num_samples=0"], "--num_samples must be positive, got 0"), (["--top_k=-2"], "--top_k must be zero or more"),
    (["--max_new_tokens=-1"], "--max_new_tokens must be zero or more"), (["--top_p=0"], "--top_p must lie in (0, 1]"),
])
def test_sample_range_checks_name_the_setting(trained, args, needle):
    assert_clear_error(sample_cli("--ckpt", str(trained[1] / "ckpt_last.npz"), *args), needle)


@pytest.mark.parametrize("args, needle", [
    (["--draws", "-1"], "error: --draws must be zero or more, got -1"),
    (["--context", "-3"], "error: --context must be zero or more, got -3"),
    (["--context", "17"], "--context 17 is longer than the model's block_size 16, the positions it learned"),
    (["--context", "17", "--backend", "auto"], "--context 17 is longer"),     # auto says what it chose: not here
    (["--splits", "val,test"], "--splits 'val,test': name train, val or both"),
])
def test_eval_checkpoint_bad_settings(trained, args, needle):
    text, out = trained
    assert_clear_error(eval_cli("--ckpt", str(out / "ckpt_last.npz"), "--data", str(text), *args), needle)


def test_eval_checkpoint_errors_and_help(trained, tmp_path):
    text, out = trained
    assert_clear_error(eval_cli("--ckpt", str(out / "ckpt_last.npz"), "--draws=x"), "--draws expects an integer")
    assert_clear_error(eval_cli("--ckpt", str(out / "ckpt_last.npz"), "--drwas=3"), "did you mean --draws?")
    assert_clear_error(eval_cli("--ckpt", str(tmp_path / "none.npz")), "does not exist")
    assert_clear_error(eval_cli("--ckpt", str(out / "ckpt_last.npz"), "--data", str(tmp_path / "none.txt")),
                       "does not exist")
    short = tmp_path / "short.txt"
    short.write_text(text.read_text()[:100])                            # a val split under block_size + 1
    r = eval_cli("--ckpt", str(out / "ckpt_last.npz"), "--data", str(short))
    assert_clear_error(r, "block_size 16 (the checkpoint's) needs at least 17")
    assert "--block_size" not in r.stderr                               # no such option here: the block is fixed
    r = eval_cli("--help")
    assert r.returncode == 0
    for option in ("--ckpt", "--data", "--draws", "--backend"):                   # each with its help line
        line = next(line for line in r.stdout.splitlines() if line.strip().startswith(option + " "))
        assert len(line.split(None, 2)) == 3, line


def test_a_file_that_is_not_a_checkpoint_is_named_so(trained, tmp_path):
    """NumPy takes a text file for a pickle and advises loading it "unsafely": every command says instead that it
    is not a minigpt checkpoint (checkpoint.load is shared)."""
    text, out = trained
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\nhello\n")
    needle = f"{str(notes)!r} is not a minigpt checkpoint (not an .npz archive)"
    export = subprocess.run([sys.executable, "scripts/export_hf.py", "--ckpt", str(notes), "--out",
                             str(tmp_path / "hf")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for r in (sample_cli("--ckpt", str(notes)), eval_cli("--ckpt", str(notes), "--data", str(text)), export):
        assert_clear_error(r, needle)
        assert "pickle" not in r.stderr, r.stderr
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ckpt_last.npz").write_bytes(b"")
    assert_clear_error(train_cli("--data", str(text), "--out_dir", str(tmp_path / "run"), "--resume"),
                       "is not a minigpt checkpoint (it is empty)")


def test_readers_of_a_checkpoint_advise_their_own_options(trained, tmp_path):
    """sample, eval_checkpoint.py and export_hf.py have --ckpt and --out_dir, not --resume: a missing or foreign
    file's message says to pass those."""
    text, out = trained
    missing = str(tmp_path / "none.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    for path, what in ((missing, "does not exist"), (str(tmp_path / "other.npz"), "no minigpt-checkpoint-1 metadata")):
        for r in (sample_cli("--ckpt", path), eval_cli("--ckpt", path, "--data", str(text)),
                  export_cli("--ckpt", path, "--out", str(tmp_path / "hf"))):
            assert_one_error(r, what, "; pass --ckpt FILE", "an --out_dir that holds ckpt_best.npz or ckpt_last.npz")
            assert "--resume" not in r.stderr, r.stderr


def test_unusable_checkpoint_message_ends_in_the_callers_fix(trained, tmp_path):
    """A truncated ckpt_last.npz: the --ckpt commands say to pass another; a caller such as --resume, which reads
    ckpt_last.npz only, passes its own fix."""
    good = trained[1] / "ckpt_last.npz"
    trunc = tmp_path / "ckpt_last.npz"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    fix = "copy out_dir/ckpt_best.npz over ckpt_last.npz to resume from the best one, or start a new --out_dir"
    with pytest.raises(checkpoint.UserError) as e:
        checkpoint.load(str(trunc), fix=fix)
    assert str(e.value).endswith("it may be truncated; " + fix) and "ckpt_best.npz /" not in str(e.value)
    assert_one_error(sample_cli("--ckpt", str(trunc)), "it may be truncated; pass --ckpt FILE")
    np.savez(tmp_path / "meta5.npz", meta=np.frombuffer(b"5", np.uint8))            # JSON, but not a dict
    assert_one_error(sample_cli("--ckpt", str(tmp_path / "meta5.npz")), "not a minigpt checkpoint", "--ckpt FILE")


def test_a_report_snapshot_is_named_so(trained, tmp_path):
    out = trained[1]
    snap = out / outdir.SNAPSHOTS / sorted(os.listdir(out / outdir.SNAPSHOTS))[-1]
    assert_one_error(sample_cli("--ckpt", str(snap)), "is a report snapshot (float16 weights), not a checkpoint",
                     f"pass --ckpt {out / 'ckpt_best.npz'} (or ckpt_last.npz), or --out_dir {out}")
    (tmp_path / "iter_1.npz").write_bytes(snap.read_bytes())                 # outside its run: still named
    assert_one_error(eval_cli("--ckpt", str(tmp_path / "iter_1.npz"), "--data", str(trained[0])),
                     "is a report snapshot (float16 weights)", "ckpt_best.npz or ckpt_last.npz")


@pytest.mark.parametrize("args,needle", [
    (["--temperature=0"], "--temperature must be positive, got 0.0"), (["--temperature=-1"], "--temperature must be"),
    (["--prompt_file=/nonexistent/p.txt"], "--prompt_file '/nonexistent/p.txt' does not exist; pass a UTF-8 text"),
    (["--prompt_file=/tmp"], "--prompt_file '/tmp' is a directory"),
    (["--prompt_file=/dev/null"], "--prompt_file '/dev/null' is not a regular file"),
    (["--prompt="], "the prompt is empty; pass at least one character"),
])
def test_sample_settings_are_checked_before_anything_is_printed(trained, tmp_path, args, needle):
    r = sample_cli("--out_dir", str(trained[1]), "--max_new_tokens=3", *args)
    assert_one_error(r, needle)
    assert r.stdout == ""                                                       # not even the prompt
    assert_one_error(sample_cli("--ckpt", str(tmp_path / "none.npz"), *args), needle)   # before the checkpoint


def test_a_prompt_outside_the_vocabulary_is_the_only_line(trained):
    r = sample_cli("--out_dir", str(trained[1]), "--backend=auto", "--prompt", "\u2603 snow")
    assert_one_error(r, "character(s) are not in the tokenizer's vocabulary", "'\u2603'")   # no backend line first


def test_backend_from_the_environment_is_not_blamed_on_the_flag(trained):
    """MINIGPT_BACKEND=bogus: sample and eval_checkpoint word it as training does."""
    env = {**os.environ, "MINIGPT_BACKEND": "bogus"}
    ckpt = str(trained[1] / "ckpt_last.npz")
    cmds = ([sys.executable, "-m", "minigpt.sample", "--ckpt", ckpt],
            [sys.executable, "scripts/eval_checkpoint.py", "--ckpt", ckpt, "--data", str(trained[0])],
            [sys.executable, "scripts/train_shakespeare.py", *[a for a in TINY if not a.startswith("--backend")],
             "--data", str(trained[0]), "--out_dir", str(trained[1].parent / "bogus")])
    for cmd in cmds:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        assert_one_error(r, "error: MINIGPT_BACKEND='bogus' is not a backend; set it to one of auto, numpy, numba, "
                            "native, or unset it")
        r = subprocess.run(cmd + ["--backend", "bogus2"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env=env)                                              # typed: the flag is named
        assert_one_error(r, "error: --backend must be one of auto, numpy, numba, native; got 'bogus2'")


def test_readers_take_ckpt_best_else_ckpt_last_and_say_which(trained, tmp_path):
    """sample, eval_checkpoint.py and export_hf.py read out_dir/ckpt_best.npz, else ckpt_last.npz, and name it;
    eval_checkpoint.py measures on the run's own --data unless --data is typed."""
    text, out = trained
    only_last = tmp_path / "run"
    only_last.mkdir()
    (only_last / "ckpt_last.npz").write_bytes((out / "ckpt_last.npz").read_bytes())
    for d, name in ((out, "ckpt_best.npz"), (only_last, "ckpt_last.npz")):
        path = str(d / name)
        r = sample_cli("--out_dir", str(d), "--max_new_tokens=3", "--num_samples=2")
        assert r.returncode == 0 and f"{path}: 6 tokens in " in r.stderr and "(2 samples," in r.stderr, r.stderr
        r = eval_cli("--out_dir", str(d), "--draws=1")                         # no --data: the run's
        assert r.returncode == 0 and r.stdout.startswith(f"{path} on {text}: block 16"), r.stdout + r.stderr
        r = export_cli("--out_dir", str(d), "--out", str(tmp_path / f"hf-{name}"))
        assert r.returncode == 0 and f"(from {path})" in r.stdout, r.stdout + r.stderr
    other = tmp_path / "other.txt"
    write_text(other, seed=1)
    r = eval_cli("--out_dir", str(out), "--draws=1", "--data", str(other))     # typed --data wins
    assert r.returncode == 0 and r.stdout.startswith(f"{out / 'ckpt_best.npz'} on {other}:"), r.stdout + r.stderr
    moved = tmp_path / "moved"                                                 # a run whose text is not here
    moved.mkdir()
    meta, params, _ = checkpoint.load(str(out / "ckpt_best.npz"))
    meta["train_config"]["data"] = str(tmp_path / "gone.txt")
    np.savez(moved / "ckpt_best.npz", meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
             **{f"param/{k}": a for k, a in params.items()})
    assert_one_error(eval_cli("--out_dir", str(moved)), f"the run's training text {str(tmp_path / 'gone.txt')!r}",
                     "pass --data PATH")
    empty = tmp_path / "empty"
    empty.mkdir()
    for r in (sample_cli("--out_dir", str(empty)), eval_cli("--out_dir", str(empty)),
              export_cli("--out_dir", str(empty), "--out", str(tmp_path / "hf"))):
        assert_one_error(r, f"no checkpoint in --out_dir {str(empty)!r}", "--ckpt FILE")


def test_eval_checkpoint_needs_the_runs_train_config(trained, tmp_path):
    meta, params, _ = checkpoint.load(str(trained[1] / "ckpt_best.npz"))
    del meta["train_config"]
    np.savez(tmp_path / "bare.npz", meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
             **{f"param/{k}": a for k, a in params.items()})
    assert_one_error(eval_cli("--ckpt", str(tmp_path / "bare.npz"), "--data", str(trained[0])),
                     "has no train_config", "pass a checkpoint that training wrote")


def test_unwritable_out_dir(tmp_path, text):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_clear_error(train_cli("--data", str(text), "--out_dir", str(blocker / "sub")), "cannot write to --out_dir")


@pytest.mark.parametrize("lib,why,fix", [("/nonexistent/libmgk.so", "does not exist", "unset MINIGPT_NATIVE_LIB"),
                                         ("/tmp", "is a directory", "unset MINIGPT_NATIVE_LIB"),
                                         (__file__, "cannot load", "unset MINIGPT_NATIVE_LIB")])   # not a library
def test_unavailable_backend_is_an_error_not_a_fallback(text, lib, why, fix):
    """The reason names the backend once, and the fix is the variable's (not a rebuild) when it named the file."""
    env = {**os.environ, "MINIGPT_NATIVE_LIB": lib}
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *TINY, "--data", str(text), "--backend=native"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert_clear_error(r, f"error: --backend native: MINIGPT_NATIVE_LIB={lib} {why}" if why != "cannot load" else
                       f"error: --backend native: cannot load {lib}", fix)
    assert "native: native" not in r.stderr and "rebuild" not in r.stderr


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
    r = train_cli("--data", str(text), "--out_dir", out, "--resume", "--max_iters=6")
    assert r.returncode == 0 and "no steps are left" not in r.stdout
    with open(os.path.join(out, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]                          # the torn row is gone, the rest kept
    assert [r["iter"] for r in rows if r["kind"] == "train"] == list(range(6))
    r = train_cli("--data", str(text), "--out_dir", out, "--resume", "--max_iters=6")   # again: nothing to train
    assert r.returncode == 0 and "note: iter 6 is --max_iters: no steps are left to train" in r.stdout


def test_run_removes_the_temporaries_a_killed_save_left(trained, tmp_path):
    """A SIGKILL during checkpoint.save leaves a .tmp-*.npz: the next run in that out_dir removes it, and only
    it (not other files, nor a temporary a live writer holds locked); and the temporaries of the log, the report,
    the curve and the snapshots, which a kill leaves too."""
    import fcntl
    text, done = trained
    out = tmp_path / "run"
    out.mkdir()
    for name in ("ckpt_last.npz", "log.jsonl"):
        (out / name).write_bytes((done / name).read_bytes())
    stale = out / ".tmp-killed.npz"
    stale.write_bytes((done / "ckpt_last.npz").read_bytes()[:5000])                # half-written
    keep = [out / ".tmp-notes.txt", out / "tmp-x.npz", out / ".tmp-writing.npz", out / "notes.part"]
    (out / "snapshots").mkdir()
    partial = [out / "log.jsonl.tmp", out / "report.html.part", out / "curve.png.part",    # the other writers'
               out / "snapshots" / "iter_0000004.npz.part"]                               # temporaries
    for f in keep + partial:
        f.write_bytes(b"x" * 10)
    with open(out / ".tmp-writing.npz", "rb") as live:
        fcntl.flock(live, fcntl.LOCK_EX)                                            # as a live save() does
        r = train_cli("--data", str(text), "--out_dir", str(out), "--resume", "--max_iters=6", "--plot=curve.png")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not stale.exists() and all(f.exists() for f in keep) and not any(f.exists() for f in partial)
    assert f"removed 1 temporary checkpoint file(s) that a run killed while saving left in {out}" in r.stdout
    assert ".tmp-killed.npz" in r.stdout
    assert outdir.remove_stale(str(out)) == [(".tmp-writing.npz", 10)]          # unlocked: now stale too


def test_save_retries_a_temporary_removed_before_it_was_locked(tmp_path, monkeypatch):
    """remove_stale may unlink save()'s temporary in the instant between mkstemp and flock: save() then makes
    another, and the checkpoint is written whole."""
    import tempfile
    from minigpt.model import GPT, GPTConfig
    from minigpt.optim import AdamW
    made, mkstemp = [], tempfile.mkstemp

    def racing_mkstemp(**kw):
        fd, path = mkstemp(**kw)
        made.append(path)
        if len(made) == 1:
            assert outdir.remove_stale(str(tmp_path)) == [(os.path.basename(path), 0)]
        return fd, path
    monkeypatch.setattr(tempfile, "mkstemp", racing_mkstemp)
    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=8), np.random.default_rng(0),
                ops=spec())
    checkpoint.save(str(tmp_path / "ckpt.npz"), model, AdamW(model.params(), ops=model.ops), {"iter": 0})
    assert len(made) == 2 and sorted(os.listdir(tmp_path)) == ["ckpt.npz"]
    assert checkpoint.load(str(tmp_path / "ckpt.npz"))[0]["iter"] == 0


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
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "text.npz")), "not a minigpt checkpoint")
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
    assert_clear_error(sample_cli("--ckpt", str(tmp_path / "bare.npy")), "not a minigpt checkpoint")
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
    assert proc.returncode == 128 + sig and "Traceback" not in stderr, stderr     # as a shell reports it
    assert f"{sig.name} at iter" in stdout and "--resume" in stdout
    stopped_at = checkpoint.load(str(out / "ckpt_last.npz"))[0]["iter"]
    assert 20 <= stopped_at < 400
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--out_dir", str(out), "--resume"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _train_losses(out) == _train_losses(straight)               # bit-identical to the uninterrupted run


def test_a_closed_stdout_saves_and_stops_the_run(tmp_path, text):
    """`train | head -3`: when stdout's reader goes away, the loop saves and stops as on a signal (status 141, 128 +
    SIGPIPE), with no traceback, and --resume continues the run to the same losses as an uninterrupted one."""
    args = ["--data", str(text), *TINY[:-5], "--max_iters=400", "--eval_interval=1000", "--eval_iters=1",
            "--sample_chars=0", "--plot=", "--backend=numpy", "--log_interval=1"]
    straight = tmp_path / "straight"
    assert subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--out_dir", str(straight)],
                          cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    out = tmp_path / "run"
    proc = _start([*args, "--out_dir", str(out)])
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()                                                # as head does after its lines
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    stopped_at = checkpoint.load(str(out / "ckpt_last.npz"))[0]["iter"]
    assert 0 < stopped_at < 400
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--out_dir", str(out), "--resume"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _train_losses(out) == _train_losses(straight)


def test_a_closed_stdout_ends_sampling_quietly(trained):
    proc = subprocess.Popen([sys.executable, "-m", "minigpt.sample", "--backend=numpy", "--out_dir", str(trained[1]),
                             "--max_new_tokens=100000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(20)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def test_a_signal_during_the_final_evaluation_stops_after_it(tmp_path, monkeypatch):
    """The final evaluation saves the run's end; a signal that arrives during it stops the command there (no
    plot, sample or report), with the signal's status, instead of being ignored."""
    import minigpt.train as T
    from helpers import tiny_cfg
    whole = T.whole_split_loss

    def interrupted(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)                           # Ctrl-C during the whole-split pass
        return whole(*a, **k)
    monkeypatch.setattr(T, "whole_split_loss", interrupted)
    result = T.train(tiny_cfg(tmp_path, max_iters=4, eval_interval=2))
    assert result["interrupted"] == "SIGINT" and T.interrupted_status(result) == 130
    assert checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["iter"] == 4


@pytest.mark.parametrize("raised,status,err", [(KeyboardInterrupt, 130, "\nstopped by Ctrl-C\n"),
                                               (BrokenPipeError, 141, "")])
def test_commands_stopped_early_end_in_one_line(raised, status, err, capsys, monkeypatch):
    """Ctrl-C outside the training loop (a sample, the report, a BPE's training) is one line and 130; a closed
    stdout is silent and 141, stdout pointed at /dev/null (here recorded instead: the two tests above run it)."""
    import minigpt.config as C
    quieted = []
    monkeypatch.setattr(C, "quiet_stdout", lambda: quieted.append(True))

    def main(argv):
        raise raised()
    assert C.run_command(main, []) == status
    assert capsys.readouterr().err == err and quieted == [True] * (raised is BrokenPipeError)


def test_second_signal_stops_at_once():
    from minigpt.errors import StoppedTwice, exit_code
    from minigpt.train import StopFlag
    before = signal.getsignal(signal.SIGINT)
    stop = StopFlag()
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
    stale = set()
    for attempt in range(3):
        proc = _start(args + (["--resume"] if last.exists() else []))
        _wait_for(lambda: last.exists() and not stale & set(os.listdir(out)), proc)  # the resume removed the
        _wait_for(lambda: not tmp_seen(), proc)                      # kill's temporary; a checkpoint exists
        _wait_for(tmp_seen, proc)                                    # and the next one is being written now
        proc.kill()
        proc.wait()
        meta, params, _ = checkpoint.load(str(last))              # the previous one is intact
        assert all(np.isfinite(p).all() for p in params.values())
        stale = {f for f in os.listdir(out) if f.startswith(".tmp-")}   # never loaded; left for the next run
    r = subprocess.run([sys.executable, "scripts/train_shakespeare.py", *args, "--resume",
                        f"--max_iters={checkpoint.load(str(last))[0]['iter']}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]
    assert ("temporary checkpoint file(s)" in r.stdout) == bool(stale), r.stdout


def test_divergence_stops_with_message_and_keeps_checkpoint(tmp_path, text):
    out = tmp_path / "run"
    r = train_cli("--data", str(text), "--out_dir", str(out), "--lr=1e9", "--warmup_iters=0", "--grad_clip=0",
                  "--max_iters=200", "--eval_interval=1")
    assert_clear_error(r, "non-finite", "at iter", "last finite loss", "ckpt_last.npz", "--resume", code=3,
                       started=True)
    meta, params, _ = checkpoint.load(str(out / "ckpt_last.npz"))
    assert all(np.isfinite(p).all() for p in params.values())


def test_resume_from_a_truncated_ckpt_last_says_how_to_continue(trained, tmp_path):
    """--resume reads ckpt_last.npz alone: the fix it offers for a broken one is the best checkpoint copied over
    it, not another --ckpt (training has none)."""
    text, done = trained
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt_best.npz").write_bytes((done / "ckpt_best.npz").read_bytes())
    last = (done / "ckpt_last.npz").read_bytes()
    (out / "ckpt_last.npz").write_bytes(last[: len(last) // 2])
    r = train_cli("--data", str(text), "--out_dir", str(out), "--resume")
    assert_one_error(r, "it may be truncated", f"copy {out / 'ckpt_best.npz'} over {out / 'ckpt_last.npz'} to resume")
    assert "--ckpt" not in r.stderr
    (out / "ckpt_best.npz").unlink()                                   # no best one to offer: only a new run
    r = train_cli("--data", str(text), "--out_dir", str(out), "--resume")
    assert_one_error(r, "it may be truncated", "start a new --out_dir")
    assert "ckpt_best" not in r.stderr
