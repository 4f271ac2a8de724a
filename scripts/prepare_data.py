"""Prepare a corpus once into token shards (llm.c's .bin format) that training memory-maps.

    python scripts/prepare_data.py data/tinyshakespeare.txt --out data/shakespeare_char
    python scripts/prepare_data.py books/ --tokenizer bpe --vocab_size 4096 --out data/books_bpe
    python scripts/prepare_data.py 'chats/*.jsonl' --field text --tokenizer path/to/gpt2 --out data/chats

--help lists the options; minigpt/prepare_data.py does the work. Every mistake is one line, "error: ...", and
exit status 2.
"""
import sys

from minigpt.config import run_command
from minigpt.prepare_data import main

if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))
