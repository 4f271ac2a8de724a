"""Cross-check against an independent implementation: the same weights in PyTorch (scripts/torch_twin.py)
give the same loss and every gradient, in float64. Skipped where PyTorch is not installed (it is not a
dependency; `pip install torch` to run it)."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not a minigpt dependency; pip install torch to run this")

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)                          # torch_twin.py is a script-side module, not part of the package

from minigpt.model import GPT, GPTConfig            # noqa: E402
from helpers import spec                            # noqa: E402
from torch_twin import TorchGPT                     # noqa: E402


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_gpt_matches_pytorch_float64(tie, bias):
    cfg = GPTConfig(vocab_size=29, block_size=12, n_layer=3, n_head=4, n_embd=16, bias=bias, tie_weights=tie)
    model = GPT(cfg, np.random.default_rng(0), dtype=np.float64, ops=spec())
    r = np.random.default_rng(1)
    for p in model.params().values():
        p += 0.1 * r.standard_normal(p.shape)
    x, y = r.integers(0, 29, (3, 12)), r.integers(0, 29, (3, 12))
    model.zero_grad()
    logits, loss = model.forward(x, y)
    model.backward()
    tm = TorchGPT.from_minigpt(model, torch.float64)
    tlogits, tloss = tm(torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()
    np.testing.assert_allclose(logits, tlogits.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert abs(loss - tloss.item()) < 1e-12
    for name, g in tm.grads_as_minigpt().items():
        np.testing.assert_allclose(model.grads()[name], g, rtol=1e-9, atol=1e-12, err_msg=name)


def test_adamw_and_clipping_match_pytorch():
    from minigpt.optim import AdamW, clip_grad_norm
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=True)
    model = GPT(cfg, np.random.default_rng(0), dtype=np.float64, ops=spec())
    tm = TorchGPT.from_minigpt(model, torch.float64)
    names = tm.minigpt_names()
    decay = [p for k, (p, _) in names.items() if p.dim() >= 2]
    no_decay = [p for k, (p, _) in names.items() if p.dim() < 2]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    opt = AdamW(model.params(), betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, ops=model.ops)
    r = np.random.default_rng(2)
    for step in range(5):
        x, y = r.integers(0, 13, (2, 8)), r.integers(0, 13, (2, 8))
        model.zero_grad(); model.forward(x, y); model.backward()
        norm = clip_grad_norm(model.grads(), 0.5)
        topt.zero_grad(); tm(torch.from_numpy(x), torch.from_numpy(y))[1].backward()
        tnorm = torch.nn.utils.clip_grad_norm_(tm.parameters(), 0.5)
        assert abs(norm - tnorm.item()) < 1e-10
        lr = 1e-2 * (step + 1) / 5
        for group in topt.param_groups:
            group["lr"] = lr
        opt.step(model.params(), model.grads(), lr)
        topt.step()
    for k, (p, t) in names.items():
        np.testing.assert_allclose(model.params()[k], (p.T if t else p).detach().numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=k)


def test_nanogpt_reference_script_runs(tmp_path):
    """scripts/nanogpt_reference.py (the PyTorch distribution behind the quality bar) on a tiny config."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    report = tmp_path / "ref.md"
    cmd = [sys.executable, "scripts/nanogpt_reference.py", "--seeds", "3", "4", "--threads", "1",
           "--report", str(report), "--data", str(text), "--n_layer", "1", "--n_embd", "16", "--n_head", "2",
           "--block_size", "8", "--batch_size", "4", "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
           "--warmup_iters", "2", "--lr_decay_iters", "6"]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in report.read_text().splitlines() if line.startswith("| 3 ") or line.startswith("| 4 ")]
    assert len(rows) == 2
    vals = [float(row.split("|")[3]) for row in rows]
    assert all(np.isfinite(vals)) and all(v < np.log(len(set(text.read_text()))) + 0.5 for v in vals)
    bad = subprocess.run(cmd[:2] + ["--n_layr", "2"], cwd=root, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--n_layer" in bad.stderr
