"""scripts/speedrun.py's plan and report from made-up runs: the plot's loss axis, how a single seed's numbers are
printed (no sd, no 'nan', no '1 seeds'), the held-out seeds; and, with two tiny training runs, the second score
of a run whose block is longer than nanoGPT's."""
import os
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
try:
    import speedrun
finally:
    sys.path.pop(0)

REAL = [[0, 0.0, 4.17], [250, 30.0, 1.97], [500, 60.0, 1.74], [750, 89.0, 1.62]]   # [iter, s, val] of a real run
SMOKE = [[0, 0.0, 4.17], [3, 3.2, 3.90]]                                          # 3 seconds' worth


def test_speedrun_loss_range_keeps_real_runs_zoomed_and_shows_short_runs_whole():
    lo, hi = speedrun.loss_range([REAL, REAL[:3]])
    assert (lo, hi) == (pytest.approx(1.35), 3.0)        # the goal 1.5 in view; the first evaluations cut off
    for curves in ([SMOKE], [REAL, SMOKE], [REAL[:1]]):  # a run ends above 3.0: every loss and the goal in view
        lo, hi = speedrun.loss_range(curves)
        losses = [p[2] for c in curves for p in c]
        assert lo < min(speedrun.GOAL, *losses) and hi > max(losses)
    lo, hi = speedrun.loss_range([[[0, 0.0, 4.17], [600, 80.0, 1.40]]])
    assert lo < 1.40 and hi == 3.0                        # below the goal: the axis goes down to the loss


def smoke_args(tmp_path, out, **changed):
    """speedrun.py's parsed options as write_report reads them, for a smoke test's report (seed 1337, a 3 s budget,
    no ablations, float32, the commit 'abc1234') into tmp_path/out, with `changed` set; writes the text it scores."""
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)
    return SimpleNamespace(**{"revision": "abc1234", "seeds": [1337], "threads": 2, "budget": 3.0, "ablations": False,
                              "dtype": "float32", "candidates": list(speedrun.CANDIDATES),
                              "data": str(tmp_path / "text.txt"), "out": str(tmp_path / out), **changed})


def test_speedrun_sd_and_plurals():
    assert speedrun.sd(np.array([4.1767])) == "-"
    assert speedrun.sd(np.array([1.62, 1.63, 1.64]), 3) == "0.010"
    assert [speedrun.plural(n, "seed") for n in (0, 1, 3)] == ["0 seeds", "1 seed", "3 seeds"]


def test_speedrun_report_of_one_seed(tmp_path):
    """A smoke test's report (one seed, a 3 s budget) from made-up runs: no 'nan', an sd of '-', the plot scaled to
    the losses and its title in the singular."""
    import matplotlib.pyplot as plt
    a = smoke_args(tmp_path, "smoke.md")
    run = {"wall": 3.2, "iters": 3, "val_full": 3.95, "curve": SMOKE}
    speedrun.write_report(a, {speedrun.RECIPE: [{**run, "val_short": 3.97}], speedrun.OLD: [run]})
    md = (tmp_path / "smoke.md").read_text()
    assert (f"0 of 1 seed at or below 1.5. Scored with at most 64 tokens of context (nanoGPT's block): "
            f"{speedrun.RECIPE} reaches 3.970 (3.9700; +0.0200 against its own context).") in md
    assert not re.search(r"\bnan\b", md) and "1 seeds" not in md and "the others are held out" not in md
    assert f"| {speedrun.RECIPE} | 3.2 | 3 | 3.9500 | - | 3.9500 |" in md
    assert "; seed 1337 (rounds 1-3 were chosen on 1337, rounds 4-8 on 1337, 1338, 1339)." in md
    assert "` at abc1234, on " in md                       # the commit taken before the runs, not after the plot
    assert "reaches 3.950 on seed 1337; 0 of 1 seed at or below" in md
    ax = plt.gcf().axes[0]
    assert ax.get_title().endswith(", 1 seed")
    assert ax.get_ylim()[0] < speedrun.GOAL and ax.get_ylim()[1] > 4.17
    plt.close("all")
    assert (tmp_path / "smoke.png").stat().st_size > 0


