"""Log-probabilities of emitted tokens: values against a numpy log-softmax of the target's logits,
plain against speculative decoding, and the records' alignment with the generated text.

The reference rows come from a separate Target decoding the prompt and then the emitted tokens one at
a time (``reference_rows``: the passes plain decoding runs; a prefill of a whole prefix gives logits
that differ by ~1e-3 on these tiny targets, other batch shapes reducing in another order), penalised by
test_penalties' reference where penalties are set.
"""
import numpy as np
import pytest

from tfm_local.decode.logprobs import MAX_TOP_LOGPROBS, check_top_logprobs, token_logprob
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.verify import Target
from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available

from test_engine import PROMPTS, OracleDrafter, run_with_drafter
from test_penalties import STRONG, paths, penalised_reference, plain, spec  # noqa: F401 (fixtures)
from test_tree_verify import REL_TOL, TreeOracle

#: The bar: reported values within this of the target's log-softmax.
TOL = 1e-3


def log_softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max()
    return z - np.log(np.exp(z).sum())


@pytest.fixture(scope="module")
def reference(paths):
    t = Target(paths[0], n_ctx=512)
    yield t
    t.close()


def reference_rows(target, prompt_ids, tokens):
    """float64 logits ``[len(tokens), n_vocab]``: row i is the target's row after ``prompt_ids + tokens[:i]``,
    decoded one token at a time after a prefill of the prompt (``target``: a Target, reset)."""
    rows = [np.array(target.prefill(prompt_ids), dtype=np.float64)]
    for t in tokens[:-1]:
        rows.append(np.array(target.verify([t]).logits[0], dtype=np.float64))
        target.commit([0])
    return np.stack(rows)


def run_records(engine, prompt, n, sp=SamplingParams(), k=3):
    ids = list(engine.generate_ids(engine.prompt_tokens(prompt), n, sp, logprobs=k))
    return ids, list(engine.logprobs)


def check_against_reference(reference, prompt_ids, out, records, sp, k):
    """Every record: the token's and its k alternatives' values equal the reference log-softmax."""
    assert [r.token for r in records] == out
    rows = reference_rows(reference, prompt_ids, out)
    for i, r in enumerate(records):
        x = rows[i]
        if sp.penalised:
            x = penalised_reference(x, prompt_ids, out[:i], sp)
        ls = log_softmax(x)
        assert abs(r.logprob - ls[r.token]) < TOL, f"token {i}"
        assert len(r.top) == k
        top_ids = [t for t, _ in r.top]
        assert all(abs(lp - ls[t]) < TOL for t, lp in r.top), f"token {i}: {r.top}"
        assert [lp for _, lp in r.top] == sorted([lp for _, lp in r.top], reverse=True)
        best = np.sort(ls)[::-1][:k]  # the k best values (ids may swap at a near-tie)
        assert np.allclose([lp for _, lp in r.top], best, atol=TOL), f"token {i}"
        if sp.greedy:
            assert top_ids[0] == r.token or ls[top_ids[0]] - ls[r.token] < TOL


# -- the record of one row -----------------------------------------------------------------
def test_token_logprob_is_the_log_softmax():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 4, 1000).astype(np.float32)
    x[[10, 20, 30]] = x.max() + 1  # a three-way tie at the top
    ls = log_softmax(x)
    r = token_logprob(x, 7, 5)
    assert r.token == 7 and abs(r.logprob - ls[7]) < 1e-9
    assert [t for t, _ in r.top[:3]] == [10, 20, 30]  # ties by ascending id
    order = np.argsort(-ls, kind="stable")[:5]
    assert [t for t, _ in r.top] == order.tolist()
    assert np.allclose([lp for _, lp in r.top], ls[order], atol=1e-9)
    assert token_logprob(x, 3, 0).top == []
    two = token_logprob(x, 20, 2)  # the cut falls inside the tie: the lower ids are kept
    assert [t for t, _ in two.top] == [10, 20]
    assert len(token_logprob(x[:4], 0, MAX_TOP_LOGPROBS).top) == 4  # fewer tokens than asked: all of them


@pytest.mark.parametrize("bad", [-1, MAX_TOP_LOGPROBS + 1, True, 2.0, "3"])
def test_bad_alternative_counts(plain, bad):
    with pytest.raises(ValueError, match="logprobs"):
        check_top_logprobs(bad)
    with pytest.raises(ValueError, match="logprobs"):
        plain.generate(PROMPTS[0], max_tokens=2, logprobs=bad)


# -- engine: values ---------------------------------------------------------------------------
@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=0.9, top_k=20, seed=4),
                                SamplingParams(**STRONG)], ids=["greedy", "sampled", "penalised"])
def test_values_are_the_targets_log_softmax(plain, reference, sp):
    for prompt in PROMPTS:
        out, records = run_records(plain, prompt, 16, sp, k=3)
        check_against_reference(reference, plain.prompt_tokens(prompt), out, records, sp, 3)


