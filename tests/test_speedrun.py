"""scripts/speedrun.py's report, without training: the plot's loss axis, and how a single seed's numbers are
printed (no sd, no 'nan', no '1 seeds')."""
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


def test_speedrun_sd_and_plurals():
    assert speedrun.sd(np.array([4.1767])) == "-"
    assert speedrun.sd(np.array([1.62, 1.63, 1.64]), 3) == "0.010"
    assert [speedrun.plural(n, "seed") for n in (0, 1, 3)] == ["0 seeds", "1 seed", "3 seeds"]


def test_speedrun_report_of_one_seed(tmp_path):
    """A smoke test's report (one seed, a 3 s budget) from made-up runs: no 'nan', an sd of '-', the plot scaled to
    the losses and its title in the singular."""
    import matplotlib.pyplot as plt
    (tmp_path / "text.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)
    a = SimpleNamespace(seeds=[1337], threads=2, budget=3.0, ablations=False, candidates=list(speedrun.CANDIDATES),
                        data=str(tmp_path / "text.txt"), out=str(tmp_path / "smoke.md"))
    run = {"wall": 3.2, "iters": 3, "val_full": 3.95, "curve": SMOKE}
    speedrun.write_report(a, {speedrun.RECIPE: [run], speedrun.OLD: [run]})
    md = (tmp_path / "smoke.md").read_text()
    assert not re.search(r"\bnan\b", md) and "1 seeds" not in md and "the others are held out" not in md
    assert f"| {speedrun.RECIPE} | 3.2 | 3 | 3.9500 | - | 3.9500 |" in md
    assert "; seed 1337 (the recipes were chosen on 1337)." in md
    assert "reaches 3.950 on seed 1337; 0 of 1 seed at or below" in md
    ax = plt.gcf().axes[0]
    assert ax.get_title().endswith(", 1 seed")
    assert ax.get_ylim()[0] < speedrun.GOAL and ax.get_ylim()[1] > 4.17
    plt.close("all")
    assert (tmp_path / "smoke.png").stat().st_size > 0