def test_speedrun_bf16_runs_the_two_recipes_again_and_reports_them_paired(tmp_path):
    """--bf16: each recipe once more with --dtype bf16, right after its float32 run; the leaderboard lists both and
    the summary pairs them by seed (made-up runs: 2 seeds, bf16 ahead by different amounts on each); with the
    ablations, the bf16 runs stay out of the ablation tables (their deltas would mix the dtype into a recipe's)."""
    plan = speedrun.plan_of(False, nanogpt=True, bf16=True)
    assert list(plan) == [speedrun.RECIPE, speedrun.RECIPE_BF16, speedrun.OLD, speedrun.OLD_BF16]
    assert plan[speedrun.RECIPE_BF16] == (plan[speedrun.RECIPE][0] + ["--dtype=bf16"], True)
    assert plan[speedrun.OLD_BF16] == (plan[speedrun.OLD][0] + ["--dtype=bf16"], True)
    assert speedrun.RECIPE_BF16 not in speedrun.plan_of(False, nanogpt=True)
    import matplotlib.pyplot as plt

    def runs(losses, iters):
        return [{"wall": 3.1, "iters": i, "val_full": v, "curve": SMOKE} for v, i in zip(losses, iters)]
    made = {speedrun.RECIPE: runs([3.95, 3.97], [3, 3]), speedrun.OLD: runs([3.99, 4.01], [3, 5]),
            speedrun.RECIPE_BF16: runs([3.94, 3.93], [4, 4]), speedrun.OLD_BF16: runs([3.97, 4.00], [4, 6])}
    a = smoke_args(tmp_path, "bf16.md", seeds=[1338, 1340])
    speedrun.write_report(a, made)
    md = (tmp_path / "bf16.md").read_text()
    assert "seeds 1338, 1340 (rounds 1-3 were chosen on 1337, rounds 4-8 on 1337, 1338, 1339; the others are " in md
    assert "The round 8 recipe reaches 3.960 (sd 0.014) over all seeds, 3.970 over the held-out seeds;" in md
    assert f"| {speedrun.RECIPE} | 3.1 | 3 | 3.9600 |" in md and f"| {speedrun.OLD} | 3.1 | 4 | 4.0000 |" in md
    assert f"| {speedrun.RECIPE_BF16} | 3.1 | 4 | 3.9350 |" in md
    assert f"| {speedrun.OLD_BF16} | 3.1 | 5 | 3.9850 |" in md
    assert (f"In bf16 (`--dtype bf16`), the {speedrun.CURRENT} recipe reaches 3.935 (-0.0250 paired by seed: -0.010, "
            "-0.040) after 4 iterations instead of 3; round 1 reaches 3.985 (-0.0150 paired by seed: -0.020, -0.010) "
            "after 5 iterations instead of 4.") in md
    assert "The `--dtype bf16` rows are the same recipes with bf16 products" in md
    assert len(plt.gcf().axes[0].get_legend().get_texts()) == 5                  # 4 runs and the goal line
    plt.close("all")

    a.ablations, a.out = True, str(tmp_path / "ablations.md")
    every = speedrun.plan_of(True, nanogpt=False, bf16=True)
    speedrun.write_report(a, {name: made.get(name, runs([3.9, 3.9], [3, 3])) for name in every})
    plt.close("all")
    table = (tmp_path / "ablations.md").read_text().split("Every run of the ablations")[1]
    assert f"| {speedrun.RECIPE} |" in table and f"| {speedrun.OLD} |" in table
    assert speedrun.RECIPE_BF16 not in table and speedrun.OLD_BF16 not in table

    longer = "round 1 + context 128, batch 24"                 # its second score: one line of a list, the recipe's not
    made[longer] = [{**r, "val_short": 4.0} for r in runs([3.9, 3.8], [3, 3])]
    made[speedrun.RECIPE] = [{**r, "val_short": 4.0} for r in made[speedrun.RECIPE]]
    speedrun.write_report(a, {name: made.get(name, runs([3.9, 3.9], [3, 3])) for name in every})
    plt.close("all")
    table = (tmp_path / "ablations.md").read_text().split("Every run of the ablations")[1].split("<!-- notes")[0]
    assert table.rstrip().endswith("Scored with at most 64 tokens of context (nanoGPT's block), the runs with a "
                                   f"longer block:\n\n- {longer} reaches 4.000 (4.0000, 4.0000; +0.1500 against its "
                                   "own context)")


