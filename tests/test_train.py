"""Training: data, AdamW, schedule, clipping, gradient accumulation, checkpoints, exact resume, the script."""
import json
import math
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, fields

import numpy as np
import pytest

from minigpt import checkpoint
from minigpt.config import PRESETS, ModelShape, TrainConfig, check, parse_args, setting
from minigpt.errors import UserError
from minigpt.data import CharTokenizer, Dataset
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW, clip_grad_norm, get_lr
from minigpt.outdir import OutDir
from minigpt.train import train, whole_split_loss
from helpers import TINY_TRAIN, spec, tiny_cfg, write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------
# data

def test_tokenizer_round_trip_and_batches(tmp_path):
    text = write_text(tmp_path / "t.txt")
    tok = CharTokenizer.from_text(text)
    assert tok.chars == sorted(set(text))
    ids = tok.encode(text)
    assert ids.dtype == np.uint16 and tok.decode(ids) == text
    assert CharTokenizer.from_json(tok.to_json()).chars == tok.chars
    ds = Dataset(text, tok, 8)
    assert len(ds.splits["train"]) == int(0.9 * len(text))
    x, y = ds.batch("val", 5, 8, np.random.default_rng(0))
    assert x.shape == y.shape == (5, 8)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])                  # y is x shifted by one
    val = ds.splits["val"]
    for row in x:                                                       # every row is a window of the val split
        assert any((val[s:s + 8] == row).all() for s in range(len(val) - 8))
    with pytest.raises(UserError, match=r"'#', '@'"):
        tok.encode("to be @#")


# ----------------------------------------------------------------------------
# optimizer and schedule

def test_adamw_matches_hand_computed_step():
    p = {"w": np.array([[1.0, -2.0]]), "b": np.array([0.5])}
    g = {"w": np.array([[0.1, 0.3]]), "b": np.array([-0.2])}
    opt = AdamW(p, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, ops=spec())
    opt.step(p, g, lr=0.01)
    # step 1: m = 0.1 g, v = 0.01 g^2, m_hat = g, v_hat = g^2 -> update = lr * g / (|g| + eps)
    w_want = np.array([[1.0, -2.0]]) * (1 - 0.01 * 0.1) - 0.01 * np.array([0.1, 0.3]) / (np.array([0.1, 0.3]) + 1e-8)
    np.testing.assert_allclose(p["w"], w_want, rtol=1e-12)
    np.testing.assert_allclose(p["b"], [0.5 + 0.01 * 0.2 / (0.2 + 1e-8)], rtol=1e-12)   # no decay on 1-D
    opt.step(p, g, lr=0.01)                                             # step 2: bias correction
    m, v = 0.19 * 0.3, 0.0199 * 0.09
    want = w_want[0, 1] * (1 - 1e-3) - 0.01 * (m / 0.19) / (math.sqrt(v / 0.0199) + 1e-8)
    np.testing.assert_allclose(p["w"][0, 1], want, rtol=1e-12)


def test_adamw_matches_the_textbook_over_steps_with_changing_gradients():
    """Three steps, each with its own gradient and lr (one gradient repeated, as above, hides the moments: m_hat
    is then g at every step), against AdamW's formulas written out in float64, every element."""
    rng = np.random.default_rng(3)
    p = {"w": rng.standard_normal((3, 5)), "b": rng.standard_normal(5)}
    want = {k: v.copy() for k, v in p.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    opt = AdamW(p, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.3, ops=spec())
    for t, lr in enumerate((0.01, 0.03, 0.002), start=1):
        g = {k: rng.standard_normal(x.shape) * 10.0 ** rng.integers(-3, 2, x.shape) for k, x in p.items()}
        opt.step(p, g, lr=lr)
        for k in p:
            m[k] = 0.8 * m[k] + 0.2 * g[k]
            v2[k] = 0.95 * v2[k] + 0.05 * g[k] ** 2
            decay = 0.3 if k == "w" else 0.0                                # matrices only
            want[k] = want[k] * (1 - lr * decay) - lr * (m[k] / (1 - 0.8 ** t)) / (
                np.sqrt(v2[k] / (1 - 0.95 ** t)) + 1e-6)
            np.testing.assert_allclose(p[k], want[k], rtol=1e-12, atol=1e-15, err_msg=f"{k} at step {t}")


def test_weight_decay_only_on_matrices_and_embeddings():
    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4), np.random.default_rng(0),
                ops=spec())
    decay = AdamW(model.params(), ops=model.ops).decay
    assert {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight"} <= decay
    assert not any(k.endswith(".bias") or ".ln_" in k or k.startswith("ln_f") for k in decay)


def test_lr_schedule_endpoints():
    kw = dict(lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000)
    assert get_lr(0, **kw) == pytest.approx(1e-3 / 101)                # non-zero at step 0
    assert get_lr(100, **kw) == pytest.approx(1e-3)                     # peak after warmup
    assert get_lr(1050, **kw) == pytest.approx(5.5e-4)                  # cosine midpoint
    assert get_lr(2000, **kw) == pytest.approx(1e-4)
    assert get_lr(5000, **kw) == pytest.approx(1e-4)
    lrs = [get_lr(i, **kw) for i in range(2001)]
    assert all(a <= b for a, b in zip(lrs[:100], lrs[1:101])) and all(a >= b for a, b in zip(lrs[100:], lrs[101:]))


def test_lr_schedule_trapezoid():
    """--cooldown 0.4: warmup as before, the peak held to 60% of lr_decay_iters, then a straight line to min_lr;
    --cooldown 1: the line starts where warmup ends."""
    kw = dict(lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000)
    assert get_lr(0, **kw, cooldown=0.4) == get_lr(0, **kw)                  # the same warmup
    assert [get_lr(i, **kw, cooldown=0.4) for i in (100, 700, 1200)] == [1e-3] * 3
    assert get_lr(1600, **kw, cooldown=0.4) == pytest.approx(5.5e-4)          # halfway down the line
    assert get_lr(1900, **kw, cooldown=0.4) == pytest.approx(2.125e-4)        # seven eighths down
    assert get_lr(2000, **kw, cooldown=0.4) == get_lr(3000, **kw, cooldown=0.4) == pytest.approx(1e-4)
    assert get_lr(1050, **kw, cooldown=1.0) == pytest.approx(5.5e-4)          # from warmup's end: 100 -> 2000
    lrs = [get_lr(i, **kw, cooldown=0.4) for i in range(2001)]
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))


