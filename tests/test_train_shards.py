"""Training on a directory of token shards (--data DIR): the same losses as the text file it was prepared from,
llm.c's shards written by hand, a bit-identical resume, the capped final score, and the commands that read the run."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import TINY_TRAIN, write_text
from minigpt.config import TrainConfig, parse_args
from minigpt.data import CharTokenizer, split_text
from minigpt.errors import UserError
from minigpt.prepare_data import prepare
from minigpt.train import train


def _cfg(tmp_path, data, out="out", **kw):
    return TrainConfig(**{**TINY_TRAIN, "data": str(data), "out_dir": str(tmp_path / out), "snapshots": 0, **kw})


def _rows(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def _losses(rows):
    return [(r["iter"], r["kind"], r.get("loss"), r.get("val_loss"), r.get("val_loss_full")) for r in rows]


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_prepared_directory_trains_as_its_text_file(tmp_path, tokenizer):
    text = tmp_path / "text.txt"
    write_text(text, n_chars=8000)
    extra = {"vocab_size": 300} if tokenizer == "bpe" else {}
    prepare([str(text)], str(tmp_path / "shards"), tokenizer=tokenizer, workers=1, quiet=True, **extra)
    train(_cfg(tmp_path, text, "from_text", tokenizer=tokenizer, **extra))
    train(_cfg(tmp_path, tmp_path / "shards", "from_dir"))
    a, b = _rows(tmp_path / "from_text"), _rows(tmp_path / "from_dir")
    assert len(a) == 12 + 4 and _losses(a) == _losses(b)                  # 12 steps, evaluations at 0, 4, 8, 12


def test_llmc_shards_written_by_hand_train_and_resume_bit_identically(tmp_path, monkeypatch):
    text = tmp_path / "text.txt"
    write_text(text, n_chars=8000)
    raw = text.read_text()
    tok = CharTokenizer.from_text(raw)
    d = tmp_path / "llmc"
    d.mkdir()
    train_ids, val_ids = tok.encode(split_text(raw)[0]), tok.encode(split_text(raw)[1])
    parts = {"tiny_train_000000.bin": train_ids[:3000], "tiny_train_000001.bin": train_ids[3000:],
             "tiny_val_000000.bin": val_ids}
    for name, ids in parts.items():                                       # llm.c's format, by hand
        header = np.zeros(256, np.int32)
        header[:3] = 20240520, 1, len(ids)
        with open(d / name, "wb") as f:
            f.write(header.tobytes() + ids.astype(np.uint16).tobytes())
    tok_file = tmp_path / "chars.json"
    tok_file.write_text(tok.to_json())
    with pytest.raises(UserError, match="without a tokenizer"):
        train(_cfg(tmp_path, d, "none"))
    whole = train(_cfg(tmp_path, d, "whole", tokenizer=str(tok_file)))
    monkeypatch.chdir(tmp_path)                                           # a tokenizer named relative to here
    train(_cfg(tmp_path, d, "cut", tokenizer="chars.json", max_iters=6))
    monkeypatch.chdir(d)                                                  # resumed from another directory
    cfg = parse_args(["--out_dir", str(tmp_path / "cut"), "--resume", "--max_iters", "12"])
    train(cfg, given=cfg.given)
    assert _losses(_rows(tmp_path / "cut")) == _losses(_rows(tmp_path / "whole"))
    assert whole["final"]["val_full"] == _rows(tmp_path / "whole")[-1]["val_loss_full"]


def test_the_final_score_takes_at_most_val_tokens_and_says_how_many(tmp_path, capsys, monkeypatch):
    import minigpt.train as T
    text = tmp_path / "text.txt"
    write_text(text, n_chars=8000)
    prepare([str(text)], str(tmp_path / "shards"), workers=1, quiet=True)
    monkeypatch.setattr(T, "PROGRESS_SECONDS", 0)                       # a progress line after every batch
    train(_cfg(tmp_path, tmp_path / "shards", "capped", val_tokens=300))
    row = _rows(tmp_path / "capped")[-1]
    assert row["val_tokens_scored"] == 300
    out = capsys.readouterr().out
    assert "scoring the first 300 tokens of the validation split (--val_tokens)" in out
    assert "val loss over its first 300 tokens" in out
    assert "scored 22% of the validation tokens" in out                 # 299 targets: 18 blocks of 16, 4 a batch
    train(_cfg(tmp_path, tmp_path / "shards", "all", val_tokens=0))
    assert _rows(tmp_path / "all")[-1]["val_tokens_scored"] == len(split_text(text.read_text())[1])


def test_a_directory_refuses_a_tokenizer_setting(tmp_path):
    text = tmp_path / "text.txt"
    write_text(text)
    prepare([str(text)], str(tmp_path / "shards"), workers=1, quiet=True)
    for flags in (["--tokenizer", "bpe"], ["--tokenizer", "bpe", "--vocab_size", "300"]):
        cfg = parse_args(["--data", str(tmp_path / "shards"), "--out_dir", str(tmp_path / "o"), *flags])
        with pytest.raises(UserError, match="already tokenized: drop --tokenizer and --vocab_size"):
            train(cfg, given=cfg.given)
    assert not (tmp_path / "o").exists()
    cfg = parse_args(["--data", str(tmp_path / "shards"), "--out_dir", str(tmp_path / "o"), "--vocab_size", "300"])
    with pytest.raises(UserError, match="already tokenized: drop --tokenizer and --vocab_size"):
        train(cfg, given=cfg.given)
    with pytest.raises(UserError, match="--val_tokens 1 holds no next token"):
        train(_cfg(tmp_path, tmp_path / "shards", "v", val_tokens=1))
    with pytest.raises(UserError, match="--tokenizer must be char, bpe or the path"):
        train(_cfg(tmp_path, text, "p", tokenizer=str(tmp_path / "missing.json")))
    with pytest.raises(UserError, match="prepare it with that tokenizer first"):
        train(_cfg(tmp_path, text, "q", tokenizer=str(tmp_path / "shards" / "tokenizer.json")))


def test_sample_report_and_eval_read_a_run_trained_on_a_directory(tmp_path):
    text = tmp_path / "text.txt"
    write_text(text, n_chars=8000)
    prepare([str(text)], str(tmp_path / "shards"), workers=1, quiet=True)
    train(_cfg(tmp_path, tmp_path / "shards", "run", max_iters=4))
    out = str(tmp_path / "run")
    env = {**os.environ, "MINIGPT_BACKEND": "numpy"}
    for cmd in ([sys.executable, "-m", "minigpt.sample", "--out_dir", out, "--max_new_tokens", "20"],
                [sys.executable, "-m", "minigpt.report", "--out_dir", out, "--samples", "0"],
                [sys.executable, "scripts/eval_checkpoint.py", "--out_dir", out, "--draws", "0"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert r.returncode == 0, (cmd, r.stderr)
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert "No validation text" not in page and "too short to score" not in page    # section 7 scored it
    assert "val  : whole split" in r.stdout