def test_speedrun_dtype_bf16_runs_every_minigpt_run_in_bf16(tmp_path):
    """--dtype bf16: every run of the plan, the ablations' too, gets --dtype=bf16 after its own settings (so a
    candidate's shape still applies), under the same names, and the report says so once."""
    f32 = speedrun.plan_of(True, nanogpt=True, candidates=["context 128, batch 24"])
    bf = speedrun.plan_of(True, nanogpt=True, candidates=["context 128, batch 24"], dtype="bf16")
    assert speedrun.toggled("context 128, batch 24") == (        # round 8 holds it: toggled off, round 3 + the rest
        "round 8 without context 128, batch 24", ["--preset=speedrun", "--block_size=64", "--batch_size=32"])
    off = speedrun.settings_of(speedrun.toggled("context 128, batch 24")[1])
    assert (off.block_size, off.batch_size, off.embed_lr_ratio, off.optimizer, off.eval_iters, off.tie_weights) == (
        64, 32, 10.0, "muon", 5, False)
    assert speedrun.toggled("evaluations of 5 batches") == (     # and toggled off here
        "round 8 without evaluations of 5 batches", ["--preset=speedrun", "--eval_iters=20"])
    assert speedrun.toggled("untied head") == (                  # and this one
        "round 8 without untied head", ["--preset=speedrun", "--tie_weights=true"])
    r5 = speedrun.settings_of(speedrun.toggled("untied head")[1])
    assert (r5.tie_weights, r5.eval_iters, r5.block_size) == (True, 5, 128)
    assert speedrun.toggled("bf16 where faster (--dtype auto)") == (    # round 7's own two
        "round 8 without bf16 where faster (--dtype auto)", ["--preset=speedrun", "--dtype=float32"])
    assert speedrun.toggled("short context first (half the block for 30% of the run)") == (
        "round 8 + short context first (half the block for 30% of the run)",
        ["--preset=speedrun", "--context_warmup=0.3"])
    assert list(bf) == list(f32) and "round 1 + context 128, batch 24" in bf
    for name, (args, timed) in bf.items():
        assert (args, timed) == (f32[name][0] + ["--dtype=bf16"], f32[name][1]), name
    assert bf["round 1 + context 128, batch 24"][0] == [
        "--optimizer=muon", "--batch_size=32", "--block_size=128", "--batch_size=24", "--dtype=bf16"]
    import matplotlib.pyplot as plt
    run = {"wall": 3.2, "iters": 3, "val_full": 3.95, "curve": SMOKE}
    for dtype, said in (("bf16", True), ("float32", False)):
        a = smoke_args(tmp_path, f"{dtype}.md", dtype=dtype)
        speedrun.write_report(a, {speedrun.RECIPE: [run], speedrun.OLD: [run]})
        md = (tmp_path / f"{dtype}.md").read_text()
        assert ("Every minigpt run here trains with `--dtype bf16`" in md) == said
        assert ("minigpt in bf16, 1 seed" in plt.gcf().axes[0].get_title()) == said
        plt.close("all")


