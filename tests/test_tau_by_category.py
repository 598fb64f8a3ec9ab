"""tfm_local.bench.tau_by_category: MT-Bench τ per category from tfm-bench's run records."""
import pytest

from tfm_local.files.datasets import load_prompt_set

from tfm_local.bench import tau_by_category as tbc


def test_tau_by_category_sums_tokens_over_steps(capsys):
    prompts = load_prompt_set("mtbench", 40)
    by_cat = {}
    for p in prompts:
        by_cat.setdefault(p.meta["category"], []).append(p.id)
    (c1, (a, b, *_)), (c2, (c, *_)) = [(k, v) for k, v in by_cat.items() if len(v) >= 2][:2]
    runs = [{"set": "mtbench", "mode": "chain", "prompt_id": pid, "n_step_tokens": t, "n_steps": s}
            for pid, t, s in ((a, 30, 10), (b, 10, 10), (c, 9, 3))]
    runs.append({"set": "gsm8k", "mode": "chain", "prompt_id": "gsm8k/0", "n_step_tokens": 99, "n_steps": 1})
    runs.append({"set": "mtbench", "mode": "plain", "prompt_id": a, "n_step_tokens": 5, "n_steps": 5})
    got = tbc.tau_by_category({"runs": runs})
    assert got == {c1: pytest.approx(2.0), c2: pytest.approx(3.0), "all": pytest.approx(49 / 23)}
    assert tbc.tau_by_category({"runs": runs}, mode="ddtree@8") == {}
