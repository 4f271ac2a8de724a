"""Which tokenizer a checkpoint or a prepared directory holds: the three kinds minigpt saves, read back from their
JSON string, and a tokenizer named by a path (a GPT-2 directory, a tokenizer.json, a prepared directory)."""
import json
import os

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


def tokenizer_from_path(path):
    """The tokenizer at path: a prepared directory's tokenizer.json (minigpt's JSON), a GPT-2 model directory
    (tokenizer.json or vocab.json + merges.txt), or a file: Hugging Face's tokenizer.json or minigpt's JSON."""
    from .shards import MANIFEST, TOKENIZER                             # (shards.py imports this module)
    if os.path.isdir(path):
        own = os.path.join(path, TOKENIZER)
        if os.path.exists(own) and os.path.exists(os.path.join(path, MANIFEST)):
            path = own                                                  # a prepared directory: minigpt's JSON
        else:
            return GPT2Tokenizer.from_pretrained(path)
    if not os.path.isfile(path):
        raise UserError(f"tokenizer {path!r} does not exist; pass char, bpe, a GPT-2 directory or a tokenizer.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        d = json.loads(text)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable tokenizer JSON ({type(e).__name__}: {e})") from None
    if isinstance(d, dict) and "model" in d:                            # Hugging Face's tokenizer.json
        return GPT2Tokenizer.from_hf_json(path)
    return tokenizer_from_json(text)