def test_clip_grad_norm():
    g = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert clip_grad_norm(g, 1.0) == pytest.approx(5.0)
    assert math.sqrt(sum((v ** 2).sum() for v in g.values())) == pytest.approx(1.0, rel=1e-5)
    g = {"a": np.array([0.3, 0.4])}
    assert clip_grad_norm(g, 1.0) == pytest.approx(0.5) and g["a"][1] == 0.4   # under the limit: untouched


def test_gradient_accumulation_equals_full_batch():
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (6, 8)), rng.integers(0, 11, (6, 8))
    full = GPT(cfg, np.random.default_rng(1), dtype=np.float64, ops=spec())
    full.zero_grad(); full.forward(x, y); full.backward()
    acc = GPT(cfg, np.random.default_rng(1), dtype=np.float64, ops=spec())
    acc.zero_grad()
    for k in range(3):                                                  # 3 micro-batches of 2
        acc.forward(x[2 * k:2 * k + 2], y[2 * k:2 * k + 2])
        acc.backward(scale=1 / 3)
    for name, g in full.grads().items():
        np.testing.assert_allclose(acc.grads()[name], g, rtol=1e-10, atol=1e-14, err_msg=name)


def test_whole_split_loss_counts_every_target_once(rng):
    """Against a float64 reference that scores each target with the context of its block, tail included."""
    cfg = GPTConfig(vocab_size=7, block_size=5, n_layer=1, n_head=1, n_embd=8)
    model = GPT(cfg, rng, dtype=np.float64, ops=spec())
    ids = rng.integers(0, 7, 23).astype(np.uint16)             # 22 targets: 4 blocks of 5 and a tail of 2
    nll = []
    for s in range(0, 22, 5):
        x = ids[None, s:min(s + 5, 22)].astype(np.int32)
        logits = model.forward(x)[0][0].astype(np.float64)      # (t, V)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        nll += list(-logp[np.arange(x.shape[1]), ids[s + 1:s + 1 + x.shape[1]]])
    assert len(nll) == 22
    for batch in (1, 3, 8):
        assert whole_split_loss(model, ids, 5, batch) == pytest.approx(np.mean(nll), rel=1e-12)
    for few in (ids[:1], ids[:0]):                              # no target: an error, not nan
        with pytest.raises(ValueError, match="hold no target"):
            whole_split_loss(model, few, 5, 1)


# ----------------------------------------------------------------------------
# the loop, checkpoints, resume

def test_training_loss_falls_and_logs(tmp_path):
    cfg = tiny_cfg(tmp_path, max_iters=60, eval_interval=30, lr_decay_iters=60, lr=1e-2, min_lr=1e-3)
    res = train(cfg)
    rows = read_log(res["log"])
    evals = [r for r in rows if r["kind"] == "eval"]
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["iter"] for r in evals] == [0, 30, 60] and len(steps) == 60
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert set(steps[0]) == {"iter", "kind", "loss", "lr", "grad_norm", "elapsed", "ms", "tokens_per_s", "rss_mb"}
    assert "val_loss_full" in evals[-1] and "val_loss_full" not in evals[0]         # the whole split at the end
    assert evals[-1]["val_bpc"] == pytest.approx(evals[-1]["val_loss_full"] / math.log(2))   # chars: 1 per token
    assert abs(evals[-1]["val_loss_full"] - evals[-1]["val_loss"]) < 0.2
    assert os.path.exists(tmp_path / "out" / "ckpt_best.npz") and os.path.exists(tmp_path / "out" / "ckpt_last.npz")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_train_steps_equal_a_hand_replay(tmp_path, optimizer):
    """train()'s steps, replayed by hand from the same seeds with the library's parts: grad_accum micro-batches,
    each backward seeded with 1/grad_accum, clipping (which binds here), the optimizer built from the settings
    (betas, weight decay, the embeddings' lr ratio; Muon's ratio and warmup) and stepped at the schedule's lr.
    The log's loss, gradient norm and lr, and the last checkpoint's weights, match to the bit: a loop that
    ignored --grad_accum, --grad_clip, a setting of the optimizer or the schedule would not."""
    from minigpt.data import load_text
    from minigpt.optim import Muon
    settings = dict(max_iters=3, eval_interval=3, grad_accum=3, grad_clip=0.05, beta1=0.8, beta2=0.95,
                    weight_decay=0.3, warmup_iters=2, lr_decay_iters=3, embed_lr_ratio=2.0, optimizer=optimizer,
                    muon_lr_ratio=7.0, muon_momentum_warmup=2)
    cfg = tiny_cfg(tmp_path, **settings)
    rows = [r for r in read_log(train(cfg)["log"]) if r["kind"] == "train"]
    text = load_text(cfg.data)
    tok = CharTokenizer.from_text(text)
    data = Dataset(text, tok, cfg.block_size)
    model = GPT(cfg.model_config(tok.vocab_size), np.random.default_rng([cfg.seed, 0]), ops=spec())   # cfg's
    if optimizer == "muon":
        opt = Muon(model.params(), lr_ratio=7.0, betas=(0.8, 0.95), weight_decay=0.3, muon_weight_decay=0.3,
                   momentum_warmup=2, ops=model.ops)
    else:
        opt = AdamW(model.params(), (0.8, 0.95), weight_decay=0.3, ops=model.ops)
    opt.scale_lr(("wte.weight", "wpe.weight"), 2.0)
    batches = np.random.default_rng([cfg.seed, 1])
    for it, row in enumerate(rows):
        lr = get_lr(it, cfg.lr, cfg.min_lr, 2, 3)
        model.zero_grad()
        loss = 0.0
        for _ in range(3):
            x, y = data.batch("train", cfg.batch_size, cfg.block_size, batches)
            loss += model.forward(x, y)[1] / 3
            model.backward(scale=1.0 / 3)
        gnorm = clip_grad_norm(model.grad_memory, 0.05)
        assert gnorm > 0.05 * 2                                         # the clip binds
        opt.step(model.params(), model.grads(), lr)
        assert (row["loss"], row["grad_norm"], row["lr"]) == (loss, gnorm, lr), it
    assert len(rows) == 3
    _, params, _ = checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))
    for k, v in model.params().items():
        np.testing.assert_array_equal(params[k], v, err_msg=k)


