"""The Python API (minigpt/__init__.py): the same runs and samples as the commands, the same checks, a light import."""
import json
import subprocess
import sys

import numpy as np
import pytest

import minigpt
from helpers import TINY_TRAIN, write_text
from minigpt.errors import UserError


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _losses(rows):
    return [(r["iter"], r["kind"], r.get("loss"), r.get("train_loss"), r.get("val_loss")) for r in rows]


def test_import_is_light():
    code = ("import sys, minigpt; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'numba', 'matplotlib', 'threadpoolctl')]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_train_in_code_equals_the_command_line(tmp_path):
    data = tmp_path / "text.txt"
    write_text(data)
    settings = dict(TINY_TRAIN, max_iters=8, snapshots=0)
    flags = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]
    r = subprocess.run([sys.executable, "-m", "minigpt.train", "--data", str(data), "--out_dir", str(tmp_path / "cli"),
                        *flags], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = minigpt.train(data=str(data), out_dir=str(tmp_path / "api"), **settings)
    cli = _rows(tmp_path / "cli" / "log.jsonl")
    assert _losses(result["rows"]) == _losses(cli) and len(cli) == 8 + 3        # 8 steps, evaluations at 0, 4, 8
    assert result["iter"] == 8 and result["final"]["val"] == cli[-1]["val_loss"]
    assert isinstance(result["model"], minigpt.Model) and result["model"].config.n_layer == 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(the text, the out_dir, the Model) of a tiny run trained in code."""
    d = tmp_path_factory.mktemp("run")
    data = d / "text.txt"
    write_text(data)
    out = str(d / "out")
    minigpt.train(data=str(data), out_dir=out, **dict(TINY_TRAIN, max_iters=4))
    return data, out, minigpt.load(out, backend="numpy")


def test_load_and_generate_print_what_the_sampler_prints(run):
    _, out, m = run
    for seed, kw in ((1, {}), (7, {"top_k": 3, "temperature": 1.2})):
        flags = [f"--{k}={v}" for k, v in kw.items()]
        r = subprocess.run([sys.executable, "-m", "minigpt.sample", "--out_dir", out, "--prompt", "To be",
                            "--seed", str(seed), "--max_new_tokens", "40", "--num_samples", "1", "--backend", "numpy",
                            *flags], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        printed = r.stdout.split("\n" + "-" * 40)[0]                    # the sample, before the separator
        text = m.generate("To be", 40, seed=seed, **kw)
        assert text == printed and text.startswith("To be") and len(text) > len("To be")
        assert "".join(m.stream("To be", 40, seed=seed, **kw)) == text[len("To be"):]
    assert m.generate("To be", 40, seed=1) != m.generate("To be", 40, seed=2)


def test_loss_is_the_mean_of_the_token_losses_and_the_whole_split_score(run):
    from minigpt.train import whole_split_loss
    data, _, m = run
    text = open(data).read()[:300]
    tokens, losses = m.token_losses(text)
    assert len(tokens) == len(text) and losses.shape == (len(text) - 1,) and np.all(losses > 0)
    ids = m.tokenizer.encode(text)
    expect = whole_split_loss(m.gpt, ids, m.config.block_size, 4)
    assert m.loss(text) == pytest.approx(expect, rel=1e-6)


def test_settings_in_code_get_the_command_lines_errors(tmp_path, run):
    data = tmp_path / "text.txt"
    write_text(data)
    with pytest.raises(UserError, match=r"unknown setting --n_layers; did you mean --n_layer\?"):
        minigpt.train(data=str(data), out_dir=str(tmp_path / "a"), n_layers=2)
    with pytest.raises(UserError, match="--max_iters expects an integer, got 'many'"):
        minigpt.train(data=str(data), out_dir=str(tmp_path / "a"), max_iters="many")
    with pytest.raises(UserError, match="--batch_size must be positive"):
        minigpt.train(data=str(data), out_dir=str(tmp_path / "a"), batch_size=0)
    with pytest.raises(UserError, match="does not exist"):
        minigpt.train(data=str(tmp_path / "missing.txt"), out_dir=str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()                                   # nothing made by a refused run
    with pytest.raises(UserError, match="no checkpoint in --out_dir"):
        minigpt.load(str(tmp_path))
    with pytest.raises(UserError, match="--backend must be one of"):
        minigpt.load(str(tmp_path), backend="gpu")
    m = run[2]
    with pytest.raises(UserError, match="--temperature must be positive"):
        m.generate("To", 5, temperature=0)
    with pytest.raises(UserError, match="--top_p must lie in"):
        m.generate("To", 5, top_p=2)
    with pytest.raises(UserError, match="not in the tokenizer's vocabulary"):
        m.generate("\u00e9", 5)


def test_prepare_data_in_code_then_train_on_the_directory(tmp_path):
    data = tmp_path / "text.txt"
    write_text(data, n_chars=8000)
    manifest = minigpt.prepare_data(str(data), str(tmp_path / "shards"), workers=1, quiet=True)
    assert manifest["tokens"]["train"] > 0 and (tmp_path / "shards" / "manifest.json").exists()
    settings = dict(TINY_TRAIN, max_iters=4, snapshots=0)
    from_dir = minigpt.train(data=str(tmp_path / "shards"), out_dir=str(tmp_path / "a"), **settings)
    from_text = minigpt.train(data=str(data), out_dir=str(tmp_path / "b"), **settings)
    assert _losses(from_dir["rows"]) == _losses(from_text["rows"])
    with pytest.raises(UserError, match="does not exist"):
        minigpt.prepare_data(str(tmp_path / "missing.txt"), str(tmp_path / "x"))
