"""GPT-2's tokenizer (minigpt/gpt2_tokenizer.py) against Hugging Face `tokenizers`: GPT-2-style tokenizer.json
files are built here (a ByteLevel pre-tokenizer and a BPE trained on a text; no network), and the ids must be
identical on a torture text and on Shakespeare."""
import json
import os
import re

import numpy as np
import pytest

from helpers import shakespeare_path, write_text
from minigpt.bpe import bytes_to_unicode
from minigpt.errors import UserError
from minigpt.gpt2_tokenizer import GPT2_REGEX, GPT2Tokenizer, gpt2_pattern

tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed (pip install -e "
                                                     "'.[test]')")

TORTURE = ("I'm sure you've seen it; they'll say we'd 'quote' it's JOHN'S. Don't!  \n\n\n  x\t\ty \r\n"
           "3.14159 and 1,000,000 or 42nd 2024-11-24 \u00bd \u00b2 \u2167 \u0663\u0664\n"
           "caf\u00e9 na\u00efve e\u0301 \u00c5ngstr\u00f6m \u0141\u00f3d\u017a  \u0391\u03b8\u03ae\u03bd\u03b1 "
           "\u041c\u043e\u0441\u043a\u0432\u0430 \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627\n"
           "\u6771\u4eac\u90fd \u3053\u3093\u306b\u3061\u306f \ud55c\uad6d\uc5b4 \U0001f600\U0001f44d\U0001f3fd "
           "\U0001f1eb\U0001f1f7 \u2764\ufe0f\n"
           "\x00\x01\x1c\x1f\x7f \ufeff\u200b\u200d \u00a0\u2003\u3000 end   \n\t \x0b\x0c\u2028\u2029\x85"
           "  <|endoftext|> after<|endoftext|>x '''''  ''s 's's \n")