def test_checkpoint_round_trip_restores_every_array(tmp_path):
    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=4), np.random.default_rng(0),
                ops=spec())
    opt = AdamW(model.params(), ops=model.ops)
    for k, g in model.grads().items():
        g[...] = np.random.default_rng(1).standard_normal(g.shape)
    opt.step(model.params(), model.grads(), 1e-3)
    path = str(tmp_path / "c.npz")
    checkpoint.save(path, model, opt, {"iter": 7, "rng": model.rng.bit_generator.state})
    meta, params, state = checkpoint.load(path)
    assert meta["iter"] == 7 and state["t"] == 1 and meta["rng"] == model.rng.bit_generator.state
    assert state["name"] == "adamw" and set(state["slots"]) == {"m", "v"}
    m, v = state["slots"]["m"], state["slots"]["v"]
    for k, p in model.params().items():
        assert params[k].dtype == p.dtype
        np.testing.assert_array_equal(params[k], p)
        np.testing.assert_array_equal(m[k], opt.m[k])
        np.testing.assert_array_equal(v[k], opt.v[k])
    with np.load(path) as z:                                           # keys name the optimizer that wrote them
        assert "adamw.m/wte.weight" in z.files and "adamw.v/wte.weight" in z.files
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]    # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask               # a normal file, not mkstemp's 0600


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_resume_is_bit_identical(tmp_path, dropout):
    straight = train(tiny_cfg(tmp_path / "a", dropout=dropout, max_iters=10))
    train(tiny_cfg(tmp_path / "b", dropout=dropout, max_iters=6))
    resumed = train(tiny_cfg(tmp_path / "b", dropout=dropout, max_iters=10, resume=True))
    a = [r for r in read_log(straight["log"]) if r["kind"] == "train"]
    b = [r for r in read_log(resumed["log"]) if r["kind"] == "train"]
    assert [r["iter"] for r in b] == list(range(10))                   # the log was not duplicated
    assert [r["loss"] for r in a] == [r["loss"] for r in b]            # bit-identical, not approximately
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    for k, p in straight["model"].params().items():
        np.testing.assert_array_equal(resumed["model"].params()[k], p)


def test_cli_resume_keeps_the_runs_settings(tmp_path):
    """`--out_dir D --resume --max_iters N` continues the run as it was set up (data, lr, batch, ...), and is
    bit-identical to the same N iterations in one run; a setting typed again wins."""
    from minigpt.train import main
    data = tmp_path / "text.txt"
    write_text(data)
    flags = [f"--{k}={v}" for k, v in TINY_TRAIN.items() if k not in ("max_iters", "plot")] + ["--plot="]
    assert main(flags + ["--data", str(data), "--out_dir", str(tmp_path / "a"), "--max_iters", "8"]) == 0
    assert main(flags + ["--data", str(data), "--out_dir", str(tmp_path / "b"), "--max_iters", "5"]) == 0
    assert main(["--out_dir", str(tmp_path / "b"), "--resume", "--max_iters", "8"]) == 0   # nothing else typed
    a, b = (read_log(str(tmp_path / d / "log.jsonl")) for d in ("a", "b"))
    assert [r.get("loss") for r in a] == [r.get("loss") for r in b]
    meta = checkpoint.load(str(tmp_path / "b" / "ckpt_last.npz"))[0]
    assert meta["train_config"]["data"] == str(data) and meta["train_config"]["lr"] == TINY_TRAIN["lr"]
    assert meta["iter"] == 8 and meta["train_config"]["max_iters"] == 8


def test_train_module_says_it_ignores_the_scripts_settings(tmp_path, capsys):
    """python -m minigpt.train trains only: a typed --plot, --report or --sample_chars gets one note line."""
    from minigpt.train import main
    data = tmp_path / "text.txt"
    write_text(data)
    flags = [f"--{k}={v}" for k, v in TINY_TRAIN.items() if k not in ("max_iters", "plot", "sample_chars")]
    flags += ["--data", str(data), "--max_iters=1"]
    assert main(flags + ["--out_dir", str(tmp_path / "a"), "--plot=", "--sample_chars=0"]) == 0
    assert "note: python -m minigpt.train" not in capsys.readouterr().out        # none asked for: nothing said
    assert main(flags + ["--out_dir", str(tmp_path / "b"), "--plot=c.png", "--report", "--sample_chars=9"]) == 0
    out = capsys.readouterr().out
    assert "note: python -m minigpt.train does not plot, sample or report: --plot, --report, --sample_chars " \
           "ignored" in out
    assert not (tmp_path / "b" / "c.png").exists() and not (tmp_path / "b" / "report.html").exists()


def test_backend_comes_from_the_environment_unless_typed(monkeypatch):
    from minigpt.config import check
    from minigpt.sample import SampleConfig
    monkeypatch.setenv("MINIGPT_BACKEND", "numpy")
    assert parse_args([]).backend == "numpy" and SampleConfig().backend == "numpy"
    assert parse_args(["--backend", "native"]).backend == "native"
    monkeypatch.setenv("MINIGPT_BACKEND", "gpu")
    with pytest.raises(UserError, match="MINIGPT_BACKEND"):
        check(parse_args([]))
    monkeypatch.delenv("MINIGPT_BACKEND")
    assert parse_args([]).backend == "auto"


def test_cli_overrides_and_errors():
    cfg = parse_args(["--n_layer", "6", "--lr=3e-4", "--bias", "--resume=false", "--data", "x.txt"])
    assert (cfg.n_layer, cfg.lr, cfg.bias, cfg.resume, cfg.data) == (6, 3e-4, True, False, "x.txt")
    assert cfg.given == {"n_layer", "lr", "bias", "resume", "data"}
    assert TrainConfig().n_embd == 128
    cfg = parse_args(["--n-embd=64", "--tie-weights", "no", "--plot=", "--lr", "-1", "--bias", "on"], n_embd=32, seed=7)
    assert (cfg.n_embd, cfg.tie_weights, cfg.plot, cfg.lr, cfg.bias, cfg.seed) == (64, False, "", -1.0, True, 7)
    assert cfg.given == {"tie_weights", "plot", "lr", "bias"}         # not the keys passed as defaults
    with pytest.raises(UserError, match="did you mean --n_layer"):
        parse_args(["--n_layers", "6"])
    with pytest.raises(UserError, match=r"unknown setting --n_layr; did you mean --n_layer\?"):
        parse_args(["--n-layr=2"])
    with pytest.raises(UserError, match="--n_layer expects an integer, got 'six'"):
        parse_args(["--n_layer=six"])
    with pytest.raises(UserError, match="--lr expects a number, got 'inf'"):
        parse_args(["--lr", "inf"])
    with pytest.raises(UserError, match="--bias expects true or false, got 'maybe'"):
        parse_args(["--bias", "maybe"])
    with pytest.raises(UserError, match="--lr needs a value"):
        parse_args(["--lr"])
    with pytest.raises(UserError, match="--data needs a value"):
        parse_args(["--data", "--lr=1"])
    with pytest.raises(UserError, match="unexpected argument 'x.txt'"):
        parse_args(["x.txt"])


