"""Which tokenizer a checkpoint or a prepared directory holds: the three kinds minigpt saves, read back from their
JSON string. (A tokenizer named by a path: shards.tokenizer_from_path.)"""
import json

from .bpe import BPETokenizer
from .data import CharTokenizer
from .errors import UserError
from .gpt2_tokenizer import GPT2Tokenizer


def tokenizer_from_json(s):
    """The tokenizer a checkpoint's "tokenizer" string describes: a JSON list is a CharTokenizer's characters
    (data.py), a dict with "kind": "bpe" a BPETokenizer (bpe.py), "kind": "gpt2" GPT-2's (gpt2_tokenizer.py)."""
    try:
        d = json.loads(s)
    except (TypeError, ValueError):
        d = None
    if isinstance(d, list):
        return CharTokenizer.from_json(s)
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "bpe":
        return BPETokenizer.from_json(s)
    if kind == "gpt2":
        return GPT2Tokenizer.from_json(s)
    raise UserError("the tokenizer JSON (a checkpoint's, or a prepared directory's tokenizer.json) is neither a "
                    "character list nor a BPE tokenizer (kind 'bpe' or 'gpt2'); it may be damaged or from a newer "
                    "minigpt")


def tokenizer_kind(tok):
    """"char", "bpe" or "gpt2": the kind of a tokenizer object, as a manifest names it."""
    return {CharTokenizer: "char", BPETokenizer: "bpe", GPT2Tokenizer: "gpt2"}[type(tok)]
