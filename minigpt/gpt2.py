"""Start from a pretrained GPT-2: a Hugging Face transformers directory (config.json, model.safetensors, the
tokenizer files; a hub cache snapshot works as it is) becomes a minigpt model, its weights and its tokenizer.

GPT-2 is minigpt's architecture: learned positions, pre-LN blocks, the tanh GELU ("gelu_new"), biases, the head
tied to wte, and Conv1D weights stored (in, out) as minigpt's Linear stores them, so the weights need only
renames. As nanoGPT's crop_block_size, the positional table keeps its first block_size rows when the run asks for
a shorter context. safetensors is read here (a JSON header and raw arrays): neither torch nor transformers needed.
"""
import json
import os
import struct

import numpy as np

from .config import GPTConfig
from .errors import UserError
from .gpt2_tokenizer import GPT2Tokenizer
from .layers import LN_EPS

_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": None}


def read_safetensors(path):
    """{name: float32 array} of a .safetensors file (F32, F16, F64 or BF16 tensors): an 8-byte header length, a
    JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes. A damaged file is a UserError."""
    bad = f"{path} is not a valid safetensors file"
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > os.path.getsize(path) - 8:
                raise ValueError(f"its header length {n} runs past the end of the file")
            header = json.loads(f.read(n))
            data = f.read()
    except (OSError, struct.error, ValueError) as e:
        raise UserError(f"{bad} ({type(e).__name__}: {e}); download it again") from None
    if not isinstance(header, dict):
        raise UserError(f"{bad} (its header is not a JSON object); download it again")
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            a, b = t["data_offsets"]
            dtype, shape = t["dtype"], tuple(t["shape"])
            if not 0 <= a <= b <= len(data):
                raise ValueError(f"its bytes {a}..{b} lie outside the file's {len(data)}")
            raw = data[a:b]
            if dtype == "BF16":                                       # the top 16 bits of a float32
                arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif dtype in _DTYPES:
                arr = np.frombuffer(raw, _DTYPES[dtype]).astype(np.float32, copy=False)   # F32: no copy
            else:
                raise UserError(f"{path}: tensor {name} is {dtype}; only float tensors load here")
            out[name] = arr.reshape(shape)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{bad} (tensor {name!r}: {type(e).__name__}: {e}); download it again") from None
    return out


def read_config(directory, block_size=None):
    """-> (GPTConfig, n_positions) of a transformers GPT-2 directory's config.json, with block_size (at most
    n_positions; default n_positions) as the model's context; a UserError for anything minigpt cannot run."""
    if not os.path.isdir(directory):
        raise UserError(f"--init_from {directory!r} is not a directory; pass a GPT-2 model directory (config.json, "
                        "model.safetensors, tokenizer.json), e.g. a Hugging Face cache snapshot")
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--init_from {directory}: no readable config.json ({e}); point at a transformers GPT-2 "
                        "directory") from None
    if not isinstance(hf, dict):
        raise UserError(f"--init_from {directory}: config.json holds a JSON {type(hf).__name__}, not an object; point "
                        "at a transformers GPT-2 directory")
    if hf.get("model_type") != "gpt2":
        raise UserError(f"--init_from {directory}: model_type {hf.get('model_type')!r}, not 'gpt2'; only GPT-2 "
                        "checkpoints load (minigpt's architecture is GPT-2's)")
    needed = [k for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
              if not (isinstance(hf.get(k), int) and not isinstance(hf.get(k), bool) and hf[k] > 0)]
    if needed:
        raise UserError(f"--init_from {directory}: config.json lacks a positive integer {', '.join(needed)}; a "
                        "transformers GPT-2 config.json has them all")
    if (hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh")
            or abs(hf.get("layer_norm_epsilon", LN_EPS) - LN_EPS) > 1e-12
            or hf.get("n_inner") not in (None, 4 * hf["n_embd"])):
        raise UserError(f"--init_from {directory}: activation {hf.get('activation_function')}, layer_norm_epsilon "
                        f"{hf.get('layer_norm_epsilon')}, n_inner {hf.get('n_inner')}: minigpt runs GPT-2's tanh GELU, "
                        f"eps {LN_EPS} and a 4 x n_embd MLP only")
    n_pos = hf["n_positions"]
    block = n_pos if block_size is None else block_size
    if block > n_pos:
        raise UserError(f"--block_size {block} exceeds {directory}'s n_positions {n_pos}; pass --block_size {n_pos} "
                        "or less")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=block, n_layer=hf["n_layer"], n_head=hf["n_head"],
                     n_embd=hf["n_embd"], dropout=0.0, bias=True,
                     tie_weights=hf.get("tie_word_embeddings", True)), n_pos


def load_gpt2(directory, block_size=None):
    """-> (GPTConfig, {minigpt name: float32 array}, GPT2Tokenizer) of a transformers GPT-2 directory; the
    positional table cropped to block_size rows when given (at most n_positions)."""
    config, n_pos = read_config(directory, block_size)
    weights = os.path.join(directory, "model.safetensors")
    if not os.path.exists(weights):
        found = sorted(n for n in os.listdir(directory) if n.endswith((".bin", ".safetensors", ".json", ".h5")))
        why = ("it is sharded (model.safetensors.index.json): merge the shards into one model.safetensors"
               if "model.safetensors.index.json" in found else
               "it holds pickle weights only (pytorch_model.bin): convert them with transformers' "
               "save_pretrained(dir, safe_serialization=True)" if "pytorch_model.bin" in found else
               f"found {found}")
        raise UserError(f"--init_from {directory}: no model.safetensors; {why}")
    params = _rename(read_safetensors(weights), config, n_pos, directory)
    tok = GPT2Tokenizer.from_pretrained(directory)
    if tok.vocab_size > config.vocab_size:
        raise UserError(f"--init_from {directory}: the tokenizer has {tok.vocab_size} tokens, the model "
                        f"{config.vocab_size}; the directory mixes two models")
    return config, params, tok


def _rename(tensors, config, n_pos, directory):
    """transformers' GPT2LMHeadModel names -> minigpt's; the .attn.bias / masked_bias buffers are dropped."""
    t = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in tensors.items()
         if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    want = {"wte.weight": (config.vocab_size, config.n_embd), "wpe.weight": (n_pos, config.n_embd)}
    C = config.n_embd
    for l in range(config.n_layer):
        for name, shape in (("ln_1", (C,)), ("attn.c_attn", (C, 3 * C)), ("attn.c_proj", (C, C)), ("ln_2", (C,)),
                            ("mlp.c_fc", (C, 4 * C)), ("mlp.c_proj", (4 * C, C))):
            want[f"h.{l}.{name}.weight"], want[f"h.{l}.{name}.bias"] = shape, (shape[-1],)
    want["ln_f.weight"] = want["ln_f.bias"] = (C,)
    if not config.tie_weights:
        want["lm_head.weight"] = (config.vocab_size, C)                 # nn.Linear (V, C): transposed below
    missing = sorted(set(want) - set(t))
    if missing:
        raise UserError(f"--init_from {directory}: model.safetensors lacks {missing[:3]}; it is not a GPT-2 "
                        "GPT2LMHeadModel checkpoint")
    out = {}
    for k, shape in want.items():
        if t[k].shape != shape:
            raise UserError(f"--init_from {directory}: {k} has shape {t[k].shape}, config.json implies {shape}")
        out[k] = t[k]
    out["wpe.weight"] = out["wpe.weight"][:config.block_size]           # nanoGPT's crop_block_size
    if "lm_head.weight" in out:
        out["lm_head.weight"] = out["lm_head.weight"].T                 # minigpt's head is (C, V)
    return out
