"""Generation speed with and without the KV cache; writes reports/generation.md.

    python scripts/bench_generate.py [--backends numpy,native] [--repeats 3] [--prompt_len 1]

Weights are random (speed does not depend on them). For each model, 256 new tokens from a 1-token prompt (the
sampler's default prompt is one newline), so at block 256 the whole text fits the block; --prompt_len 5 adds
four steps past the block, each a full recomputation of the window (the policy's cost, also visible at block 64).
"""
import argparse
import time

import numpy as np

from bench_util import command, cpu_line, revision, write_keeping_notes
from minigpt import backends
from minigpt.model import GPT, GPTConfig
from minigpt.sample import generate

MODELS = {
    "S (block 64)": GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128),
    "S dims, block 256": GPTConfig(vocab_size=65, block_size=256, n_layer=4, n_head=4, n_embd=128),
    "M (block 256)": GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384),
}


def tokens_per_s(model, batch, n_new, use_cache, repeats, prompt_len):
    times = []
    for r in range(repeats):
        idx = np.tile(np.arange(prompt_len), (batch, 1))
        t0 = time.perf_counter()
        for _ in generate(model, idx, n_new, np.random.default_rng(r), temperature=0.8, use_cache=use_cache):
            pass
        times.append(time.perf_counter() - t0)
    return batch * n_new / float(np.median(times))


def policy_cost(model, batch, n_new, prompt_len):
    """Median ms per step with the cache: (steps that decode one position, steps past block_size, which recompute
    the window)."""
    idx = np.tile(np.arange(prompt_len), (batch, 1))
    times, t0 = [], time.perf_counter()
    for _ in generate(model, idx, n_new, np.random.default_rng(0), temperature=0.8):
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    fits = model.config.block_size - prompt_len            # steps 1..fits decode one position (step 0 prefills)
    return 1000 * float(np.median(times[1:fits + 1])), 1000 * float(np.median(times[fits + 1:]))


def measure(a, ops):
    """Rows (model, batch, tok/s without cache, with cache) and the policy's cost, on backend ops."""
    rows, policy = [], []
    for name, cfg in MODELS.items():
        model = GPT(cfg, np.random.default_rng(0), ops=ops).eval()
        if cfg.block_size < a.prompt_len + a.new_tokens - 1:
            policy += [(name, b, *policy_cost(model, b, a.new_tokens, a.prompt_len)) for b in (1, 8)]
        for batch in (1, 8):
            with_cache = tokens_per_s(model, batch, a.new_tokens, True, a.repeats, a.prompt_len)
            without = tokens_per_s(model, batch, a.new_tokens, False, a.repeats, a.prompt_len)
            rows.append((name, batch, without, with_cache))
            print(f"{ops.name:7s} {name:14s} batch {batch}: {without:9.1f} tok/s without cache, "
                  f"{with_cache:9.1f} with ({with_cache / without:.1f}x)", flush=True)
    return rows, policy


NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="auto", help="comma list, one table each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--prompt_len", type=int, default=1)
    ap.add_argument("--out", default="reports/generation.md")
    a = ap.parse_args()
    lines = ["# Generation speed: KV cache vs full recomputation", "",
             f"Command: `{command('bench_generate.py')}` on {cpu_line()}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"at {revision()}.",
             f"{a.new_tokens} new tokens from a {a.prompt_len}-token prompt, random weights, temperature 0.8; "
             f"tokens/s counts every sample of the batch; median of {a.repeats} runs."]
    for name in a.backends.split(","):
        ops = backends.load(name, verbose=True)
        rows, policy = measure(a, ops)
        lines += ["", f"## Backend {ops.name} ({backends.threads()} threads)", "",
                  "| model | batch | no cache (tok/s) | KV cache (tok/s) | speed-up |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {b} | {w:,.1f} | {c:,.1f} | {c / w:.1f}x |" for n, b, w, c in rows]
        if policy:
            lines += ["", "The policy's cost (same runs' settings, KV cache on; median ms per generation step):", "",
                      "| model | batch | decoding one position | past the block (the window recomputed) |",
                      "|---|---|---|---|"]
            lines += [f"| {n} | {b} | {d:.2f} | {r:.2f} ({r / d:.0f}x) |" for n, b, d, r in policy]
    T = MODELS["S (block 64)"].block_size
    fits = min(T - a.prompt_len, a.new_tokens - 1)          # steps after the prefill that decode one position
    lines += ["", "Policy past block_size: the learned positional table cannot slide, so once the context is "
              "longer than block_size every step sees a new window of the last block_size tokens, which the "
              "cache does not hold: it recomputes that window with the model's forward, exactly as without a "
              "cache (tests/test_sample.py checks tokens and logits). "
              f"With block {T}, {a.new_tokens} new tokens and a {a.prompt_len}-token prompt, "
              f"after the prompt's prefill {fits} steps decode one position from the cache and the other "
              f"{a.new_tokens - 1 - fits} recompute the window, so the speed-up there is small by "
              f"design; at block 256, {max(0, a.prompt_len + a.new_tokens - 1 - 256)} steps go past the block."]
    write_keeping_notes(a.out, "\n".join(lines), NOTES)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
