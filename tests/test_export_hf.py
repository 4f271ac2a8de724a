"""scripts/export_hf.py: a minigpt checkpoint loads as transformers' GPT2LMHeadModel with the same logits (tied and
untied head, with and without biases), a BPE tokenizer loads as a fast tokenizer that encodes like minigpt, and the
command's errors. The comparisons need transformers and torch (not minigpt dependencies) and skip without them."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from helpers import spec, tiny_cfg, write_text
from minigpt import checkpoint
from minigpt.bpe import BPETokenizer
from minigpt.errors import UserError
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
from minigpt.hf import export

NO_HF = "transformers and torch are not minigpt dependencies; pip install transformers torch to run this"


def hf():
    pytest.importorskip("torch", reason=NO_HF)
    return pytest.importorskip("transformers", reason=NO_HF)


def make_checkpoint(path, tok, tie=True, bias=True, seed=0, **options):
    """A small GPT with every parameter moved off its init (biases non-zero, LayerNorm weights not 1), saved
    with a training run's meta; the optimizer state is empty. -> the model."""
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=12, n_layer=2, n_head=2, n_embd=16, bias=bias,
                    tie_weights=tie, **options)
    model = GPT(cfg, np.random.default_rng(seed), ops=spec())
    r = np.random.default_rng(seed + 1)
    for p in model.params().values():
        p += (0.3 * r.standard_normal(p.shape)).astype(p.dtype)
    meta = {"model_config": cfg.to_dict(), "tokenizer": tok.to_json(), "iter": 0}
    checkpoint.save(str(path), model, AdamW(model.params(), ops=model.ops), meta)
    return model.eval()


def assert_same_logits(model, hf_model, ids):
    """minigpt's float32 logits and transformers' for ids (B, T), within float32 rounding."""
    import torch
    expect = model.forward(ids)[0].copy()                                      # (B, T, V)
    with torch.no_grad():
        got = hf_model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    assert got.shape == expect.shape
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * np.abs(expect).max())


# ----------------------------------------------------------------------------
# weights

@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_export_logits_match_transformers(tmp_path, tie, bias):
    transformers = hf()
    tok = CharTokenizer([chr(c) for c in range(40, 69)])                       # V = 29
    model = make_checkpoint(tmp_path / "ckpt.npz", tok, tie, bias)
    files = export(str(tmp_path / "ckpt.npz"), str(tmp_path / "hf"))
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(files) and "tokenizer.json" not in files
    hf_model, info = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info     # nothing left at its random init
    assert hf_model.config.tie_word_embeddings == tie and not hf_model.training
    ids = np.random.default_rng(2).integers(0, 29, (3, 12))                   # every position of the block
    assert_same_logits(model, hf_model, ids)
    with open(tmp_path / "hf" / "minigpt_chars.json", encoding="utf-8") as f:
        assert json.load(f) == tok.chars


def test_export_of_a_training_run_checkpoint(tmp_path):
    """The checkpoint train() writes (default model settings: tied head, no biases) exports and matches."""
    transformers = hf()
    from minigpt.train import train
    cfg = tiny_cfg(tmp_path, max_iters=2, eval_interval=2)
    train(cfg)
    ckpt = os.path.join(cfg.out_dir, "ckpt_best.npz")
    export(ckpt, str(tmp_path / "hf"))
    meta, params, _ = checkpoint.load(ckpt)
    model = GPT(GPTConfig(**meta["model_config"]), ops=spec())
    checkpoint.load_params(model, params)
    tok = CharTokenizer.from_json(meta["tokenizer"])
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"))
    assert_same_logits(model, hf_model, tok.encode(pathlib.Path(cfg.data).read_text(encoding="utf-8")[:200])[None, -16:].astype(np.int64))


@pytest.mark.parametrize("option,what", [(dict(activation="relu2"), "--activation relu2"),
                                         (dict(qk_norm=True), "--qk_norm"), (dict(logit_cap=30.0), "--logit_cap")])
