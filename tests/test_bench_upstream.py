"""bench_upstream: parsing llama-speculative-simple's summary and τ / tokens/s over prompts.

The program itself is built only on the GPU machine (docs/gpu.md); here its log text is the
input, in the format of the pinned source (examples/speculative-simple/speculative-simple.cpp).
"""
import pytest

from tfm_local.bench.upstream import aggregate, parse_output

LOG = """main: decoded  200 tokens in    0.500 seconds, speed:  400.000 t/s

n_draft   = 15
n_predict = 200
n_drafted = 300
n_accept  = 120
accept    = 40.000%
"""


def test_parse_output_reads_the_summary():
    assert parse_output("noise\n" + LOG) == dict(n_generated=200, t_decode=0.5, n_drafted=300, n_accept=120)


def test_aggregate_tau_counts_one_target_token_per_step():
    rows = [parse_output(LOG), dict(n_generated=100, t_decode=0.5, n_drafted=0, n_accept=0)]
    a = aggregate(rows)
    # 300 tokens, 120 of them accepted drafts: 180 verify steps
    assert a["tau"] == pytest.approx(300 / 180) and a["tokens_per_s"] == pytest.approx(300.0)


def test_parse_output_without_summary_raises():
    with pytest.raises(ValueError, match="no speed/acceptance summary"):
        parse_output("error: failed to load model\n")
