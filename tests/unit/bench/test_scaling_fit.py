"""bench/research/scaling.py's fit and plot on runs whose power law is known."""

import numpy as np
import pytest

from bench.research import scaling


def test_power_law_recovers_a_known_exponent_and_its_interval_covers_it():
    rng = np.random.default_rng(0)
    compute = np.repeat(np.geomspace(1e12, 1e15, 4), 2)  # 4 sizes, 2 seeds each
    exact = scaling.power_law(list(compute), list(0.9 * compute**-0.01))
    assert exact["alpha"] == pytest.approx(0.01, abs=1e-9) and exact["alpha_se"] < 1e-9 and exact["points"] == 8
    noisy = scaling.power_law(list(compute), list(0.9 * compute**-0.01 * np.exp(rng.normal(0, 0.002, 8))))
    assert noisy["alpha_low"] < 0.01 < noisy["alpha_high"]
    assert noisy["alpha_high"] - noisy["alpha"] == pytest.approx(2.447 * noisy["alpha_se"])  # t, 6 df


def test_plot_writes_a_png(tmp_path):
    runs = [
        {"compute": c, "metrics": {"ctr/ne": 0.9 * c**-0.01, "cvr/ne": 0.95 * c**-0.005}} for c in (1e12, 1e13, 1e14)
    ]
    fits = {
        task: scaling.power_law([r["compute"] for r in runs], [r["metrics"][f"{task}/ne"] for r in runs])
        for task in scaling.TASKS
    }
    scaling.plot({"preset": "tiny", "runs": {"gem": runs}, "fits": {"gem": fits}}, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_size_is_refused_with_the_sizes_to_choose_from(capsys):
    with pytest.raises(SystemExit) as exit_:
        scaling.main(["--rungs", "s,xl"])
    assert exit_.value.code == 2
    assert "--rungs: unknown sizes ['xl']; choose from xs,s,m,l" in capsys.readouterr().err


def test_plot_of_one_size_draws_its_runs_without_a_fit(tmp_path):
    runs = [{"compute": 1e12, "metrics": {"ctr/ne": ne, "cvr/ne": ne}} for ne in (0.86, 0.87)]
    scaling.plot({"preset": "tiny", "runs": {"gem": runs}, "fits": {}}, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
