"""GenerationStats: τ and the decode rate (the first token comes from the prefill, not a decode pass)."""
import pytest

from tfm_local.decode.stats import GenerationStats


def test_rate_counts_the_tokens_of_decode_passes_over_decode_time():
    st = GenerationStats(n_generated=9, n_steps=4, n_step_tokens=8, t_prefill=0.5, t_total=2.5)
    assert st.tau == 2.0 and st.t_decode == pytest.approx(2.0)
    assert st.tokens_per_s == pytest.approx(4.0)  # 8 tokens of 4 passes in 2 s; the 9th came with the prefill


def test_an_answer_of_the_prefill_token_alone_has_no_rate():
    """max_tokens 1, or a stop right after the prefill: no decode pass ran, so no rate (it was
    1 token / ~0 s, six-figure tokens/s, in the server's usage before)."""
    st = GenerationStats(n_generated=1, n_steps=0, t_prefill=0.2, t_total=0.2000001)
    assert st.tokens_per_s == 0.0 and st.tau == 0.0
    assert "0.0 tok/s" in st.summary() and st.to_dict()["tokens_per_s"] == 0.0
