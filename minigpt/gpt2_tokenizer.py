"""GPT-2's tokenizer, read from a Hugging Face tokenizer.json (or vocab.json + merges.txt), in minigpt's tokenizer
interface (encode, decode, token_bytes, vocab_size, to_json): byte-level BPE with GPT-2's pre-tokenization
pattern and merge ranks.

GPT-2 splits text with `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`. Python's `re`
has no \\p{...} classes, so the letter and number classes are built here from unicodedata (categories L* and N*)
and \\s from Unicode's White_Space list, which is what the Rust regex of Hugging Face `tokenizers` matches; each
piece's UTF-8 bytes are mapped to GPT-2's printable characters, merged by rank, and looked up in the vocabulary.
Added tokens (<|endoftext|>) are matched literally first, as `tokenizers` does. Not here: training (bpe.py trains
minigpt's own BPE), normalizers, byte fallback, tokenizers of other models (a clear error names what was found).
"""
import functools
import json
import os
import re
import sys
import unicodedata

import numpy as np

from .bpe import KERNEL_MIN_WORDS, MergeTable, _utf8, bytes_to_unicode, encode_words
from .errors import UserError
from .data import checked_ids

# Unicode's White_Space property (PropList.txt): what Rust's \s matches (Python's \s differs at \x1c-\x1f)
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@functools.lru_cache(maxsize=2)
def gpt2_pattern(ascii_only=False):
    """GPT-2's pre-tokenization regex for Python's `re`, its \\p{L} and \\p{N} spelled out as code point ranges
    (built once per process, a fraction of a second). ascii_only: the same pattern with every class cut to code
    points below 128, which splits ASCII text exactly as the full one and runs faster on it (smaller classes)."""
    top = 128 if ascii_only else sys.maxunicode + 1
    ranges = {"L": [], "N": []}
    for cp in range(top):
        cls = unicodedata.category(chr(cp))[0]
        if cls in ranges:
            r = ranges[cls]
            if r and r[-1][1] == cp - 1:
                r[-1][1] = cp
            else:
                r.append([cp, cp])

    def klass(r):
        return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in r)

    L, N = klass(ranges["L"]), klass(ranges["N"])
    S = ("".join(re.escape(chr(c)) for c in range(128) if re.match(f"[{WHITE_SPACE}]", chr(c))) if ascii_only
         else WHITE_SPACE)
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