def test_asking_for_logprobs_changes_no_token(plain, spec):
    """The host path they need chooses the tokens the default path does (greedy; sampled with a seed
    on the CPU, whose host draw is the graph's draw bit for bit)."""
    samplings = [SamplingParams()] + ([] if gpu_available() else [SamplingParams(temperature=0.8, top_p=0.9, seed=2)])
    for e in (plain, spec):
        for sp in samplings:
            for prompt in PROMPTS:
                ids = e.prompt_tokens(prompt)
                assert run_records(e, prompt, 24, sp, k=2)[0] == list(e.generate_ids(ids, 24, sp))
                assert e.logprobs == []  # a generation without them records none


# -- engine: plain against speculative --------------------------------------------------------
def assert_same_records(a, b, rows):
    """Equal tokens, and values equal up to what a batched pass may move them: log-softmax moves by at
    most twice the largest change of a logit, and the CPU's (GPU's) passes move logits by up to REL_TOL
    of the row's largest |logit| (test_tree_verify); ``rows``: the reference logits ``[n, n_vocab]``."""
    assert [r.token for r in a] == [r.token for r in b]
    for i, (x, y) in enumerate(zip(a, b)):
        bound = 2 * REL_TOL * np.abs(rows[i]).max()
        assert abs(x.logprob - y.logprob) <= bound, f"token {i}"
        assert len(x.top) == len(y.top)
        assert all(abs(p - q) <= bound for (_, p), (_, q) in zip(x.top, y.top)), f"token {i}"


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(**STRONG)], ids=["greedy", "penalised"])
def test_speculative_chain_gives_plain_values(plain, spec, reference, sp):
    for prompt in PROMPTS:
        ref, ref_records = run_records(plain, prompt, 40, sp, k=5)
        oracle = OracleDrafter(spec.drafter, len(plain.prompt_tokens(prompt)), ref, 0.2)
        real = spec.drafter
        spec.drafter = oracle
        try:
            out, records = run_records(spec, prompt, 40, sp, k=5)
        finally:
            spec.drafter = real
        assert out == ref and spec.stats.tau > 1.5
        assert_same_records(records, ref_records, reference_rows(reference, plain.prompt_tokens(prompt), ref))


def test_speculative_tree_gives_plain_values(paths, plain, reference):
    with Engine(paths[0], paths[1], n_ctx=512, tree="ddtree", budget=24) as e:
        for prompt in PROMPTS:
            ref, ref_records = run_records(plain, prompt, 40, k=4)
            real = e.drafter
            e.drafter = TreeOracle(real, len(plain.prompt_tokens(prompt)), ref, 0.0)
            try:
                out, records = run_records(e, prompt, 40, k=4)
            finally:
                e.drafter = real
            assert out == ref and e.stats.tau > 1.5
            assert_same_records(records, ref_records, reference_rows(reference, plain.prompt_tokens(prompt), ref))
            run_with_drafter(e, real, prompt, 8)  # the engine still runs without records


# -- engine: records and text -------------------------------------------------------------------
def test_records_cover_the_text(plain):
    """``generate``'s records are the tokens of its text: their pieces join to it, each text_offset is
    where its piece starts, and a streamed piece's tokens are recorded before the piece is yielded."""
    for prompt in PROMPTS:
        text = plain.generate(prompt, max_tokens=30, logprobs=1)
        recs = plain.logprobs
        pieces = [plain.tok.piece(r.token) for r in recs]
        assert b"".join(pieces).decode("utf-8", "replace") == text
        starts = np.cumsum([0] + [len(p.decode("utf-8", "replace")) for p in pieces])[:-1]
        if all(p.decode("utf-8", "replace").encode() == p for p in pieces):  # no character split across tokens
            assert [r.text_offset for r in recs] == starts.tolist()
        n_seen, streamed = 0, ""
        for piece in plain.generate(prompt, max_tokens=30, logprobs=1, stream=True):
            streamed += piece
            n = len(plain.logprobs)
            assert n_seen <= n and n > 0
            assert [r.token for r in plain.logprobs] == [r.token for r in recs[:n]]
            assert all(r.text_offset < len(streamed) for r in plain.logprobs)  # recorded with its text
            n_seen = n
        assert streamed == text and [r.token for r in plain.logprobs] == [r.token for r in recs]


def test_records_stop_with_a_stop_string(plain):
    full = plain.generate(PROMPTS[0], max_tokens=40, logprobs=0)
    all_records = list(plain.logprobs)
    assert len(full) > 8
    stop = full[5:8]
    cut = plain.generate(PROMPTS[0], max_tokens=40, logprobs=0, stop=[stop])
    assert cut == full[:full.find(stop)]
    recs = plain.logprobs
    assert [r.token for r in recs] == [r.token for r in all_records[:len(recs)]]
    assert all(r.text_offset < len(cut) for r in recs)  # every token has text in the answer
    assert len(recs) < len(all_records) and all_records[len(recs)].text_offset >= len(cut)
    assert all(r.top == [] for r in recs)
