"""Starting from GPT-2 (minigpt/gpt2.py, --init_from): a transformers GPT-2 directory loads with the same logits
and greedy tokens, fine-tunes, samples and exports back; minigpt -> export -> import gives the same parameters;
bad directories are clear errors. GPT-2 directories are made here (tiny, random), never downloaded."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import spec, write_text
from minigpt import checkpoint, gpt2
from minigpt.errors import UserError
from minigpt.hf import export
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW

tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed (pip install -e "
                                                     "'.[test]')")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny GPT-2 directory written by minigpt's own export (no torch): a GPT-2-style tokenizer trained here
    by `tokenizers`, random weights, n_positions 32."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from minigpt.gpt2_tokenizer import GPT2Tokenizer
    d = tmp_path_factory.mktemp("gpt2")
    text = write_text(d / "text.txt", n_chars=20_000)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(d / "tokenizer.json"))
    tok = GPT2Tokenizer.from_pretrained(str(d))
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16, bias=True)
    model = GPT(cfg, np.random.default_rng(0), ops=spec())
    r = np.random.default_rng(1)
    for p in model.params().values():
        p += (0.2 * r.standard_normal(p.shape)).astype(np.float32)
    ckpt = str(d / "ckpt.npz")
    checkpoint.save(ckpt, model, AdamW(model.params(), ops=model.ops),
                    {"model_config": cfg.to_dict(), "tokenizer": tok.to_json()})
    export(ckpt, str(d / "hf"))
    return d / "hf", model, tok, d / "text.txt"


def test_export_then_import_gives_the_same_parameters_and_tokenizer(gpt2_dir):
    hf_dir, model, tok, _ = gpt2_dir
    config, params, tok2 = gpt2.load_gpt2(str(hf_dir))
    assert config.to_dict() == model.config.to_dict()
    assert set(params) == set(model.params())
    for k, p in model.params().items():
        np.testing.assert_array_equal(params[k], p, err_msg=k)
    text = "To be or not to be, the king shall speak."
    np.testing.assert_array_equal(tok2.encode(text), tok.encode(text))
    c16, p16, _ = gpt2.load_gpt2(str(hf_dir), block_size=16)                  # nanoGPT's crop_block_size
    assert c16.block_size == 16 and np.array_equal(p16["wpe.weight"], params["wpe.weight"][:16])


def test_read_safetensors_reads_float16_and_bfloat16(tmp_path):
    from minigpt.hf import write_safetensors
    a = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    write_safetensors(str(tmp_path / "f.safetensors"), {"a": a})
    np.testing.assert_array_equal(gpt2.read_safetensors(str(tmp_path / "f.safetensors"))["a"], a)
    raw = (a.view(np.uint32) >> 16).astype("<u2")                            # bf16: the top halves
    head = json.dumps({"b": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, raw.nbytes]},
                       "h": {"dtype": "F16", "shape": [3, 4], "data_offsets": [raw.nbytes, 2 * raw.nbytes]}}).encode()
    with open(tmp_path / "g.safetensors", "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + raw.tobytes() + a.astype("<f2").tobytes())
    got = gpt2.read_safetensors(str(tmp_path / "g.safetensors"))
    np.testing.assert_array_equal(got["b"], (raw.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(got["h"], a.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("damage", ["random bytes", "header too long", "header not an object", "no offsets",
                                    "offsets past the end", "wrong shape"])
def test_a_damaged_safetensors_file_is_one_clear_error(tmp_path, damage):
    def write(head, body=b"\0" * 48):
        head = json.dumps(head).encode()
        return len(head).to_bytes(8, "little") + head + body
    ok = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}
    raw = {"random bytes": np.random.default_rng(0).bytes(1000),
           "header too long": (10 ** 12).to_bytes(8, "little") + b"{}",
           "header not an object": write(7),
           "no offsets": write({"a": {"dtype": "F32", "shape": [3, 4]}}),
           "offsets past the end": write({"a": {**ok["a"], "data_offsets": [0, 4800]}}),
           "wrong shape": write({"a": {**ok["a"], "shape": [5, 4]}})}[damage]
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw)
    with pytest.raises(UserError, match="not a valid safetensors file.*download it again"):
        gpt2.read_safetensors(str(path))
    path.write_bytes(write(ok))                                   # the same writer, undamaged: reads
    assert gpt2.read_safetensors(str(path))["a"].shape == (3, 4)


def test_transformers_model_loads_with_its_logits_and_greedy_tokens(gpt2_dir, tmp_path):
    """A GPT2LMHeadModel made by transformers (random weights, save_pretrained) gives the same logits in minigpt
    (1e-5 relative, float32) and the same greedy continuation, token for token."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (transformers needs it)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from minigpt.sample import generate
    hf_dir, _, tok, _ = gpt2_dir
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=24, n_embd=32,
                                                               n_layer=2, n_head=4)).eval()
    ref.save_pretrained(str(tmp_path), safe_serialization=True)
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    config, params, _ = gpt2.load_gpt2(str(tmp_path))
    model = GPT(config, np.random.default_rng(0), ops=spec())
    checkpoint.load_params(model, params)
    ids = tok.encode("The king shall speak to my lord.")[None].astype(np.int64)
    with torch.no_grad():
        want = ref(torch.from_numpy(ids)).logits.numpy()
    got = model.eval().forward(ids)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with torch.no_grad():
        hf_out = ref.generate(torch.from_numpy(ids), max_new_tokens=24 - ids.shape[1], do_sample=False,
                              pad_token_id=0)[0, ids.shape[1]:].numpy()
    ours = [int(t[0]) for t in generate(model, ids, len(hf_out), np.random.default_rng(0), top_k=1)]
    assert ours == hf_out.tolist()