class GPT2Tokenizer:
    """vocab: {token string: id} over GPT-2's byte characters; merges: [(a, b), ...] in rank order; added:
    {literal text: id} matched before pre-tokenization."""

    def __init__(self, vocab, merges, added=None):
        self.vocab = dict(vocab)
        self.merges = [tuple(m) for m in merges]
        self.added = dict(added or {})
        self._rank = {m: i for i, m in enumerate(self.merges)}
        self._byte_char = bytes_to_unicode()                # byte -> printable character; also a str.translate table
        self._char_byte = {c: b for b, c in self._byte_char.items()}
        n = max([*self.vocab.values(), *self.added.values()]) + 1
        self._strings = [None] * n
        for s, i in {**self.vocab, **self.added}.items():
            self._strings[i] = s
        self._added_rx = (re.compile("|".join(re.escape(t) for t in sorted(self.added, key=len, reverse=True)))
                          if self.added else None)
        self.dtype = np.uint16 if n <= 65536 else np.int32
        self._cache = {}                                                    # piece -> ids
        self._table = None                                                  # bpe.MergeTable, on first use

    @property
    def vocab_size(self):
        return len(self._strings)

    # ---- encoding
    def _bpe(self, word):
        """A pre-tokenized piece (GPT-2 characters) -> its token ids. The lowest-ranked adjacent pair merges first,
        the leftmost of equal pairs first, one merge at a time (as `tokenizers` does); ranks[k] is the rank of
        (parts[k], parts[k + 1]), and only the two pairs beside a merge change."""
        rank, none = self._rank, len(self._rank)
        parts = list(word)
        ranks = [rank.get(pair, none) for pair in zip(parts, parts[1:])]
        while ranks:
            r = min(ranks)
            if r == none:
                break                                                       # no pair left to merge
            k = ranks.index(r)
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
            del ranks[k]
            if k > 0:
                ranks[k - 1] = rank.get((parts[k - 1], parts[k]), none)
            if k < len(ranks):
                ranks[k] = rank.get((parts[k], parts[k + 1]), none)
        try:
            return [self.vocab[p] for p in parts]
        except KeyError as e:
            raise UserError(f"the tokenizer's vocabulary lacks the piece {e.args[0]!r}, which its merges make; the "
                            "tokenizer files are inconsistent") from None

    def _encode_plain(self, text, out):
        """Appends the ids of text (no added tokens in it) to out. ASCII text is split by the ASCII-only regex. The
        cache maps a piece, as the regex found it, to its ids: a repeated word costs one lookup."""
        out.extend(encode_words(gpt2_pattern(text.isascii()).findall(text), self._cache, self._encode_new))

    def _encode_new(self, pieces):
        """Pieces not in the cache -> their ids: one by one, or many at once by bpe.py's compiled merge loop."""
        if len(pieces) < KERNEL_MIN_WORDS:
            # piece -> its UTF-8 bytes, one character per byte (latin-1) -> GPT-2's printable characters
            return [self._bpe(_utf8(p).decode("latin-1").translate(self._byte_char)) for p in pieces]
        if self._table is None:
            v = self.vocab
            rank = {(v[a], v[b]): j for (a, b), j in self._rank.items() if a in v and b in v}
            self._table = MergeTable(rank, [v.get(a + b, -1) for a, b in self.merges],
                                     [v.get(self._byte_char[b], -1) for b in range(256)], self.vocab_size)
        return self._table.merge(pieces, _utf8)

    def encode(self, text):
        """str -> ids (N,)."""
        out, start = [], 0
        if self._added_rx is not None:
            for m in self._added_rx.finditer(text):
                self._encode_plain(text[start:m.start()], out)
                out.append(self.added[m.group(0)])
                start = m.end()
        self._encode_plain(text[start:], out)
        return np.asarray(out, self.dtype)

    # ---- decoding
    def token_bytes(self, i):
        s = self._strings[checked_ids(i, len(self._strings))[0]]
        if s is None:
            raise UserError(f"token id {int(i)} is not in the tokenizer's vocabulary")
        if s in self.added:
            return s.encode("utf-8")
        return bytes(self._char_byte[c] for c in s)

    def decode(self, ids):
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    # ---- serialization: in minigpt checkpoints, and from Hugging Face files
    def to_json(self):
        return json.dumps({"kind": "gpt2", "version": 1, "vocab": self.vocab, "merges": [" ".join(m) for m in
                                                                                        self.merges],
                           "added": self.added}, ensure_ascii=False, separators=(",", ":"))

    def to_hf_json(self):
        """A Hugging Face tokenizer.json (as a string) that encodes as encode(): GPT-2's ByteLevel pre-tokenizer
        (its regex), these merges and vocabulary, the added tokens."""
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                  "special": True} for s, i in self.added.items()]
        model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": self.vocab, "merges": [" ".join(m) for m in self.merges]}
        return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                           "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
                           "decoder": byte_level, "model": model}, ensure_ascii=False)

    @classmethod
    def from_json(cls, s):
        """The tokenizer to_json() wrote (in a checkpoint); a damaged one is a UserError."""
        try:
            d = json.loads(s)
            return cls(d["vocab"], [m.split(" ") for m in d["merges"]], d.get("added"))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"the checkpoint's GPT-2 tokenizer is damaged ({type(e).__name__}: {e}); use another "
                            "checkpoint of the run") from None

    @classmethod
    def from_pretrained(cls, directory):
        """GPT-2's tokenizer from a Hugging Face model directory: tokenizer.json, else vocab.json + merges.txt."""
        tj = os.path.join(directory, "tokenizer.json")
        if os.path.exists(tj):
            return cls.from_hf_json(tj)
        vj, mt = os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
        if os.path.exists(vj) and os.path.exists(mt):
            return cls.from_vocab_merges(vj, mt)
        raise UserError(f"{directory}: no tokenizer.json, nor vocab.json + merges.txt; point at a GPT-2 model "
                        "directory (a Hugging Face snapshot holds them)")

    @classmethod
    def from_hf_json(cls, path):
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
            model = d["model"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path} is not a readable tokenizer.json ({type(e).__name__}: {e})") from None
        if model.get("type") != "BPE" or not _is_gpt2_pretokenizer(d.get("pre_tokenizer")):
            kind = (d.get("pre_tokenizer") or {}).get("type")
            raise UserError(f"{path} is a {model.get('type')} tokenizer with pre-tokenizer {kind}, not GPT-2's "
                            "byte-level BPE (ByteLevel with GPT-2's regex); only GPT-2-style tokenizers load here")
        other = _not_gpt2(d)
        if other:
            raise UserError(f"{path}: {other}, which GPT-2's tokenizer does not have, so its ids would differ from "
                            "this encoder's; only GPT-2-style tokenizers load here")
        merges = [m.split(" ") if isinstance(m, str) else m for m in model.get("merges", [])]
        added = {t["content"]: t["id"] for t in d.get("added_tokens", [])}
        return cls(model["vocab"], merges, added)

    @classmethod
    def from_vocab_merges(cls, vocab_path, merges_path):
        try:
            with open(vocab_path, encoding="utf-8") as f:
                vocab = json.load(f)
            with open(merges_path, encoding="utf-8") as f:
                lines = [ln.rstrip("\n") for ln in f if ln.strip() and not ln.startswith("#version")]
        except (OSError, ValueError) as e:
            raise UserError(f"{vocab_path} / {merges_path}: not a readable GPT-2 vocabulary and merges list "
                            f"({type(e).__name__}: {e})") from None
        added = {"<|endoftext|>": vocab["<|endoftext|>"]} if "<|endoftext|>" in vocab else {}
        return cls(vocab, [ln.split(" ") for ln in lines], added)


