"""Byte-level BPE: training equals a slow reference that recounts every pair at every merge, any Unicode text
round-trips, the JSON forms load back, bad input is a UserError, and Hugging Face
`tokenizers` reading to_hf_json() gives the same ids on the corpus and on random Unicode."""
import json
import random
import re
from collections import Counter

import numpy as np
import pytest

from helpers import shakespeare_path, write_text
from minigpt.bpe import PATTERN, BPETokenizer
from minigpt.tokenizer import tokenizer_from_json
from minigpt.errors import UserError
from minigpt.data import CharTokenizer

NO_TOKENIZERS = "Hugging Face tokenizers is not a minigpt dependency; pip install tokenizers to run this"


def corpus(n=None):
    path = shakespeare_path()
    if path is None:
        pytest.skip("tiny Shakespeare is neither in data/ nor in ../shared/data/ (scripts/train_shakespeare.py "
                    "downloads it)")
    with open(path, encoding="utf-8") as f:
        return f.read(n)


@pytest.fixture(scope="module")
def sample_text(tmp_path_factory):
    """A training text every machine has: the tests' word text plus a little punctuation and numbers."""
    text = write_text(tmp_path_factory.mktemp("bpe") / "text.txt", n_chars=20000)
    return text + "\nIt's 1599, isn't it? -- 42 kings; 7 lords!\n"


@pytest.fixture(scope="module")
def tok(sample_text):
    return BPETokenizer.train(sample_text, 320)


def random_unicode(r, n):
    """A string of n code points mixing ASCII, Unicode whitespace, combining marks, other scripts' digits,
    CJK, emoji and contractions: where Python's re and Oniguruma could disagree."""
    ranges = [(0x20, 0x7e), (0xa0, 0xff), (0x300, 0x36f), (0x370, 0x4ff), (0x660, 0x669), (0x966, 0x96f),
              (0x2000, 0x206f), (0x3000, 0x303f), (0x4e00, 0x9fff), (0xff10, 0xff19), (0x1f300, 0x1faff),
              (0x10000, 0x10ffff)]
    special = ["\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u2028",
               "\u2029", "\u3000", "\u200b", " ", "  ", "'s", "'ll", "'re", "'ve", "'d", "'m", "'t", "'", "e\u0301"]
    out = []
    for _ in range(n):
        if r.random() < 0.35:
            out.append(r.choice(special))
        else:
            c = r.randint(*r.choice(ranges))
            out.append(chr(c) if not 0xd800 <= c < 0xe000 else "x")         # no lone surrogates: not UTF-8
    return "".join(out)


# ----------------------------------------------------------------------------
# training

def _merged(ids, pair, new):
    out, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def slow_train(text, vocab_size):
    """Reference BPE: recount every pair of every word at each merge; ties go to the smallest pair.
    -> (merges, the final ids of each word)."""
    freq = Counter(re.findall(PATTERN, text))
    segs = {w: list(w.encode("utf-8")) for w in freq}
    merges = []
    while 256 + len(merges) < vocab_size:
        counts = Counter()
        for w, ids in segs.items():
            for pair in zip(ids, ids[1:]):
                counts[pair] += freq[w]
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        segs = {w: _merged(ids, best, 255 + len(merges)) for w, ids in segs.items()}
    return merges, segs


def test_bpe_train_matches_slow_reference():
    """Incremental pair counts, the lazy heap and its tie-break give the reference's merges, and encode() gives
    the reference's final segmentation of the training text (the counts fall to ~2, so ties are many)."""
    text = corpus(30000)
    merges, segs = slow_train(text, 520)
    tok = BPETokenizer.train(text, 520)
    assert tok.merges == merges
    expect = [i for w in re.findall(PATTERN, text) for i in segs[w]]
    assert tok.encode(text).tolist() == expect


def test_bpe_train_on_written_text_matches_slow_reference(sample_text):
    assert BPETokenizer.train(sample_text, 300).merges == slow_train(sample_text, 300)[0]


def test_bpe_tokens_are_distinct_and_compress():
    text = corpus()
    tok = BPETokenizer.train(text, 1024)
    assert tok.vocab_size == 1024 and tok.dtype == np.uint16
    assert len({tok.token_bytes(i) for i in range(tok.vocab_size)}) == 1024     # a Hugging Face vocab needs this
    ids = tok.encode(text)
    assert len(text) / len(ids) > 2.3                                           # 2.43 measured
    assert tok.decode(ids) == text


def test_bpe_stops_when_the_text_runs_out_of_pairs():
    tok = BPETokenizer.train("abab", 1000)                   # pairs: (a, b), then (ab, ab)
    assert tok.vocab_size == 258 and tok.pieces([256, 257]) == ["ab", "abab"]


@pytest.mark.parametrize("bad", [0, 256, -5, 300.0, True, "512", None])
def test_bpe_bad_vocab_size_names_the_fix(bad):
    with pytest.raises(UserError, match=r"vocab_size must be an integer of at least 257.*use e\.g\. 512"):
        BPETokenizer.train("some text", bad)


def test_bpe_empty_text_is_a_user_error():
    with pytest.raises(UserError, match="empty text"):
        BPETokenizer.train("", 512)


# ----------------------------------------------------------------------------
# encode / decode