def run_script(*args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train_shakespeare.py"), *args],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, "MINIGPT_BACKEND": "numpy"})


def test_fine_tune_samples_and_exports_back(gpt2_dir, tmp_path):
    hf_dir, model, tok, text = gpt2_dir
    r = run_script("--init_from", str(hf_dir), "--data", str(text), "--out_dir", "ft", "--max_iters", "3",
                   "--eval_interval", "3", "--eval_iters", "2", "--block_size", "16", "--sample_chars", "10",
                   "--report", "false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "init from" in r.stdout and "---- sample ----" in r.stdout
    meta, params, _ = checkpoint.load(str(tmp_path / "ft" / "ckpt_last.npz"))
    tc = meta["train_config"]
    assert (tc["block_size"], tc["batch_size"], tc["lr"], tc["n_layer"], tc["bias"]) == (16, 4, 3e-5, 2, True)
    assert params["wpe.weight"].shape == (16, 16)
    assert not np.array_equal(params["h.0.mlp.c_fc.weight"], model.params()["h.0.mlp.c_fc.weight"])   # it learned
    s = subprocess.run([sys.executable, "-m", "minigpt.sample", "--out_dir", str(tmp_path / "ft"), "--prompt",
                        "The king", "--max_new_tokens", "5"], capture_output=True, text=True)
    assert s.returncode == 0 and s.stdout.startswith("The king"), s.stderr
    back = tmp_path / "back"
    export(str(tmp_path / "ft" / "ckpt_last.npz"), str(back))
    config, params2, tok2 = gpt2.load_gpt2(str(back))
    assert config.block_size == 16 and tok2.vocab_size == tok.vocab_size
    for k, p in params.items():
        np.testing.assert_array_equal(params2[k], p, err_msg=k)


def test_bad_directories_and_settings_are_clear_errors(gpt2_dir, tmp_path):
    hf_dir, _, _, text = gpt2_dir
    with pytest.raises(UserError, match="not a directory"):
        gpt2.load_gpt2(str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no readable config.json"):
        gpt2.load_gpt2(str(tmp_path / "empty"))
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="not 'gpt2'"):
        gpt2.load_gpt2(str(other))
    for config, msg in (([1, 2], "a JSON list, not an object"), ({"model_type": "gpt2"}, "lacks a positive integer"
                                                                  " vocab_size, n_positions, n_embd, n_layer, n_head")):
        (other / "config.json").write_text(json.dumps(config))
        with pytest.raises(UserError, match=msg):
            gpt2.load_gpt2(str(other))
    for name, msg in (("model.safetensors.index.json", "sharded"), ("pytorch_model.bin", "pickle weights only")):
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
        (d / name).write_text("{}")
        with pytest.raises(UserError, match=msg):
            gpt2.load_gpt2(str(d))
    with pytest.raises(UserError, match="exceeds .* n_positions 32"):
        gpt2.load_gpt2(str(hf_dir), block_size=64)
    for args, msg in ((["--n_layer", "3", "--block_size", "16"], "--n_layer 3 conflicts with"),
                      (["--bias", "false", "--block_size", "16"], "--bias false conflicts with"),   # as typed
                      (["--tokenizer", "bpe", "--block_size", "16"], "drop them"),
                      ([], "--block_size 64 exceeds")):                         # the finetune preset's 64
        r = run_script("--init_from", str(hf_dir), "--data", str(text), "--out_dir", "x", *args, cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
