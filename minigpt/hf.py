"""A minigpt checkpoint as a Hugging Face transformers GPT-2 directory (scripts/export_hf.py is its command).

The weights need only renames: minigpt's Linear weights are (in, out), as GPT-2's Conv1D; only an untied lm_head
is transposed. Biases minigpt lacks (bias=false) are written as zeros, which is the same function. The tanh GELU
is transformers' "gelu_new". safetensors is written here, so the export needs neither torch nor transformers.
"""
import json
import os
import struct

import numpy as np

from . import checkpoint
from .bpe import BPETokenizer
from .tokenizer import tokenizer_from_json
from .errors import UserError
from .gpt2_tokenizer import GPT2Tokenizer
from .layers import LN_EPS


# ----------------------------------------------------------------------------
# weights: minigpt names -> GPT2LMHeadModel names

def hf_tensors(params, n_layer, tie_weights):
    """{HF name: float32 array} from minigpt's params; every minigpt parameter must be used exactly once."""
    left = dict(params)

    def take(name):
        if name not in left:
            raise UserError(f"the checkpoint lacks parameter {name!r}, which its model_config implies; it is "
                            "damaged or was made by another minigpt model code")
        return left.pop(name)

    out = {"transformer.wte.weight": take("wte.weight"),                      # (V, C) in both
           "transformer.wpe.weight": take("wpe.weight")}                      # (T, C)
    norms, linears = ["ln_1", "ln_2"], ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    for name in [f"h.{i}.{m}" for i in range(n_layer) for m in norms + linears] + ["ln_f"]:
        w = take(f"{name}.weight")                                        # Linear (in, out) = Conv1D's
        out[f"transformer.{name}.weight"] = w
        out[f"transformer.{name}.bias"] = left.pop(f"{name}.bias", np.zeros(w.shape[-1], w.dtype))   # (out,)
    if not tie_weights:
        out["lm_head.weight"] = take("lm_head.weight").T                  # (C, V) -> nn.Linear's (V, C)
    if left:
        raise UserError(f"the checkpoint has parameters a GPT-2 model has no place for: {sorted(left)[:4]}; "
                        "it was made by another minigpt model code")
    return {k: np.ascontiguousarray(v, dtype="<f4") for k, v in out.items()}


def write_safetensors(path, tensors):
    """The safetensors format: 8-byte little-endian header size, a JSON header (name -> dtype, shape, byte
    offsets into the data), padded with spaces to 8 bytes, then the raw little-endian data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0                   # transformers requires "pt"
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path + ".part", "wb") as f:                                 # renamed into place once whole
        f.write(struct.pack("<Q", len(head)) + head)
        for a in tensors.values():
            f.write(a.tobytes())
    os.replace(path + ".part", path)


def gpt2_config(mc):
    """GPT2Config for minigpt's model_config: tanh GELU is "gelu_new"; eval-only, so no dropout; no special
    tokens (minigpt has none), so generate() runs to max_new_tokens."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": mc["vocab_size"],
            "n_positions": mc["block_size"], "n_embd": mc["n_embd"], "n_layer": mc["n_layer"],
            "n_head": mc["n_head"], "n_inner": 4 * mc["n_embd"], "activation_function": "gelu_new",
            "layer_norm_epsilon": LN_EPS, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": mc["tie_weights"], "bos_token_id": None, "eos_token_id": None,
            "pad_token_id": None, "use_cache": True, "dtype": "float32"}


# options of the model that GPT2LMHeadModel has no setting for (absent from older checkpoints: then off)
NOT_GPT2 = {"activation": ("gelu", "--activation relu2 (GPT-2's MLP is GELU)"),
            "qk_norm": (False, "--qk_norm (GPT-2 has no norm on q and k)"),
            "logit_cap": (0.0, "--logit_cap (GPT-2 does not cap its logits)")}


def check_expressible(mc, ckpt):
    """A UserError naming the first model option a GPT-2 config cannot express, so no wrong model is written."""
    for k, (gpt2_value, what) in NOT_GPT2.items():
        if mc.get(k, gpt2_value) != gpt2_value:
            raise UserError(f"{ckpt}: the model uses {what}; a Hugging Face GPT-2 cannot express it, so it is not "
                            "exported")


# ----------------------------------------------------------------------------
# the directory

def check_out(out, force):
    """--out must name a directory to write into (nothing is made yet: the checkpoint is checked first)."""
    if not out:
        raise UserError("--out DIR is required: the directory to write the Hugging Face model into")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out!r} is a file; pass a directory path")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise UserError(f"--out {out!r} is not empty; pass --force to write into it, or another --out")


def _prepare(out, force):
    check_out(out, force)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {out!r} ({e.strerror}); pass a writable directory") from None


def _write_text(path, text):
    """path's new text, written to a temporary name and renamed into place: an earlier export's file stays
    whole until then."""
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".part", path)


def _write_json(path, obj):
    _write_text(path, json.dumps(obj, indent=1, ensure_ascii=False))


# every file export() writes: the model's two, and one tokenizer's (a BPE's two, or minigpt's characters)
EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "minigpt_chars.json")


def export(ckpt, out, force=False):
    """Write the Hugging Face directory `out` for checkpoint file `ckpt`; -> the names of the files written. Each
    file is renamed into place once whole; then, with --force, an earlier export's files of the other kind of
    tokenizer go, so that transformers cannot load a tokenizer that does not belong to the model."""
    check_out(out, force)                                          # before a 124M checkpoint is read
    meta, params, _ = checkpoint.load(ckpt)
    if "model_config" not in meta or "tokenizer" not in meta:
        raise UserError(f"{ckpt}: the checkpoint has no model_config or tokenizer; export a training run's checkpoint")
    mc, tok = meta["model_config"], tokenizer_from_json(meta["tokenizer"])
    if tok.vocab_size != mc["vocab_size"]:
        raise UserError(f"{ckpt}: the tokenizer has {tok.vocab_size} tokens but the model {mc['vocab_size']}")
    check_expressible(mc, ckpt)
    tensors = hf_tensors(params, mc["n_layer"], mc["tie_weights"])
    _prepare(out, force)
    try:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        _write_json(os.path.join(out, "config.json"), gpt2_config(mc))
        if isinstance(tok, (BPETokenizer, GPT2Tokenizer)):
            _write_text(os.path.join(out, "tokenizer.json"), tok.to_hf_json())
            _write_json(os.path.join(out, "tokenizer_config.json"), {
                "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": mc["block_size"],
                "model_input_names": ["input_ids", "attention_mask"],     # token_type_ids would add wte rows
                "clean_up_tokenization_spaces": False})
            written = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        else:
            _write_json(os.path.join(out, "minigpt_chars.json"), tok.chars)
            written = ["config.json", "model.safetensors", "minigpt_chars.json"]
        for name in set(EXPORTED) - set(written):                 # an earlier export's other tokenizer
            if os.path.isfile(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
    except OSError as e:
        raise UserError(f"cannot write into --out {out!r} ({e.strerror}); pass a writable directory") from None
    return written