def test_bpe_round_trips_any_unicode(tok):
    r = random.Random(0)
    texts = ["", " ", "\n\n", "naïve café — 東京 😀👍🏽", "e\u0301\u0301", "\x00\x7f\U0010ffff"]
    texts += [random_unicode(r, r.randint(1, 60)) for _ in range(300)]
    for text in texts:
        ids = tok.encode(text)
        assert ids.dtype == np.uint16 and ids.max(initial=0) < tok.vocab_size
        assert tok.decode(ids) == text, repr(text)
    assert tok.decode(tok.encode("東京")) == "東京" and len(tok.encode("東京")) == 6        # unseen: 6 byte tokens


def test_bpe_merges_what_it_learned(tok, sample_text):
    assert len(tok.encode(sample_text)) < 0.6 * len(sample_text.encode("utf-8"))
    assert tok.pieces(tok.encode(" king")) == [" king"]


def test_bpe_decode_of_a_split_character_does_not_crash(tok):
    ids = tok.encode("é!")                                    # é is two bytes, c3 a9
    assert tok.decode(ids[:1]) == "\ufffd" and tok.pieces([0xc3, ord("a")]) == ["\\xc3", "a"]
    assert tok.decode([0xa9, 0xc3]) == "\ufffd\ufffd"
    assert tok.decode(np.array([], np.uint16)) == ""
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 320\)"):
        tok.decode([5, 320])
    with pytest.raises(ValueError, match="must lie in"):
        tok.decode([-1])


def test_bpe_lone_surrogate_is_a_user_error(tok):
    with pytest.raises(UserError, match="lone surrogate"):
        tok.encode("ab\ud800c")


def test_bpe_json_round_trip(tok, sample_text):
    d = json.loads(tok.to_json())
    assert d["kind"] == "bpe" and d["version"] == 1 and d["pattern"] == PATTERN and len(d["merges"]) == 64
    again = BPETokenizer.from_json(tok.to_json())
    assert again.merges == tok.merges and again.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(again.encode(sample_text), tok.encode(sample_text))


@pytest.mark.parametrize("bad", ["", "not json", "[]", '{"kind": "char"}', '{"kind": "bpe", "version": 1}',
                                 '{"kind": "bpe", "version": 1, "pattern": ".", "merges": [[97, 256]]}',
                                 '{"kind": "bpe", "version": 1, "pattern": "(", "merges": []}',
                                 '{"kind": "bpe", "version": 1, "pattern": ".", "merges": [[97, 98], [97, 98]]}'])
def test_bpe_from_json_rejects_what_is_not_a_tokenizer(bad):
    with pytest.raises(UserError, match="checkpoint may be damaged"):
        BPETokenizer.from_json(bad)


def test_tokenizer_from_json_picks_the_kind(tok):
    char = CharTokenizer.from_text("hello")
    assert isinstance(tokenizer_from_json(char.to_json()), CharTokenizer)   # a plain JSON list
    assert tokenizer_from_json(tok.to_json()).merges == tok.merges
    with pytest.raises(UserError, match="neither a character list nor a BPE"):
        tokenizer_from_json('{"kind": "wordpiece"}')


# ----------------------------------------------------------------------------
# Hugging Face tokenizers

def hf_tokenizer(tok, tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason=NO_TOKENIZERS)
    path = tmp_path / "tokenizer.json"
    tok.save_hf(path)
    return tokenizers.Tokenizer.from_file(str(path))


def test_hf_tokenizer_matches_on_the_corpus(tmp_path):
    text = corpus()
    tok = BPETokenizer.train(text[:200_000], 700)
    hf = hf_tokenizer(tok, tmp_path)
    chunk = text[600_000:900_000]                             # text the merges were not learned from
    ids = hf.encode(chunk).ids
    assert ids == tok.encode(chunk).tolist()
    assert hf.decode(ids) == chunk


def test_text_without_spaces_is_split_in_runs_and_trains_fast(tmp_path):
    """A text with no ASCII letters, digits or spaces (Chinese) is pre-tokenized in runs of at most 16 characters,
    not as one word, whose pair-by-pair merging grew with its length squared; Oniguruma splits it alike, and a
    BPE trained on it encodes as Hugging Face does."""
    r = random.Random(2)
    text = "".join(chr(0x4e00 + r.randrange(300)) if r.random() > 0.05 else "\uff0c" for _ in range(3000))
    words = re.findall(PATTERN, text)
    assert "".join(words) == text and max(map(len, words)) == 16 and len(words) == -(-len(text) // 16)
    tok = BPETokenizer.train(text, 400)
    hf = hf_tokenizer(tok, tmp_path)
    from tokenizers import Regex, pre_tokenizers
    split = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")
    assert [w for w, _ in split.pre_tokenize_str(text)] == words
    assert hf.encode(text).ids == tok.encode(text).tolist()


def test_hf_tokenizer_matches_on_random_unicode(tok, sample_text, tmp_path):
    hf = hf_tokenizer(tok, tmp_path)
    from tokenizers import Regex, pre_tokenizers
    split = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")   # the regex alone: a clearer failure
    r = random.Random(1)
    texts = [sample_text] + [random_unicode(r, r.randint(0, 80)) for _ in range(500)]
    for text in texts:
        assert [w for w, _ in split.pre_tokenize_str(text)] == re.findall(PATTERN, text), repr(text)
        ids = hf.encode(text).ids
        assert ids == tok.encode(text).tolist(), repr(text)
        assert hf.decode(ids) == text
