"""Prepared token shards (minigpt/prepare_data.py, minigpt/shards.py): llm.c's header read back by hand, llm.c's and
nanoGPT's folders load, a single file gives the text-file run's very tokens and batches, folders / globs / JSON
lines become documents, every bad input is one UserError naming the thing, and a killed prepare leaves nothing
that trains. Every corpus is written here; GPT-2-style tokenizers are trained here by `tokenizers` (no network)."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from minigpt import prepare_data
from minigpt.bpe import BPETokenizer
from minigpt.data import CharTokenizer, Dataset, cut_point, split_text
from minigpt.errors import UserError
from minigpt.prepare_data import prepare
from minigpt.shards import ShardWriter, open_prepared, read_header, write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["to", "be", "or", "not", "the", "king", "shall", "speak", "my", "lord", "and", "good", "night"]


def write_text(path, n_chars=6000, seed=0):
    """A deterministic text of short lines of words (tests/helpers.py's, without its imports)."""
    rng = np.random.default_rng(seed)
    out, n = [], 0
    while n < n_chars:
        out.append(" ".join(rng.choice(WORDS, rng.integers(3, 8))).capitalize() + ".\n")
        n += len(out[-1])
    text = "".join(out)[:n_chars]
    path.write_text(text, encoding="utf-8")
    return text


def llmc_header(path):
    """(magic, version, count, tokens) of a shard, parsed as llm.c's dataloader does: 256 int32, then tokens."""
    h = np.fromfile(path, np.int32, count=256)
    dtype = {20240520: np.uint16, 20240801: np.uint32}[int(h[0])]
    assert os.path.getsize(path) == 256 * 4 + int(h[2]) * np.dtype(dtype).itemsize
    return int(h[0]), int(h[1]), int(h[2]), np.fromfile(path, dtype, offset=1024)


def hand_shard(path, ids, magic=20240520, version=1, count=None, dtype=np.uint16):
    h = np.zeros(256, np.int32)
    h[:3] = magic, version, len(ids) if count is None else count
    with open(path, "wb") as f:
        f.write(h.tobytes() + np.asarray(ids, dtype).tobytes())


def prep(tmp_path, inputs, out="out", **kw):
    kw = {"workers": 1, "quiet": True, **kw}
    return prepare([str(i) for i in inputs], str(tmp_path / out), **kw), str(tmp_path / out)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    t = write_text(tmp_path_factory.mktemp("t") / "x.txt", n_chars=30_000)
    return t + "\nIt's 1599, isn't it? -- caf\u00e9 \u6771\u4eac 42 kings!\r\n  indented\n\n\nend\n"


@pytest.fixture(scope="module")
def gpt2_json(tmp_path_factory, text):
    """A GPT-2-style tokenizer.json (ByteLevel with GPT-2's regex, BPE, <|endoftext|>) trained here."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tk.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    path = tmp_path_factory.mktemp("gpt2") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


# ----------------------------------------------------------------------------
# the format: llm.c's header, llm.c's and nanoGPT's folders

def test_prepared_shards_read_back_with_llmc_header_rules(tmp_path, text):
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    m, out = prep(tmp_path, [tmp_path / "a.txt"], shard_tokens=5000)
    tok = CharTokenizer.from_text(text)
    got = {}
    for split in ("train", "val"):
        files = sorted(f for f in os.listdir(out) if f"_{split}_" in f)
        assert files == [r["file"] for r in m["shards"][split]] and files[0] == f"out_{split}_000000.bin"
        for f in files:
            magic, version, count, ids = llmc_header(os.path.join(out, f))
            assert (magic, version) == (20240520, 1) and 0 < count <= 5000 and len(ids) == count
        got[split] = np.concatenate([llmc_header(os.path.join(out, f))[3] for f in files])
    train, val = split_text(text)
    assert np.array_equal(got["train"], tok.encode(train)) and np.array_equal(got["val"], tok.encode(val))
    assert len(m["shards"]["train"]) == -(-len(train) // 5000)


def test_uint32_shards_round_trip(tmp_path):
    ids = np.array([0, 70_000, 65_536, 5, 99_999], np.uint32)
    write_shard(str(tmp_path / "big_train_000000.bin"), ids)
    magic, version, count, back = llmc_header(str(tmp_path / "big_train_000000.bin"))
    assert (magic, version, count) == (20240801, 7, 5) and np.array_equal(back, ids)
    chars = [chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c < 0xE000][:66_000]
    corpus = "".join(random.Random(0).sample(chars, len(chars)))
    (tmp_path / "wide.txt").write_text(corpus, encoding="utf-8")
    m, out = prep(tmp_path, [tmp_path / "wide.txt"])
    assert m["dtype"] == "uint32"
    tok, ds, _ = open_prepared(out, 8)
    assert tok.vocab_size == 66_000 and np.array_equal(ds.ids("val"), tok.encode(split_text(corpus)[1]))
    assert read_header(os.path.join(out, m["shards"]["val"][0]["file"]))[0] == np.uint32


def test_llmc_folder_of_hand_written_shards_trains(tmp_path):
    d = tmp_path / "llmc"
    d.mkdir()
    parts = [np.arange(300), 300 + np.arange(50)]                               # train: two shards, distinct ids
    hand_shard(d / "tiny_val_000000.bin", np.arange(100))
    for i, p in enumerate(parts):
        hand_shard(d / f"tiny_train_{i:06d}.bin", p)
    tok = CharTokenizer([chr(0x100 + i) for i in range(400)])
    with pytest.raises(UserError, match="without a tokenizer"):
        open_prepared(str(d), 16)
    got, ds, info = open_prepared(str(d), 16, tok)
    assert got is tok and info["format"] == "llm.c" and info["tokens"] == {"train": 350, "val": 100}
    x, y = ds.batch("train", 400, 16, np.random.default_rng(0), 1, 2)
    assert x.dtype == np.int32 and x.shape == (400, 16) and np.array_equal(x[:, 1:], y[:, :-1])
    ix = np.random.default_rng(0).integers(0, 284 + 34, 800)[400:]              # the windows of both shards
    want = [parts[0][i:i + 16] if i < 284 else parts[1][i - 284:i - 284 + 16] for i in ix]
    assert np.array_equal(x, want)                                              # (no row crosses a shard)
    assert np.array_equal(ds.ids("train", 320), np.arange(320))


def test_nanogpt_folder_loads(tmp_path):
    (np.arange(200) % 7).astype(np.uint16).tofile(tmp_path / "train.bin")
    (np.arange(50) % 7).astype(np.uint16).tofile(tmp_path / "val.bin")
    tok, ds, info = open_prepared(str(tmp_path), 8, CharTokenizer("abcdefg"))
    assert info["format"] == "nanoGPT" and np.array_equal(ds.ids("val"), np.arange(50) % 7)
    with open(tmp_path / "val.bin", "ab") as f:
        f.write(b"x")
    with pytest.raises(UserError, match="odd number of bytes"):
        open_prepared(str(tmp_path), 8, CharTokenizer("abcdefg"))


# ----------------------------------------------------------------------------
# a single file: the text-file run's tokens and batches

@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_single_file_gives_the_text_runs_splits_and_batches(tmp_path, text, kind, monkeypatch):
    monkeypatch.setattr(prepare_data, "PIECE_BYTES", 700)                       # many pieces, cut between words
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    ref_tok = CharTokenizer.from_text(text) if kind == "char" else BPETokenizer.train(split_text(text)[0], 300)
    ref = Dataset(text, ref_tok, 32)
    for workers in (1, 2):
        _, out = prep(tmp_path, [tmp_path / "a.txt"], f"w{workers}", tokenizer=kind, vocab_size=300,
                      workers=workers)
        tok, ds, info = open_prepared(out, 32)
        assert tok.to_json() == ref_tok.to_json() and info["format"] == "minigpt"
        for split in ("train", "val"):
            assert np.array_equal(ds.ids(split), ref.splits[split])
        for rank in (0, 1):
            r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
            for _ in range(3):
                for a, b in zip(ds.batch("train", 5, 32, r1, rank, 2), ref.batch("train", 5, 32, r2, rank, 2)):
                    assert a.dtype == b.dtype == np.int32 and np.array_equal(a, b)


def test_single_file_with_gpt2_tokenizer_and_multi_shard_batches(tmp_path, text, gpt2_json, monkeypatch):
    from minigpt.gpt2_tokenizer import GPT2Tokenizer
    monkeypatch.setattr(prepare_data, "PIECE_BYTES", 500)
    (tmp_path / "a.txt").write_text(text + "a <|endoftext|> b\n", encoding="utf-8")
    m, out = prep(tmp_path, [tmp_path / "a.txt"], tokenizer=gpt2_json, shard_tokens=1000, workers=2)
    tok, ds, _ = open_prepared(out, 16)
    ref = GPT2Tokenizer.from_hf_json(gpt2_json)
    train, val = split_text(text + "a <|endoftext|> b\n")
    assert np.array_equal(ds.ids("train"), ref.encode(train)) and np.array_equal(ds.ids("val"), ref.encode(val))
    assert len(m["shards"]["train"]) > 3 and m["tokenizer"]["eot"] == 0
    x, _ = ds.batch("train", 64, 16, np.random.default_rng(0))
    starts = [bytes(tok.decode(r[:3]), "utf-8") for r in x]
    assert len(set(starts)) > 30                                                # rows from many shards


def test_cut_points_never_change_the_tokens(gpt2_json, text):
    """Random texts cut where cut_point says: each tokenizer's ids of the two parts are the whole's."""
    from minigpt.gpt2_tokenizer import GPT2Tokenizer
    toks = [GPT2Tokenizer.from_hf_json(gpt2_json), BPETokenizer.train(text, 300)]
    alphabet = list("ab \n\r\t'sX1,.-\u00a0\u3000\u00e9<|>\x85\x1c") + ["\n\n", " \n", "\r\n", "<|endoftext|>", "'s"]
    rnd, cuts = random.Random(0), 0
    for _ in range(3000):
        t = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(2, 30)))
        raw = t.encode("utf-8")
        k = cut_point(raw, "words", 0, b"<")
        if k:
            cuts += 1
            a, b = raw[:k].decode("utf-8"), raw[k:].decode("utf-8")
            for tok in toks:
                assert np.array_equal(np.concatenate([tok.encode(a), tok.encode(b)]), tok.encode(t)), (a, b)
    assert cuts > 1000


@pytest.mark.parametrize("kind", ["bpe", "gpt2"])
def test_compiled_merge_loop_gives_the_python_loops_ids(kind, text, gpt2_json, monkeypatch):
    """Many new words at once go through bpe.py's compiled merge loop: the ids must be the word-by-word loop's,
    on words short and long (a 300-character word), ASCII and not."""
    from minigpt import bpe, gpt2_tokenizer
    from minigpt.gpt2_tokenizer import GPT2Tokenizer
    rnd = random.Random(1)
    words = text.split() + ["ooo", "llll", "gooood", "shallll", "1111111"] + [
        "".join(rnd.choice("abelo\u00e9\u6771 1'") for _ in range(rnd.randint(1, 300))) for _ in range(300)]
    corpus = " ".join(rnd.sample(words, len(words))) + " " + " ".join(words)
    make = (lambda: BPETokenizer.train(corpus, 400)) if kind == "bpe" else \
        (lambda: GPT2Tokenizer.from_hf_json(gpt2_json))                         # merges of "ll", "oo", "1 1"...
    ids = {}
    for threshold in (0, 10 ** 9):
        monkeypatch.setattr(bpe, "KERNEL_MIN_WORDS", threshold)
        monkeypatch.setattr(gpt2_tokenizer, "KERNEL_MIN_WORDS", threshold)
        ids[threshold] = make().encode(corpus)
    assert len(ids[0]) > 5000 and np.array_equal(ids[0], ids[10 ** 9])


def test_char_encode_is_the_per_character_lookup(text):
    tok = CharTokenizer.from_text(text + "\U0001f600\x00")
    for t in (text, text[::-1] + "\U0001f600", "", "\x00"):
        assert np.array_equal(tok.encode(t), np.fromiter((tok.stoi[c] for c in t), tok.dtype, count=len(t)))
    with pytest.raises(UserError, match="'Q', '\\\\U0010ffff'"):
        tok.encode("Q\U0010ffff")


# ----------------------------------------------------------------------------
# documents: folders, globs, JSON lines; the split; end-of-text between documents

def test_folder_glob_and_jsonl_make_whole_documents(tmp_path, gpt2_json):
    from minigpt.gpt2_tokenizer import GPT2Tokenizer
    docs = [f"Document {i}: " + "the king shall speak. " * (5 + i % 4) for i in range(40)]
    (tmp_path / "f" / "sub").mkdir(parents=True)
    for i, d in enumerate(docs):
        (tmp_path / "f" / ("sub" if i % 2 else "") / f"{i:02d}.txt").write_text(d, encoding="utf-8")
    (tmp_path / "f" / "skip.md").write_text("not a .txt", encoding="utf-8")
    with open(tmp_path / "d.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": 1, "text": d}) + "\n\n")
    m_folder, out = prep(tmp_path, [tmp_path / "f"], "folder")
    assert m_folder["documents"]["train"] + m_folder["documents"]["val"] == 40
    m_glob, _ = prep(tmp_path, [tmp_path / "f" / "**" / "*.txt"], "glob")
    assert m_glob["tokens"] == m_folder["tokens"] and m_glob["documents"] == m_folder["documents"]
    ref = GPT2Tokenizer.from_hf_json(gpt2_json)
    m, out = prep(tmp_path, [tmp_path / "d.jsonl"], "jsonl", tokenizer=gpt2_json, workers=2)
    tok, ds, _ = open_prepared(out, 8)
    val = [tok.decode(s) for s in np.split(ds.ids("val"), np.flatnonzero(ds.ids("val") == 0))]
    val = [v.replace("<|endoftext|>", "") for v in val]
    assert set(val) <= set(docs) and 2 <= len(val) == m["documents"]["val"] < 10   # whole documents
    assert 0.07 < m["tokens"]["val"] / (m["tokens"]["val"] + m["tokens"]["train"]) < 0.15
    assert (ds.ids("train") == 0).sum() == m["documents"]["train"] - 1            # <|endoftext|> between them
    assert m["tokens"]["train"] + m["tokens"]["val"] == sum(len(ref.encode(d)) for d in docs) + 40 - 2


def test_same_result_for_any_workers_and_nothing_to_do_twice(tmp_path, capsys):
    for i in range(6):
        write_text(tmp_path / f"d{i}.txt", n_chars=3000, seed=i)
    m1, out1 = prep(tmp_path, [tmp_path / "*.txt"], "one", tokenizer="bpe", vocab_size=300, workers=1)
    m2, out2 = prep(tmp_path, [tmp_path / "*.txt"], "two", tokenizer="bpe", vocab_size=300, workers=2, name="one")
    for split in ("train", "val"):
        for a, b in zip(m1["shards"][split], m2["shards"][split]):
            assert open(os.path.join(out1, a["file"]), "rb").read() == open(os.path.join(out2, b["file"]), "rb").read()
    before = os.path.getmtime(os.path.join(out1, "manifest.json"))
    prepare([str(tmp_path / "*.txt")], out1, tokenizer="bpe", vocab_size=300, workers=1)
    assert "nothing to do" in capsys.readouterr().err
    assert os.path.getmtime(os.path.join(out1, "manifest.json")) == before
    write_text(tmp_path / "d0.txt", n_chars=2000, seed=9)                        # an input changed: again
    m3, _ = prep(tmp_path, [tmp_path / "*.txt"], "one", tokenizer="bpe", vocab_size=300)
    assert m3["sources"] != m1["sources"]


# ----------------------------------------------------------------------------
# bad input: one UserError naming the thing

def test_bad_inputs_are_named(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    (tmp_path / "ok.txt").write_text("to be or not to be " * 50)
    (tmp_path / "ok2.txt").write_text("the king shall speak " * 50)
    (tmp_path / "nofolder").mkdir()
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n', encoding="utf-8")
    (tmp_path / "arr.json").write_text('[{"text": "a"}]\n', encoding="utf-8")
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "a"}\n{"text": "caf\u00e9"}\n'.encode("latin-1"))
    cases = [([tmp_path / "missing.txt"], "missing.txt' does not exist"),
             ([tmp_path / "nofolder"], "has no .txt files"),
             ([tmp_path / "*.nothing"], "matches no file"),
             ([tmp_path / "empty.txt"], "empty.txt is empty"),
             ([tmp_path / "latin1.txt"], r"latin1.txt is not UTF-8 text: byte offset 3 \(0xe9\)"),
             ([tmp_path / "bad.jsonl"], "bad.jsonl: line 2 has no string field 'text' \\(it has: body\\)"),
             ([tmp_path / "arr.json"], "one JSON document, not JSON lines"),
             ([tmp_path / "latin1.jsonl"], "latin1.jsonl: line 2 is not UTF-8")]
    for inputs, msg in cases:
        with pytest.raises(UserError, match=msg):
            prep(tmp_path, inputs)
        assert not (tmp_path / "out").exists()                                   # nothing left behind
    m, out = prep(tmp_path, [tmp_path / "latin1.txt", tmp_path / "ok.txt", tmp_path / "ok2.txt",
                             tmp_path / "empty.txt"], skip_bad=True)
    assert m["skipped"]["not_utf8_files"] == [str(tmp_path / "latin1.txt")] and m["skipped"]["empty_documents"] == 1
    m, _ = prep(tmp_path, [tmp_path / "bad.jsonl", tmp_path / "ok.txt"], "j", skip_bad=True)
    assert m["skipped"]["bad_lines"] == 1 and sum(m["documents"].values()) == 2
    with pytest.raises(UserError, match="val_fraction must lie between 0 and 1"):
        prep(tmp_path, [tmp_path / "ok.txt"], val_fraction=1.5)
    with pytest.raises(UserError, match="the val split is empty"):
        prep(tmp_path, [tmp_path / "ok.txt", tmp_path / "empty.txt"])
    # the settings in code are the command line's, checked alike (config.PrepareConfig, check_prepare)
    for kw, msg in (({"vocab_sise": 300}, "unknown setting --vocab_sise; did you mean --vocab_size"),
                    ({"tokenizer": "bpe", "vocab_size": 100}, "--vocab_size must be at least 257"),
                    ({"tokenizer": str(tmp_path / "no_such_tokenizer")}, "--tokenizer must be char, bpe or"),
                    ({"workers": -1}, "--workers must be"), ({"shard_tokens": 2 ** 31}, "below 2\\*\\*31"),
                    ({"bpe_sample_mb": 0}, "--bpe_sample_mb must be positive")):
        with pytest.raises(UserError, match=msg):
            prep(tmp_path, [tmp_path / "ok.txt"], "refused", **kw)
        assert not (tmp_path / "refused").exists()


def test_prepare_and_training_share_one_declaration_of_the_tokenizer_settings():
    from dataclasses import fields

    from minigpt.config import COMMON, PrepareConfig, TrainConfig
    train, prep_ = ({f.name: f for f in fields(c)} for c in (TrainConfig, PrepareConfig))
    for k in ("tokenizer", "vocab_size"):
        default, text = COMMON[k]
        assert train[k].default == prep_[k].default == default
        assert train[k].metadata["help"].startswith(text) and prep_[k].metadata["help"].startswith(text)


def test_command_line_and_code_take_inputs_anywhere(tmp_path, monkeypatch, capsys):
    (tmp_path / "-dash.txt").write_text("to be or not to be " * 50)
    (tmp_path / "b.txt").write_text("the king shall speak " * 50)
    monkeypatch.chdir(tmp_path)
    # a bare flag before the inputs is true, not the input's name; "--" before an input that starts with "-"
    assert prepare_data.main(["--skip_bad", "b.txt", "--quiet", "--out", "o1", "--", "-dash.txt"]) == 0
    assert json.load(open(tmp_path / "o1" / "manifest.json"))["settings"]["skip_bad"] is True
    m = prepare("-dash.txt", str(tmp_path / "o2"), name=None, quiet=True)          # None: the default name
    assert m["name"] == "o2"
    assert prepare_data.main(["b.txt", "--out", "o3", "--inputs", "x"]) == 2      # no setting of that name
    assert capsys.readouterr().err.startswith("error: unknown setting --inputs; valid settings: out, ")


def test_bad_shards_are_named(tmp_path, text):
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    m, out = prep(tmp_path, [tmp_path / "a.txt"])
    val = os.path.join(out, m["shards"]["val"][0]["file"])
    good = open(val, "rb").read()
    with open(val, "wb") as f:
        f.write(good[:-10])                                                      # cut short
    with pytest.raises(UserError, match="val_000000.bin: its header says .* but the file has"):
        open_prepared(out, 8)
    hand_shard(val, np.zeros(10), count=11)                                      # the header lies
    with pytest.raises(UserError, match="header says 11 tokens"):
        open_prepared(out, 8)
    hand_shard(val, np.zeros(10), magic=12345)
    with pytest.raises(UserError, match="magic 12345 version 1 is not an llm.c token shard"):
        open_prepared(out, 8)
    with open(val, "wb") as f:
        f.write(good)
    with pytest.raises(UserError, match="the val split's longest shard has .* block_size 5000"):
        open_prepared(out, 5000)
    with pytest.raises(UserError, match="not .*'s \\(tokenizer.json, a char tokenizer of"):
        open_prepared(out, 8, CharTokenizer("abc"))
    manifest = open(os.path.join(out, "manifest.json")).read()
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write(manifest[:len(manifest) // 2])
    with pytest.raises(UserError, match="manifest.json is damaged or not minigpt's"):
        open_prepared(out, 8)
    d = tmp_path / "llmc"
    d.mkdir()
    hand_shard(d / "x_train_000000.bin", np.arange(100))
    hand_shard(d / "x_val_000000.bin", np.arange(100))
    with pytest.raises(UserError, match="x_(train|val)_000000.bin holds token id 99, but the tokenizer has 47 ids"):
        open_prepared(str(d), 8, CharTokenizer.from_text(text))
    with pytest.raises(UserError, match="holds files prepare_data.py did not write|another program"):
        prep(tmp_path, [tmp_path / "a.txt"], "llmc")


def test_killed_prepare_is_refused_then_redone(tmp_path, text, monkeypatch):
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    clean, _ = prep(tmp_path, [tmp_path / "a.txt"], "clean", shard_tokens=4000, name="out")
    finish, calls = ShardWriter._finish, []

    def dies(self):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        finish(self)
    monkeypatch.setattr(ShardWriter, "_finish", dies)
    with pytest.raises(RuntimeError):
        prep(tmp_path, [tmp_path / "a.txt"], shard_tokens=4000)
    out = tmp_path / "out"
    assert (out / "tokenizer.json").exists() and not (out / "manifest.json").exists()
    assert any(n.endswith(".tmp") for n in os.listdir(out)) and (out / "out_train_000001.bin").exists()
    with pytest.raises(UserError, match="no manifest.json: a prepare_data.py run into it did not finish"):
        open_prepared(str(out), 8)
    with pytest.raises(UserError, match="did not finish"):
        open_prepared(str(out), 8, CharTokenizer.from_text(text))                # not an llm.c folder either
    monkeypatch.setattr(ShardWriter, "_finish", finish)
    again, _ = prep(tmp_path, [tmp_path / "a.txt"], shard_tokens=4000)
    assert again["shards"] == clean["shards"] and not any(n.endswith(".tmp") for n in os.listdir(out))
    tok, ds, _ = open_prepared(str(out), 8)
    assert np.array_equal(ds.ids("train"), tok.encode(split_text(text)[0]))


def test_parquet_needs_pyarrow_or_reads(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    try:
        import pyarrow
        import pyarrow.parquet as pq
        pq.write_table(pyarrow.table({"text": ["to be or not " * 20, "the king shall " * 20, None]}), path)
        m, _ = prep(tmp_path, [path])
        assert sum(m["documents"].values()) == 2
    except ImportError:
        path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UserError, match="reading Parquet needs pyarrow"):
        prep(tmp_path, [path], "p2")


def test_command_line_errors_are_one_line_with_status_2(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 100)
    script = os.path.join(ROOT, "scripts", "prepare_data.py")
    ok = subprocess.run([sys.executable, script, str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"),
                         "--workers", "1"], capture_output=True, text=True)
    assert ok.returncode == 0 and "encode:" in ok.stderr and (tmp_path / "o" / "manifest.json").exists()
    assert prepare_data.main([str(tmp_path / "nope.txt"), "--out", str(tmp_path / "p")]) == 2
    assert prepare_data.main([str(tmp_path / "a.txt")]) == 2                        # --out is required
    bad = subprocess.run([sys.executable, script, str(tmp_path / "nope.txt"), "--out", str(tmp_path / "p")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")
