"""Which tokenizer a checkpoint holds: the three kinds minigpt saves, read back from their JSON string."""
import json

from .bpe import BPETokenizer
from .config import UserError
from .data import CharTokenizer
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
    raise UserError("the checkpoint's tokenizer is neither a character list nor a BPE tokenizer (kind 'bpe' or "
                    "'gpt2'); it may be damaged or from a newer minigpt")