# GPT-2's pattern as a tokenizer.json spells it (a Split pre-tokenizer's "Regex")
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _is_gpt2_pretokenizer(pre):
    """ByteLevel with its own (GPT-2) regex, or a Sequence of a Split on GPT-2's very regex (isolated pieces)
    and a regex-free ByteLevel: Llama 3's and Qwen 2's have that shape with another regex."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return pre.get("use_regex", True) and not pre.get("add_prefix_space", False)
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers", [])
        if [p.get("type") for p in parts] != ["Split", "ByteLevel"]:
            return False
        split, byte_level = parts
        return (split.get("pattern") == {"Regex": GPT2_REGEX} and split.get("behavior") == "Isolated"
                and not split.get("invert", False) and not byte_level.get("use_regex", True)
                and not byte_level.get("add_prefix_space", False))
    return False


def _not_gpt2(d):
    """What in a tokenizer.json (with GPT-2's pre-tokenizer) changes the ids from GPT-2's rules, or ''."""
    model = d["model"]
    if d.get("normalizer"):
        return f"it has a normalizer ({d['normalizer'].get('type')})"
    for key in ("ignore_merges", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(key):                                           # GPT-2's: false, null or absent
            return f"its BPE model sets {key}={model[key]!r}"
    for t in d.get("added_tokens", []):
        flags = [k for k in ("lstrip", "rstrip", "single_word") if t.get(k)]
        if flags:
            return f"its added token {t.get('content')!r} sets {', '.join(flags)}"
    return ""
