"""docs/tau_by_category.py: MT-Bench τ per category from tfm-bench's run records."""
import importlib.util
from pathlib import Path

import pytest

from tfm_local.data import load_prompt_set

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "tau_by_category.py"


def _mod():
    spec = importlib.util.spec_from_file_location("tau_by_category", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    got = _mod().tau_by_category({"runs": runs})
    assert got == {c1: pytest.approx(2.0), c2: pytest.approx(3.0), "all": pytest.approx(49 / 23)}
    assert _mod().tau_by_category({"runs": runs}, mode="ddtree@8") == {}
