"""Export a minigpt checkpoint as a Hugging Face transformers GPT-2 directory, then load and generate with:

    from transformers import AutoTokenizer, GPT2LMHeadModel
    tok, model = AutoTokenizer.from_pretrained("DIR"), GPT2LMHeadModel.from_pretrained("DIR")
    x = tok("ROMEO:", return_tensors="pt")
    print(tok.decode(model.generate(**x, max_length=model.config.n_positions, do_sample=True)[0]))

    python scripts/export_hf.py --out_dir out --out DIR [--ckpt FILE] [--force]

DIR gets config.json (GPT2Config), model.safetensors (float32) and, for a BPE tokenizer, tokenizer.json and
tokenizer_config.json. A character tokenizer has no Hugging Face form here: DIR gets minigpt_chars.json, the
list of characters (id i is chars[i]); map text with ids = [chars.index(c) for c in text] and pass
torch.tensor([ids]) to model.generate. The weights need only renames: minigpt's Linear weights are (in, out),
as GPT-2's Conv1D; only an untied lm_head is transposed. Biases minigpt lacks (bias=false) are written as zeros,
which is the same function. The export needs neither torch nor transformers (safetensors is written here).
GPT-2 in transformers does not crop its context: prompt and new tokens together must fit in block_size
(n_positions), hence max_length above; minigpt's own sampler slides a window instead.
"""
import sys

from minigpt.config import ExportConfig, parse_args, run_command
from minigpt.errors import UserError
from minigpt.hf import check_out, export
from minigpt.outdir import OutDir


def main(argv):
    try:
        cfg = parse_args(argv, ExportConfig, prog="export_hf.py", description=__doc__)
        check_out(cfg.out, cfg.force)                                  # --out first: it is required
        path = cfg.ckpt or OutDir(cfg.out_dir).checkpoint()
        files = export(path, cfg.out, cfg.force)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(files)} to {cfg.out} (from {path})")
    if "minigpt_chars.json" in files:
        print("character tokenizer: chars = json.load(open('minigpt_chars.json')); ids = [chars.index(c) for c in "
              "text]; text = ''.join(chars[i] for i in ids)")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))