def test_a_run_with_a_longer_block_is_scored_again_with_nanogpts_context(tmp_path):
    """A run whose block is longer than nanoGPT's 64 tokens (128 from round 4 on) is scored a second time with at
    most 64 tokens of context: the same figure as whole_split_loss over blocks of 64 on its last checkpoint; the
    report gives it beside the run's own, paired by seed. A run at block 64 has no second score."""
    from minigpt.data import Dataset
    from minigpt.train import whole_split_loss
    from minigpt.sample import load_model
    text = tmp_path / "text.txt"
    text.write_text("".join(f"Citizen {i}:\nBefore we proceed any further, hear me speak.\n" for i in range(300)))
    tiny = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--eval_interval=2", "--eval_iters=1", "--backend=numpy"]
    # 80 steps (the cap ends the run well inside its budget): enough for the two contexts to score apart, however
    # busy the machine (a budget of seconds alone gave a busy machine too few steps)
    res = speedrun.minigpt(["--preset=speedrun", *tiny, "--max_iters=80"], 1337, 120.0, 1, str(text), str(tmp_path))
    out = next(p for p in tmp_path.iterdir() if p.is_dir())
    model, tok = load_model(str(out / "ckpt_last.npz"))
    assert model.config.block_size == 128 == speedrun.block_of(["--preset=speedrun"])
    val = Dataset(text.read_text(), tok, 128).splits["val"]
    assert res["val_short"] == pytest.approx(whole_split_loss(model, val, 64, 24), abs=2e-4)   # printed to 4 places
    assert res["val_short"] != pytest.approx(res["val_full"], abs=1e-3)          # 128 tokens of context score apart
    assert "val_short" not in speedrun.minigpt(["--max_iters=2", *tiny], 1337, None, 1, str(text), str(tmp_path))
    runs = {speedrun.RECIPE: [{**res, "val_full": 3.0, "val_short": 3.25}, {**res, "val_full": 3.5, "val_short": 3.5}],
            speedrun.OLD: [{k: v for k, v in res.items() if k != "val_short"}] * 2}           # block 64: none
    assert speedrun.short_context_sentence(runs, [speedrun.OLD, speedrun.RECIPE]) == (
        f" Scored with at most 64 tokens of context (nanoGPT's block): {speedrun.RECIPE} reaches 3.375 (3.2500, "
        "3.5000; +0.1250 against its own context).")


def test_the_second_score_runs_on_the_runs_backend_and_dtype(monkeypatch):
    cmd = speedrun.rescore_command(["--preset=speedrun", "--backend=numba", "--dtype=bf16"], "/o", "t.txt", 2)
    assert cmd[1:] == ["scripts/eval_checkpoint.py", "--ckpt", os.path.join("/o", "ckpt_last.npz"), "--data", "t.txt",
                       "--threads=2", "--backend=numba", "--dtype=bf16", "--context=64", "--splits=val", "--draws=0"]
    assert "--dtype=float32" in speedrun.rescore_command(["--preset=speedrun", "--dtype=float32"], "/o", "t.txt", 2)
    from minigpt import checkpoint                                 # --dtype auto: the precision the run chose
    for chosen in ("bf16", "float32"):
        monkeypatch.setattr(checkpoint, "load", lambda path: ({"train_config": {"dtype": chosen}}, {}, {}))
        assert f"--dtype={chosen}" in speedrun.rescore_command(["--preset=speedrun", "--dtype=auto"], "/o", "t", 2)


def test_the_default_text_is_downloaded_once_before_any_run(tmp_path, monkeypatch, capsys):
    """Without data/tinyshakespeare.txt, speedrun.py downloads it itself (train_shakespeare.py's download) before
    the first run: offline, that is one line of error and status 2, not a child run's error inside a "failed:"."""
    shakespeare = sys.modules[speedrun.download.__module__]
    monkeypatch.setattr(speedrun, "ROOT", str(tmp_path))                   # a checkout without the text
    monkeypatch.setattr(speedrun, "minigpt", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(shakespeare, "URL", (tmp_path / "offline.txt").as_uri())   # a URL that cannot be read
    assert speedrun._main(["--budget=1", "--seeds", "1", "--ablations=false", "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not download") and err.count("\n") == 1, err
    assert not (tmp_path / "data").exists()                                # nothing half-written
    (tmp_path / "offline.txt").write_text("some text\n")                   # the URL answers now
    with pytest.raises(pytest.fail.Exception, match="a run started"):
        speedrun._main(["--budget=1", "--seeds", "1", "--ablations=false", "--out", str(tmp_path / "r.md")])
    assert (tmp_path / "data" / "tinyshakespeare.txt").read_text() == "some text\n"