def test_export_refuses_options_gpt2_cannot_express(tmp_path, option, what):
    """The speedrun's model options have no GPT-2 setting: one line naming the option, and nothing written.
    zero_init_proj is only an init, so such a model exports."""
    make_checkpoint(tmp_path / "c.npz", CharTokenizer.from_text("hello world"), **option)
    with pytest.raises(UserError, match=f"uses {what}.*cannot express it"):
        export(str(tmp_path / "c.npz"), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()
    make_checkpoint(tmp_path / "z.npz", CharTokenizer.from_text("hello world"), zero_init_proj=True)
    assert "model.safetensors" in export(str(tmp_path / "z.npz"), str(tmp_path / "hf2"))


def test_safetensors_written_by_hand_read_back(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="pip install safetensors to run this")
    tok = CharTokenizer(list("abcdefg"))
    model = make_checkpoint(tmp_path / "ckpt.npz", tok, tie=False, bias=False)
    export(str(tmp_path / "ckpt.npz"), str(tmp_path / "hf"))
    got = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    p = model.params()
    np.testing.assert_array_equal(got["transformer.h.1.attn.c_attn.weight"], p["h.1.attn.c_attn.weight"])
    np.testing.assert_array_equal(got["lm_head.weight"], p["lm_head.weight"].T)
    np.testing.assert_array_equal(got["transformer.h.0.mlp.c_fc.bias"], np.zeros(64, np.float32))
    assert len(got) == 2 + 2 * 12 + 2 + 1 and all(a.dtype == np.float32 for a in got.values())


# ----------------------------------------------------------------------------
# tokenizer

def test_export_bpe_tokenizer_encodes_and_generates_like_minigpt(tmp_path):
    transformers = hf()
    text = write_text(tmp_path / "text.txt", n_chars=8000)
    tok = BPETokenizer.train(text, 300)
    model = make_checkpoint(tmp_path / "ckpt.npz", tok, tie=True, bias=True)
    export(str(tmp_path / "ckpt.npz"), str(tmp_path / "hf"))
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"))
    for s in ["The king shall speak.", text[:500], "  naïve 東京 😀\u00a0\u2028x'll 42\n\n", ""]:
        ids = tok.encode(s).tolist()
        assert auto(s)["input_ids"] == ids and fast(s)["input_ids"] == ids, repr(s)
        assert auto.decode(ids) == s
    prompt = "The king"
    x = auto(prompt, return_tensors="pt")                                      # no token_type_ids
    assert set(x) == {"input_ids", "attention_mask"}
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"))
    out = hf_model.generate(**x, max_length=12, do_sample=False)[0].tolist()
    ids = tok.encode(prompt).tolist()
    while len(ids) < 12:                                                      # minigpt greedy, by hand
        ids.append(int(model.forward(np.array([ids]))[0][0, -1].argmax()))
    assert out == ids


# ----------------------------------------------------------------------------
# the command

def run(*args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_hf.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_export_command_and_its_errors(tmp_path):
    r = run("--help")
    assert r.returncode == 0 and "GPT2LMHeadModel.from_pretrained" in r.stdout and "--force" in r.stdout
    r = run("--ckpt", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "hf"))
    assert r.returncode == 2 and r.stderr.startswith("error: checkpoint") and "does not exist" in r.stderr
    make_checkpoint(tmp_path / "ckpt.npz", CharTokenizer(list("abc")))
    r = run("--ckpt", str(tmp_path / "ckpt.npz"))
    assert r.returncode == 2 and "--out DIR is required" in r.stderr
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("x")
    r = run("--ckpt", str(tmp_path / "ckpt.npz"), "--out", str(tmp_path / "hf"))
    assert r.returncode == 2 and "not empty; pass --force" in r.stderr
    r = run("--ckpt", str(tmp_path / "ckpt.npz"), "--out", str(tmp_path / "hf"), "--force")
    assert r.returncode == 0, r.stderr
    assert "wrote config.json, model.safetensors, minigpt_chars.json" in r.stdout and "chars.index" in r.stdout
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    r = run("--ckpt", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "hf2"))
    assert r.returncode == 2 and "not a minigpt checkpoint" in r.stderr
    (tmp_path / "notes.txt").write_text("some notes\n")                    # NumPy would guess a pickle
    r = run("--ckpt", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "hf2"))
    assert r.returncode == 2 and "is not a minigpt checkpoint (not an .npz archive)" in r.stderr, r.stderr
    assert "pickle" not in r.stderr and "Traceback" not in r.stderr
    bad = {"meta": np.frombuffer(b"{}", np.uint8), "x": np.array([{}], dtype=object)}   # an archive of objects
    np.savez(tmp_path / "objects.npz", **bad)
    r = run("--ckpt", str(tmp_path / "objects.npz"), "--out", str(tmp_path / "hf2"))
    assert r.returncode == 2 and "not a minigpt checkpoint (it holds Python objects)" in r.stderr, r.stderr
    assert "pickle" not in r.stderr


def test_export_force_leaves_only_this_models_files(tmp_path):
    """--force over an export of another tokenizer: a BPE's tokenizer.json would load beside a character model
    (and a character list beside a BPE's), so the other kind's files go; no temporary is left."""
    bpe = BPETokenizer.train(write_text(tmp_path / "text.txt", n_chars=3000), 260)
    make_checkpoint(tmp_path / "bpe.npz", bpe)
    make_checkpoint(tmp_path / "char.npz", CharTokenizer(list("abc")))
    out = str(tmp_path / "hf")
    assert export(str(tmp_path / "bpe.npz"), out) == ["config.json", "model.safetensors", "tokenizer.json",
                                                      "tokenizer_config.json"]
    assert export(str(tmp_path / "char.npz"), out, force=True) == ["config.json", "model.safetensors",
                                                                   "minigpt_chars.json"]
    assert sorted(os.listdir(out)) == ["config.json", "minigpt_chars.json", "model.safetensors"]
    assert json.loads(pathlib.Path(out, "config.json").read_text())["vocab_size"] == 3
    export(str(tmp_path / "bpe.npz"), out, force=True)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_export_imports_neither_torch_nor_transformers(tmp_path):
    make_checkpoint(tmp_path / "ckpt.npz", CharTokenizer(list("abc")))
    code = (f"import sys; sys.path.insert(0, {SCRIPTS!r}); import export_hf; "
            f"assert export_hf.main(['--ckpt', {str(tmp_path / 'ckpt.npz')!r}, '--out', {str(tmp_path / 'hf')!r}]) == 0; "
            "bad = {'torch', 'transformers', 'safetensors'} & set(sys.modules); assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