def test_every_setting_has_one_line_of_help():
    for f in fields(TrainConfig):                                      # a new field needs setting(default, help)
        text = f.metadata.get("help", "")
        assert text.strip() and "\n" not in text, f"TrainConfig.{f.name} has no one-line help: use setting()"


def shown(v):                                                           # how --help prints a default
    return str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, str) else str(v)


@pytest.mark.parametrize("script", sorted(p.name for p in (pathlib.Path(ROOT) / "scripts").glob("*.py")))
def test_every_script_answers_help(script):
    """Every file in scripts/ answers --help at once with exit status 0: the commands with their usage, the two
    sibling modules (imported by the others) with what they are for."""
    r = subprocess.run([sys.executable, f"scripts/{script}", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    module = script in ("bench_util.py", "torch_twin.py")
    assert r.stdout.startswith("usage:") != module and len(r.stdout.split()) > 20, r.stdout[:500]


@pytest.mark.parametrize("cmd", [["scripts/train_shakespeare.py"], ["-m", "minigpt.train"]])
def test_help_lists_every_setting_and_exits_0(cmd, monkeypatch):
    monkeypatch.delenv("MINIGPT_BACKEND", raising=False)
    r = subprocess.run([sys.executable, *cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr
    text = " ".join(r.stdout.split())                                   # argparse wraps to the terminal width
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        assert f"--{f.name} " in text, f.name
        assert f"{f.metadata['help']} (default: {shown(getattr(defaults, f.name))})" in text, f.name
    assert "MINIGPT_BACKEND" in text and "(default: 'loss_curve.png')" in text


def test_parse_args_works_for_any_dataclass_and_help_shows_given_defaults(capsys):
    @dataclass
    class Other:
        name: str = setting("x", "a name")
        k: int = setting(lambda: 3, "made per config, 100% fresh")    # a callable default is a factory
        fast: bool = setting(False, "go fast")
    cfg = parse_args(["--fast", "--name", "y"], Other)
    assert (cfg.name, cfg.k, cfg.fast, cfg.given) == ("y", 3, True, {"fast", "name"})
    with pytest.raises(UserError, match="did you mean --fast"):
        parse_args(["--fats"], Other)
    with pytest.raises(SystemExit) as e:
        parse_args(["-h"], Other, prog="other", description="Other things.", k=5)
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and out.startswith("usage: other") and "Other things." in out
    assert "--k INT made per config, 100% fresh (default: 5)" in out and "--fast [BOOL] go fast (default: false)" in out


def test_plot_goes_into_out_dir():
    """--plot names a file inside --out_dir; a path that leaves it is refused before anything is written."""
    curve = lambda cfg: OutDir(cfg.out_dir).curve(cfg.plot)                            # noqa: E731
    assert curve(TrainConfig()) == os.path.join("out", "loss_curve.png")
    assert curve(TrainConfig(out_dir="runs/a", plot="curve.png")) == os.path.join("runs/a", "curve.png")
    assert curve(TrainConfig(out_dir="runs/a", plot="plots/c.png")) == os.path.join("runs/a", "plots/c.png")
    assert curve(TrainConfig(plot="")) is None
    for plot in ("/tmp/c.png", "../c.png", "plots/../../c.png"):
        with pytest.raises(UserError, match="lies outside --out_dir.*plot_losses.py"):
            check(TrainConfig(plot=plot))
    check(TrainConfig(plot="plots/../c.png"))                          # stays inside


def test_train_shakespeare_script_smoke(tmp_path):
    data = tmp_path / "text.txt"
    write_text(data)
    out = tmp_path / "run"
    png = out / "plots" / "curve.png"
    cmd = [sys.executable, "scripts/train_shakespeare.py", "--data", str(data), "--out_dir", str(out),
           "--plot", "plots/curve.png", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
           "--max_iters=6", "--eval_interval=3", "--eval_iters=2", "--sample_chars=50", "--backend=numpy"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "---- sample ----" in r.stdout and "val loss" in r.stdout
    assert len(read_log(out / "log.jsonl")) == 6 + 3
    assert (out / "ckpt_last.npz").exists() and png.stat().st_size > 10_000
    ev = subprocess.run([sys.executable, "scripts/eval_checkpoint.py", "--ckpt", str(out / "ckpt_last.npz"),
                         "--data", str(data), "--draws", "2", "--backend", "numpy"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr
    from minigpt.sample import load_model                               # the script reports the loop's measure
    model, tok = load_model(str(out / "ckpt_last.npz"), ops=spec())
    ids = Dataset(data.read_text(), tok, 16).splits["val"]
    assert f"val  : whole split {whole_split_loss(model, ids, 16, 4):.4f}" in ev.stdout
    short = subprocess.run([sys.executable, "scripts/eval_checkpoint.py", "--ckpt", str(out / "ckpt_last.npz"),
                            "--data", str(data), "--draws", "0", "--context", "5", "--splits", "val",
                            "--backend", "numpy"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert short.returncode == 0, short.stderr                          # blocks of 5: the shorter context's loss
    assert short.stdout.splitlines()[1:] == [f"val  : whole split {whole_split_loss(model, ids, 5, 4):.4f} "
                                             f"({len(ids):,} tokens)"]


def test_default_run_writes_only_into_out_dir(tmp_path):
    """The default --plot lands in out_dir; a run writes nothing else (no reports/, nothing in the cwd)."""
    data = tmp_path / "text.txt"
    write_text(data)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train_shakespeare.py"), "--data", str(data),
           "--out_dir", "run", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
           "--max_iters=4", "--eval_interval=2", "--eval_iters=1", "--sample_chars=0", "--backend=numpy"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "loss_curve.png").stat().st_size > 10_000
    assert f"loss curve: {os.path.join('run', 'loss_curve.png')}" in r.stdout
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert {w for w in written if not w.startswith("run" + os.sep)} == {"text.txt"}


def test_the_package_never_imports_torch():
    """PyTorch is not a dependency: the twin lives in scripts/, and no module of the package imports it."""
    code = ("import sys, minigpt.model, minigpt.train, minigpt.sample, minigpt.checkpoint, minigpt.backends; "
            "from minigpt import backends; backends.load('auto', verbose=False); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ----------------------------------------------------------------------------
# a time budget; the BPE tokenizer in a run

@pytest.mark.parametrize("cooldown", [0.0, 0.5])
def test_max_time_ends_the_run_and_lays_the_schedule_over_the_budget(tmp_path, capsys, cooldown):
    cfg = tiny_cfg(tmp_path, max_time=1.5, max_iters=10 ** 6, eval_interval=10 ** 6, lr_decay_iters=100,
                   warmup_iters=10, cooldown=cooldown)
    res = train(cfg)
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ") and "|" in line]
    assert progress and all("/1.5 s |" in line and "/1000000" not in line for line in progress), progress
    rows = read_log(res["log"])
    steps = [r for r in rows if r["kind"] == "train"]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert 1.5 <= final["elapsed"] < 6.0 and final["iter"] == res["iter"] == len(steps) > 20
    for r in steps:                                             # lr = the schedule at the elapsed fraction
        assert r["lr"] == pytest.approx(get_lr(100 * r["elapsed"] / 1.5, cfg.lr, cfg.min_lr, 10, 100, cooldown),
                                        rel=1e-9)
    # warmed up, then decayed; only the trapezoid holds its peak
    assert steps[0]["lr"] < cfg.lr / 5 and steps[-1]["lr"] < (cfg.lr / 2 if cooldown else cfg.min_lr * 1.5)
    assert any(r["lr"] == cfg.lr for r in steps) == bool(cooldown)
    assert "val_loss_full" in final


def test_resume_spends_what_is_left_of_the_budget(tmp_path):
    cfg = tiny_cfg(tmp_path, max_time=2.0, max_iters=15, eval_interval=5)
    first = train(cfg)                                          # stopped by the cap, well inside the budget
    spent = checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["elapsed"]
    assert first["iter"] == 15 and 0 < spent < 2.0
    again = tiny_cfg(tmp_path, max_time=2.0, max_iters=10 ** 6, eval_interval=5, resume=True)
    res = train(again)
    steps = [r for r in read_log(res["log"]) if r["kind"] == "train"]
    assert steps[15]["elapsed"] >= spent                        # the clock goes on from the checkpoint
    final = [r for r in read_log(res["log"]) if r["kind"] == "eval"][-1]
    assert 2.0 <= final["elapsed"] < 6.0


def test_bpe_run_saves_its_tokenizer_and_samples(tmp_path):
    from minigpt.bpe import BPETokenizer
    from minigpt.sample import load_model
    cfg = tiny_cfg(tmp_path, tokenizer="bpe", vocab_size=300, max_iters=8)
    res = train(cfg)
    assert isinstance(res["tokenizer"], BPETokenizer) and res["tokenizer"].vocab_size == 300
    model, tok = load_model(str(tmp_path / "out" / "ckpt_last.npz"), ops=spec())
    assert isinstance(tok, BPETokenizer) and model.config.vocab_size == 300
    final = [r for r in read_log(res["log"]) if r["kind"] == "eval"][-1]
    val_text = open(cfg.data, encoding="utf-8").read()[int(0.9 * len(open(cfg.data, encoding="utf-8").read())):]
    n_targets = len(tok.encode(val_text)) - 1                  # bits per character over the same characters
    assert final["val_bpc"] == pytest.approx(final["val_loss_full"] * n_targets / (len(val_text) - len(
        tok.decode(tok.encode(val_text)[:1]))) / math.log(2), rel=1e-9)
    r = subprocess.run([sys.executable, "-m", "minigpt.sample", "--ckpt", str(tmp_path / "out" / "ckpt_last.npz"),
                        "--max_new_tokens=20", "--prompt", "Good lord ünicode ✓", "--backend=numpy"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("Good lord ünicode ✓"), r.stderr
    with pytest.raises(UserError, match="--tokenizer char does not match the resumed run's tokenizer=bpe"):
        train(parse_args(["--data", cfg.data, "--out_dir", cfg.out_dir, "--resume", "--tokenizer", "char"]),
              given={"tokenizer", "resume", "data", "out_dir"})


def test_muon_run_resumes_exactly_and_refuses_another_optimizer(tmp_path):
    straight = train(tiny_cfg(tmp_path / "a", optimizer="muon", max_iters=12, eval_interval=6))
    train(tiny_cfg(tmp_path / "b", optimizer="muon", max_iters=6, eval_interval=6))
    res = train(tiny_cfg(tmp_path / "b", optimizer="muon", max_iters=12, eval_interval=6, resume=True))
    losses = [[r["loss"] for r in read_log(x["log"]) if r["kind"] == "train"] for x in (straight, res)]
    assert losses[0] == losses[1] and len(losses[0]) == 12
    meta, _, state = checkpoint.load(str(tmp_path / "b" / "out" / "ckpt_last.npz"))
    slots = state["slots"]
    assert meta["train_config"]["optimizer"] == "muon" and "h.0.mlp.c_fc.weight" in slots["momentum"]
    assert "h.0.mlp.c_fc.weight" not in slots["v"] and "wte.weight" in slots["v"]   # Muon's matrices: no moments
    with pytest.raises(UserError, match="the run used --optimizer muon"):
        train(tiny_cfg(tmp_path / "b", optimizer="adamw", max_iters=14, resume=True))


def test_preset_sets_defaults_that_typed_settings_override():
    from minigpt.config import PRESETS
    cfg = parse_args(["--preset", "speedrun", "--lr", "2e-3", "--max_time", "10"])
    for k, v in PRESETS["speedrun"].items():
        assert getattr(cfg, k) == (2e-3 if k == "lr" else v), k
    assert cfg.max_time == 10 and cfg.given == {"preset", "lr", "max_time"} | PRESETS["speedrun"].keys()
    with pytest.raises(UserError, match="unknown --preset 'fast'; choose one of speedrun"):
        parse_args(["--preset", "fast"])
    with pytest.raises(UserError, match="--preset speedrun trains to a time budget: add --max_time"):
        check(parse_args(["--preset", "speedrun"]))


def test_preset_typed_on_resume_wins_over_the_checkpoint(tmp_path):
    """Its settings count as typed: its Muon meets an AdamW checkpoint of the preset's model, a model setting
    typed beside it (--qk_norm) the preset's model without it, its block (128) a model of block 16, and its untied
    head a tied model; each is a clear error, whose fix names what set the value: the typed setting, or the preset."""
    model = {k: v for k, v in PRESETS["speedrun"].items() if k in ModelShape().model_dict()}
    assert model == {"block_size": 128, "tie_weights": False}
    for sub, kw, extra, match in (("a", model, ["--qk_norm", "true"], "--qk_norm true does not match the resumed "
                                   r"model's qk_norm=false \(.*\); drop --qk_norm or start"),
                                  ("c", {"block_size": 16, "tie_weights": False}, [], "--block_size 128 does not "
                                   r"match the resumed model's block_size=16 \(.*\); drop --preset speedrun, which "
                                   "sets block_size=128 or start a new --out_dir"),
                                  ("d", {"block_size": 128}, [], "--tie_weights false does not match the resumed "
                                   r"model's tie_weights=true \(.*\); drop --preset speedrun, which sets "
                                   "tie_weights=false or start a new --out_dir"),
                                  ("b", model, [], "the run used --optimizer adamw")):
        cfg = tiny_cfg(tmp_path / sub, max_iters=4, eval_interval=4, **kw)
        train(cfg)
        args = parse_args(["--data", cfg.data, "--out_dir", cfg.out_dir, "--resume", "--preset", "speedrun",
                           "--max_time", "5", *extra])
        with pytest.raises(UserError, match=match):
            train(args, given=args.given)


def test_vocab_size_without_bpe_and_a_spent_budget_are_errors(tmp_path):
    cfg = tiny_cfg(tmp_path)
    with pytest.raises(UserError, match="--vocab_size sets the size of a BPE vocabulary.*add --tokenizer bpe"):
        train(cfg, given={"vocab_size"})
    train(tiny_cfg(tmp_path, max_time=0.3, max_iters=10 ** 6, eval_interval=10 ** 6))
    again = parse_args(["--data", cfg.data, "--out_dir", cfg.out_dir, "--resume"])
    with pytest.raises(UserError, match="has spent its time budget.*raise --max_time"):
        train(again, given=again.given)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_checkpoints_from_before_named_optimizer_state_still_resume(tmp_path, optimizer):
    """Before, every optimizer saved under adam_m/ and adam_v/ with meta adam_t (Muon's momentum in adam_m):
    such a checkpoint resumes to the same run as the new format."""
    straight = train(tiny_cfg(tmp_path / "a", optimizer=optimizer, max_iters=8, eval_interval=4))
    train(tiny_cfg(tmp_path / "b", optimizer=optimizer, max_iters=4, eval_interval=4))
    path = tmp_path / "b" / "out" / "ckpt_last.npz"
    with np.load(path) as z:
        files = {k: z[k] for k in z.files}
    meta = json.loads(files.pop("meta").tobytes().decode())
    meta["adam_t"] = meta.pop("opt_t")
    del meta["optimizer"]
    old = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    for k, a in files.items():
        group, _, name = k.partition("/")
        slot = group.partition(".")[2]
        old[{"m": "adam_m", "momentum": "adam_m", "v": "adam_v"}.get(slot, group) + "/" + name] = a
    np.savez(path, **old)
    res = train(tiny_cfg(tmp_path / "b", optimizer=optimizer, max_iters=8, eval_interval=4, resume=True))
    losses = [[r["loss"] for r in read_log(x["log"]) if r["kind"] == "train"] for x in (straight, res)]
    assert losses[0] == losses[1] and len(losses[0]) == 8


def test_checkpoints_from_before_the_speedrun_options_still_resume(tmp_path):
    """A checkpoint whose configs predate --activation, --qk_norm, --logit_cap, --zero_init_proj,
    --muon_momentum_warmup, --embed_lr_ratio and --cooldown resumes with them off, to the same run as one without the
    cut."""
    new = ("activation", "qk_norm", "logit_cap", "zero_init_proj", "muon_momentum_warmup", "embed_lr_ratio", "cooldown")
    straight = train(tiny_cfg(tmp_path / "a", optimizer="muon", max_iters=8, eval_interval=4))
    train(tiny_cfg(tmp_path / "b", optimizer="muon", max_iters=4, eval_interval=4))
    path = tmp_path / "b" / "out" / "ckpt_last.npz"
    with np.load(path) as z:
        files = {k: z[k] for k in z.files}
    meta = json.loads(files["meta"].tobytes().decode())
    for part in ("model_config", "train_config"):
        meta[part] = {k: v for k, v in meta[part].items() if k not in new}
    files["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **files)
    cfg = parse_args(["--out_dir", str(tmp_path / "b" / "out"), "--resume", "--max_iters", "8"])
    res = train(cfg, given=cfg.given)
    losses = [[r["loss"] for r in read_log(x["log"]) if r["kind"] == "train"] for x in (straight, res)]
    assert losses[0] == losses[1] and len(losses[0]) == 8


def test_a_new_run_in_a_used_out_dir_replaces_the_old_runs_log_and_snapshots(tmp_path, capsys):
    """Without --resume, a run in an out_dir that holds another starts over there: its log and snapshots are
    its own (the old run's go, its checkpoints too), and it says so."""
    first = train(tiny_cfg(tmp_path, max_iters=12, eval_interval=4, snapshots=3))
    assert OutDir(str(tmp_path / "out")).snapshot_iters() == [0, 8, 12]
    capsys.readouterr()
    second = train(tiny_cfg(tmp_path, max_iters=6, eval_interval=3, snapshots=2, seed=7))
    assert "held a run" in capsys.readouterr().out
    assert [r["iter"] for r in read_log(second["log"]) if r["kind"] == "train"] == list(range(6))
    assert OutDir(str(tmp_path / "out")).snapshot_iters() == [0, 6]
    assert first["log"] == second["log"]
    for name in ("report.html", "loss_curve.png"):                  # the old run's report and default curve go
        (tmp_path / "out" / name).write_text("the old run's")       # too, though this run (--plot '') makes none
    train(tiny_cfg(tmp_path, max_iters=2, eval_interval=2))
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt_best.npz", "ckpt_last.npz", "log.jsonl", "snapshots"]
    cfg = tiny_cfg(tmp_path)                                            # a new run stopped before its first
    OutDir(cfg.out_dir).start_over(cfg.plot, cfg.data, print)           # checkpoint leaves no old one to --resume
    assert sorted(os.listdir(tmp_path / "out")) == ["snapshots"]


def test_a_new_run_in_a_directory_without_a_run_deletes_nothing(tmp_path, capsys):
    """A report.html or PNG in an out_dir that holds no run is someone else's: a new run leaves it (it replaces
    them only after another run). Nor does starting over ever remove the text it trains on, whatever --plot names."""
    out = tmp_path / "out"
    out.mkdir()
    mine = {"report.html": "mine", "loss_curve.png": "mine too", "curve.png": "and this"}
    for name, text in mine.items():
        (out / name).write_text(text)
    train(tiny_cfg(tmp_path, max_iters=2, eval_interval=2, plot="curve.png"))
    assert "held a run" not in capsys.readouterr().out
    assert {n: (out / n).read_text() for n in mine} == mine
    data = out / "text.txt"                                          # the data inside out_dir, named by --plot
    write_text(data)
    train(tiny_cfg(tmp_path, max_iters=2, eval_interval=2, data=str(data), plot="text.txt"))
    assert "held a run" in capsys.readouterr().out and data.exists()
    assert not (out / "report.html").exists()                        # the old run's (as the test above)


def test_a_run_on_a_relative_data_path_resumes_from_another_directory(tmp_path, monkeypatch):
    """The checkpoint keeps the text's absolute path: --resume (and eval, the report) from another working
    directory find it, where the path as typed would name nothing there."""
    (tmp_path / "a").mkdir()
    write_text(tmp_path / "a" / "text.txt")
    monkeypatch.chdir(tmp_path / "a")
    out = str(tmp_path / "out")
    flags = [f"--{k}={v}" for k, v in TINY_TRAIN.items()] + ["--out_dir", out, "--max_iters=4", "--eval_interval=2"]
    cfg = parse_args(flags + ["--data", "text.txt"])
    train(cfg, given=cfg.given)
    monkeypatch.chdir(tmp_path)
    cfg = parse_args(["--out_dir", out, "--resume", "--max_iters", "6"])
    assert train(cfg, given=cfg.given)["iter"] == 6
    assert checkpoint.load(os.path.join(out, "ckpt_last.npz"))[0]["train_config"]["data"] == \
        str(tmp_path / "a" / "text.txt")


@pytest.mark.parametrize("what", ["snapshot", "checkpoint"])
def test_a_checkpoint_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, what):
    """A full disk or a read-only snapshots/ mid-run: CannotSave (one line, the path and the fix), not a
    traceback; the checkpoints written before stay whole."""
    from minigpt.errors import CannotSave

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    train(tiny_cfg(tmp_path, max_iters=2, eval_interval=2))
    monkeypatch.setattr(checkpoint, "save_snapshot" if what == "snapshot" else "save", full)
    cfg = parse_args([f"--{k}={v}" for k, v in TINY_TRAIN.items()] + [
        "--data", str(tmp_path / "text.txt"), "--out_dir", str(tmp_path / "out"), "--resume", "--max_iters=4"])
    with pytest.raises(CannotSave, match="cannot write .*No space left on device.*continue with --resume"):
        train(cfg, given=cfg.given)
    monkeypatch.undo()
    assert checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["iter"] in (2, 4)


def test_a_run_shorter_than_its_warmup_says_so(tmp_path, capsys):
    train(tiny_cfg(tmp_path, max_iters=2, eval_interval=2, warmup_iters=100))
    assert "note: --warmup_iters 100 is not below --max_iters 2: the lr is still rising" in capsys.readouterr().out
    train(tiny_cfg(tmp_path, max_iters=4, eval_interval=2, warmup_iters=2))
    assert "warmup_iters" not in capsys.readouterr().out


def _cli(tmp_path, *args):
    """python -m minigpt.train's main on the tiny settings: (exit status, the lines of stderr). A run that fails
    prints its error alone: the backend's line comes once every setting has passed."""
    import contextlib
    import io
    from minigpt.train import main
    data = tmp_path / "text.txt"
    if not data.exists():
        write_text(data)
    flags = [f"--{k}={v}" for k, v in TINY_TRAIN.items() if k != "plot"] + ["--plot=", "--data", str(data)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(flags + list(args))
    assert "Traceback" not in err.getvalue()
    return rc, err.getvalue().splitlines()


def test_a_run_too_big_for_memory_is_one_line_and_leaves_the_old_run(tmp_path, monkeypatch):
    """The estimate refuses a run that cannot fit before it writes anything: a new out_dir is not made, and an
    old run's files in a used one stay (its log and snapshots go only once every setting has passed). Past the
    estimate, numpy's MemoryError is one line too."""
    out = str(tmp_path / "out")
    rc, err = _cli(tmp_path, "--out_dir", str(tmp_path / "new"), "--n_embd", str(10 ** 6))
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: this run needs about"), err
    assert "GiB is available; lower --batch_size" in err[0] and not os.path.exists(tmp_path / "new")
    assert _cli(tmp_path, "--out_dir", out)[0] == 0
    before = sorted(os.listdir(out)), read_log(os.path.join(out, "log.jsonl"))
    assert _cli(tmp_path, "--out_dir", out, "--n_embd", str(10 ** 6))[0] == 2
    assert (sorted(os.listdir(out)), read_log(os.path.join(out, "log.jsonl"))) == before
    import minigpt.train

    def no_memory(*a, **k):
        raise MemoryError("Unable to allocate 1.00 TiB for an array with shape (4, 12, 4, 65536, 65536)")
    monkeypatch.setattr(minigpt.train, "GPT", no_memory)
    rc, err = _cli(tmp_path, "--out_dir", out)
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: out of memory (Unable to allocate"), err


def test_bad_paths_are_one_line_and_make_no_directory(tmp_path):
    (tmp_path / "afile").write_text("x")
    rc, err = _cli(tmp_path, "--out_dir", str(tmp_path / "afile"))
    assert rc == 2 and err == [f"error: --out_dir {str(tmp_path / 'afile')!r} is a file, not a directory; pass a "
                               "directory (made if missing)"]
    rc, err = _cli(tmp_path, "--out_dir", str(tmp_path / "new"), "--data", str(tmp_path / "missing.txt"))
    assert rc == 2 and len(err) == 1 and "does not exist" in err[0] and not os.path.exists(tmp_path / "new")


def test_resuming_on_a_text_too_short_offers_no_block_size_it_would_refuse(tmp_path):
    out = str(tmp_path / "out")
    assert _cli(tmp_path, "--out_dir", out)[0] == 0
    short = tmp_path / "short.txt"
    short.write_text((tmp_path / "text.txt").read_text()[:60])           # a val split of 6 characters
    rc, err = _cli(tmp_path, "--out_dir", out, "--resume", "--max_iters", "20", "--data", str(short))
    assert rc == 2 and len(err) == 1 and "block_size 16 (the checkpoint's) needs at least 17" in err[0], err
    assert "--block_size" not in err[0]
    rc, err = _cli(tmp_path, "--out_dir", str(tmp_path / "new"), "--data", str(short))     # a new run may shrink it
    assert rc == 2 and err[0].endswith("or a smaller --block_size"), err


def test_a_resumed_run_that_raises_max_iters_snapshots_its_end(tmp_path):
    """--snapshots N are spread over the first run; resuming with a higher --max_iters adds the new end."""
    train(tiny_cfg(tmp_path, max_iters=8, eval_interval=4, snapshots=3))
    assert OutDir(str(tmp_path / "out")).snapshot_iters() == [0, 4, 8]
    train(tiny_cfg(tmp_path, max_iters=16, eval_interval=4, snapshots=3, resume=True))
    assert OutDir(str(tmp_path / "out")).snapshot_iters() == [0, 4, 8, 16]


# ----------------------------------------------------------------------------
# --dtype auto and --context_warmup

@pytest.mark.parametrize("slow", ["bf16", "float32"])
def test_dtype_auto_takes_the_precision_whose_pass_is_faster(tmp_path, monkeypatch, capsys, slow):
    """The choice follows the clock: a forward made slower in one precision sends auto to the other, the run's
    model and its checkpoint hold the choice, and a line says it with both timings."""
    import time
    real = GPT.forward

    def forward(self, *a, **k):
        if self.bf16 == (slow == "bf16"):
            time.sleep(0.1)                  # far above a tiny pass and a busy scheduler
        return real(self, *a, **k)
    monkeypatch.setattr(GPT, "forward", forward)
    res = train(tiny_cfg(tmp_path, dtype="auto", max_iters=2, eval_interval=2))
    chosen = "float32" if slow == "bf16" else "bf16"
    assert res["model"].bf16 == (chosen == "bf16")
    assert checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["train_config"]["dtype"] == chosen
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith("--dtype auto:")]
    assert len(line) == 1 and line[0].startswith(f"--dtype auto: {chosen} (") and "ms in bf16" in line[0]


def test_dtype_auto_is_trainings_alone():
    from minigpt.config import SampleConfig, check_sample
    with pytest.raises(UserError, match="--dtype auto is training's"):
        check_sample(SampleConfig(dtype="auto"))
    with pytest.raises(UserError, match="float32, bf16 or auto"):
        check(TrainConfig(dtype="fp8"))


def test_the_warmups_halve_the_context_and_the_batch_for_their_share_of_the_run(tmp_path, monkeypatch):
    """--context_warmup 0.5 and --batch_warmup 0.25 over 8 steps: the first 2 steps draw half the batch of half the
    block, the next 2 the whole batch of half the block, the rest the whole of both; the evaluations keep the whole
    shape, and the log counts the tokens a step really took."""
    seen = []
    real = Dataset.batch

    def batch(self, split, batch_size, block_size, rng, *a):
        seen.append((split, batch_size, block_size))
        return real(self, split, batch_size, block_size, rng, *a)
    monkeypatch.setattr(Dataset, "batch", batch)
    res = train(tiny_cfg(tmp_path, max_iters=8, lr_decay_iters=8, eval_interval=8, context_warmup=0.5,
                         batch_warmup=0.25))
    # the evaluations at iterations 0 and 8 draw eval_iters (2) training batches each, of the whole shape
    steps = [(B, T) for split, B, T in seen if split == "train"][2:-2]
    assert steps == [(2, 8)] * 2 + [(4, 8)] * 2 + [(4, 16)] * 4
    assert {(B, T) for _, B, T in seen[:4] + seen[-4:]} == {(4, 16)}                 # the evaluations
    rows = [r for r in read_log(res["log"]) if r["kind"] == "train"]
    assert [r["tokens_per_s"] * r["ms"] / 1000 for r in rows] == pytest.approx([B * T for B, T in steps])
    for k in ("context_warmup", "batch_warmup"):
        with pytest.raises(UserError, match=f"--{k} must lie in"):
            check(TrainConfig(**{k: 1.0}))
    with pytest.raises(UserError, match="--batch_warmup halves --batch_size, which is 1"):
        check(TrainConfig(batch_warmup=0.5, batch_size=1))


def test_a_resumed_auto_run_keeps_the_precision_it_chose(tmp_path, monkeypatch):
    """--dtype auto typed again on --resume (as --preset speedrun does) keeps the checkpoint's choice: no new
    timing, the same precision, whatever the clock would say now."""
    import minigpt.train as T
    train(tiny_cfg(tmp_path, dtype="auto", max_iters=2, eval_interval=2))
    chosen = checkpoint.load(str(tmp_path / "out" / "ckpt_last.npz"))[0]["train_config"]["dtype"]
    monkeypatch.setattr(T, "faster_dtype", lambda *a: pytest.fail("timed again on resume"))
    args = parse_args(["--data", str(tmp_path / "text.txt"), "--out_dir", str(tmp_path / "out"), "--resume",
                       "--dtype", "auto", "--max_iters", "4", "--backend", "numpy"])
    res = train(args, given=args.given)
    assert res["model"].bf16 == (chosen == "bf16") and res["iter"] == 4