def shakespeare():
    path = shakespeare_path()
    if path is not None:
        with open(path, encoding="utf-8") as f:
            return f.read()[:200_000]
    return None


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A GPT-2-style tokenizer.json and vocab.json + merges.txt, trained here by `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("gpt2tok")
    text = write_text(d / "train.txt", n_chars=40_000) + TORTURE * 3 + (shakespeare() or "")[:50_000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)        # GPT-2's regex and byte map
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.save(str(d / "tokenizer.json"))
    os.makedirs(d / "vm")
    tok.model.save(str(d / "vm"))                                               # vocab.json, merges.txt
    return d, tok


def test_ids_equal_hugging_face_on_the_torture_text(hf_dir):
    d, hf = hf_dir
    ours = GPT2Tokenizer.from_pretrained(str(d))
    for text in (TORTURE, TORTURE[::-1], TORTURE.upper(), " " + TORTURE, "".join(reversed(TORTURE.split(" ")))):
        want = hf.encode(text).ids
        got = ours.encode(text).tolist()
        assert got == want, next((i, got[i:i + 5], want[i:i + 5]) for i in range(len(want)) if got[i] != want[i])
        assert ours.decode(got) == text                                          # bytes round-trip exactly


@pytest.mark.skipif(shakespeare() is None, reason="tiny Shakespeare is neither in data/ nor in ../shared/data/")
def test_ids_equal_hugging_face_on_shakespeare(hf_dir):
    d, hf = hf_dir
    text = shakespeare()
    assert GPT2Tokenizer.from_pretrained(str(d)).encode(text).tolist() == hf.encode(text).ids


def test_vocab_and_merges_files_give_the_same_ids(hf_dir):
    d, hf = hf_dir
    vm = GPT2Tokenizer.from_pretrained(str(d / "vm"))
    text = TORTURE.replace("<|endoftext|>", "")                                 # vocab.json knows no added tokens
    assert vm.encode(text).tolist() == hf.encode(text).ids


def test_pre_tokenization_is_gpt2s(hf_dir):
    """The split itself, against `tokenizers`' own ByteLevel pre-tokenizer, piece by piece."""
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    text = TORTURE.replace("<|endoftext|>", "")
    want = [p for p, _ in pre.pre_tokenize_str(text)]
    byte_char = __import__("minigpt.bpe", fromlist=["bytes_to_unicode"]).bytes_to_unicode()
    got = ["".join(byte_char[b] for b in piece.encode("utf-8")) for piece in gpt2_pattern().findall(text)]
    assert got == want


def test_ascii_pattern_splits_ascii_text_as_the_full_one():
    """encode() splits ASCII text with gpt2_pattern(ascii_only=True): on every ASCII string it must cut the same
    pieces as the full pattern and as `tokenizers`' ByteLevel pre-tokenizer."""
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_char = bytes_to_unicode()
    rng = np.random.default_rng(0)
    alphabet = [chr(c) for c in range(128)] + ["'s", "'ll", "'re", " ", "  ", "\n", "\r\n", "_", "a", "Z", "7"] * 4
    for _ in range(200):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 60))))
        pieces = gpt2_pattern(ascii_only=True).findall(text)
        assert pieces == gpt2_pattern().findall(text), repr(text)
        want = [p for p, _ in pre.pre_tokenize_str(text)]                   # pieces in GPT-2's byte characters
        assert ["".join(byte_char[b] for b in p.encode()) for p in pieces] == want, repr(text)


def test_checkpoint_json_round_trip(hf_dir):
    d, hf = hf_dir
    tok = GPT2Tokenizer.from_pretrained(str(d))
    back = GPT2Tokenizer.from_json(tok.to_json())
    np.testing.assert_array_equal(back.encode(TORTURE), tok.encode(TORTURE))
    # the trainer stops short of 700 when the text runs out of pairs (without ../shared's Shakespeare beside it)
    assert back.vocab_size == tok.vocab_size == hf.get_vocab_size() > 257


def test_other_tokenizers_are_clear_errors(hf_dir, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    other.train_from_iterator(["to be or not to be"] * 10, trainers.BpeTrainer(vocab_size=40))
    other.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UserError, match="not GPT-2's byte-level BPE"):
        GPT2Tokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="not a readable tokenizer.json"):
        GPT2Tokenizer.from_pretrained(str(tmp_path))
    with pytest.raises(UserError, match="no tokenizer.json"):
        GPT2Tokenizer.from_pretrained(str(tmp_path / "nothing"))


def test_bad_ids_text_and_checkpoint_json_are_clear_errors(hf_dir):
    """Ids outside the vocabulary (a negative one indexed from the end), a lone surrogate, a damaged tokenizer in
    a checkpoint: each a one-line error, as BPETokenizer's; the character tokenizer's ids too."""
    from minigpt.data import CharTokenizer
    from minigpt.tokenizer import tokenizer_from_json
    tok = GPT2Tokenizer.from_pretrained(str(hf_dir[0]))
    for decode, bad in ((tok.decode, -1), (tok.decode, tok.vocab_size),
                        (CharTokenizer.from_text("abc").decode, -1), (CharTokenizer.from_text("abc").decode, 3)):
        with pytest.raises(ValueError, match="token ids must lie in"):
            decode([0, bad])
    with pytest.raises(UserError, match="lone surrogate"):
        tok.encode("a\udcffb")
    for damaged in ('{"kind": "gpt2"}', '{"kind": "gpt2", "vocab": {}, "merges": []}'):
        with pytest.raises(UserError, match="GPT-2 tokenizer is damaged"):
            tokenizer_from_json(damaged)


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("change,words", [
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "it has a normalizer (Lowercase)"),
    (lambda d: d["model"].update(ignore_merges=True), "its BPE model sets ignore_merges=True"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "its added token '<|endoftext|>' sets lstrip"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [      # Llama 3's shape, its regex
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}),
     "not GPT-2's byte-level BPE"),
])
def test_tokenizers_of_other_rules_are_refused(hf_dir, tmp_path, change, words):
    """A tokenizer.json whose rules give other ids than GPT-2's (a normalizer, ignore_merges, an added token that
    strips, another regex in a Split) is an error naming what differs, not a tokenizer that encodes otherwise."""
    d = json.loads((hf_dir[0] / "tokenizer.json").read_text(encoding="utf-8"))
    change(d)
    (tmp_path / "tokenizer.json").write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(words)):
        GPT2Tokenizer.from_pretrained(str(tmp_path))


def test_gpt2s_own_regex_in_a_split_loads(hf_dir, tmp_path):
    """The same tokenizer with GPT-2's regex as a Split before a regex-free ByteLevel (how some GPT-2 ports spell
    it) loads and encodes as the plain ByteLevel one."""
    d = json.loads((hf_dir[0] / "tokenizer.json").read_text(encoding="utf-8"))
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(d), encoding="utf-8")
    got = GPT2Tokenizer.from_pretrained(str(tmp_path)).encode(TORTURE)
    np.testing.assert_array_equal(got, GPT2Tokenizer.from_pretrained(str(hf_dir[0])).encode(TORTURE))
