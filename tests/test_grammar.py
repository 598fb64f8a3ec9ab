"""Grammar-constrained decoding (tfm_local/decode/grammar.py): llama.cpp's GBNF matcher over the target's
vocabulary masks every chosen row, plain and speculative alike, and the drafts it rejects are cut before
verification.

The constrained distribution of a position depends on every token before it (the grammar's state), so a
speculative step must choose each verified node's token with the grammar advanced by that node's path.
Oracle drafters (test_engine, test_tree_verify) propose the plain output with corruptions, so that long
accepted paths and rejected (and cut) drafts both happen.
"""
import json

import numpy as np
import pytest

from tfm_local.decode.grammar import Grammar, GrammarError, json_grammar
from tfm_local.decode.host_choice import HostChooser
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.tree import Tree
from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available
from tfm_local.testing.synth import write_tiny_target

from test_engine import PROMPTS, OracleDrafter, assert_same_distribution, run_ids, run_with_drafter
from test_tree_verify import TreeOracle

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 7}},
          "required": ["color", "ok", "n"], "additionalProperties": False}
GBNF = json_grammar(SCHEMA)
CHOICE = 'root ::= "yes" | "no" | "(" root ")"'


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("grammar")
    target = write_tiny_target(d / "target.gguf", n_layer=3, n_embd=64)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=1)
    return target, drafter


@pytest.fixture(scope="module")
def plain(paths):
    with Engine(paths[0], None, n_ctx=512) as e:
        yield e


def text(engine, ids) -> str:
    return engine.tok.decode([t for t in ids if not engine.tok.is_eog(t)])


def check_schema(obj) -> None:
    assert set(obj) == {"color", "ok", "n"}
    assert obj["color"] in ("red", "green", "blue") and isinstance(obj["ok"], bool)
    assert isinstance(obj["n"], int) and obj["n"] >= 7


# -- the grammar itself ---------------------------------------------------------------
def test_a_bad_grammar_or_schema_is_a_clear_error(plain):
    with pytest.raises(GrammarError, match="could not parse"):
        Grammar(plain.target.model, 'root ::= "a" | (')
    with pytest.raises(GrammarError, match="empty"):
        Grammar(plain.target.model, "  ")
    with pytest.raises(GrammarError, match="must be an object"):
        json_grammar(["not", "a", "schema"])
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(grammar="")


def test_a_grammar_nested_too_deep_is_refused_before_llama_cpp_parses_it(plain):
    """llama.cpp's parser recurses per group: some ten thousand nested groups kill the process, so deeper
    than MAX_NESTING is a GrammarError (raw GBNF, or a schema's maxItems / maxLength), and up to it parses."""
    from tfm_local.decode.grammar import MAX_NESTING, nesting_depth

    deep = "root ::= " + "(" * 30000 + '"a"' + ")" * 30000
    with pytest.raises(GrammarError, match="nests 30000 groups deep"):
        Grammar(plain.target.model, deep)
    with pytest.raises(GrammarError, match="maxItems or maxLength"):
        Grammar(plain.target.model, json_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 30000}))
    Grammar(plain.target.model, "root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING).close()
    assert nesting_depth('root ::= ("(" [()] ( "x" # (((\n ) )') == 2  # literals, classes, comments skipped


@pytest.mark.parametrize("schema,why", [
    ({"type": "array", "minItems": 5, "maxItems": 2}, "minItems 5 is more than maxItems 2"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is more than maxLength 2"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "zzz"],
      "additionalProperties": False}, "required 'zzz' is not among the properties"),
    ({"type": "object", "properties": {"a": {"enum": []}}}, "empty enum"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "minLength": 3,
                                                                        "maxLength": 1}}}}, "minLength 3"),
])
def test_a_schema_nothing_matches_is_refused(schema, why):
    with pytest.raises(GrammarError, match=why):
        json_grammar(schema)


def test_a_pattern_matches_anywhere_in_the_string(plain):
    """JSON Schema's ``pattern`` is unanchored (ECMAScript search): the converter wants ^...$, so json_grammar
    pads an unanchored side with characters that keep the JSON string whole (no quote, backslash or line
    break). llama.cpp parses the result."""
    import re

    from tfm_local.decode.grammar import _anchored

    cases = {"[A-Z]{3}": ["ABC", "xxABCyy", "12ABC"], "^ab": ["ab", "abzz"], "cd$": ["cd", "zzcd"], "^x$": ["x"]}
    misses = {"[A-Z]{3}": ["AB", "aBC", 'x"ABC'], "^ab": ["zab"], "cd$": ["cdz"], "^x$": ["xx", ""]}
    for p, good in cases.items():
        r = re.compile(_anchored(p))
        assert all(r.fullmatch(t) for t in good) and not any(r.fullmatch(t) for t in misses[p]), p
        Grammar(plain.target.model, json_grammar({"type": "string", "pattern": p})).close()


def test_mask_and_allows_agree_and_accept_advances(plain):
    g = Grammar(plain.target.model, CHOICE)
    tok = plain.tok
    rng = np.random.default_rng(0)
    x = rng.standard_normal(plain.target.model.n_vocab).astype(np.float32)
    m = g.mask(x)
    allowed = np.flatnonzero(m > -np.inf)
    assert 0 < allowed.size < x.size and np.array_equal(m[allowed], x[allowed])
    for t in list(allowed[:5]) + list(rng.choice(np.flatnonzero(m == -np.inf), 5)):
        assert g.allows(int(t)) == (m[t] > -np.inf)
    texts = {tok.decode([int(t)]) for t in allowed}
    assert all("yes".startswith(s) or "no".startswith(s) or s.startswith("(") for s in texts), texts
    (y,) = tok.encode("y", add_special=False)
    assert g.allows(y)
    g.accept(y)
    assert not g.allows(y) and not any(plain.tok.is_eog(int(t)) for t in np.flatnonzero(g.mask(x) > -np.inf))
    g.close()


def test_cut_keeps_the_drafts_the_grammar_allows(plain):
    """A tree under the choice grammar: the nodes whose path leaves it go, with their subtrees; the rest
    keep their order and parents; the chooser's own state does not move."""
    enc = lambda s: plain.tok.encode(s, add_special=False)  # noqa: E731
    (y,), (e,), (s,), (n,), (o,), (p,) = (enc(c) for c in "yesnoq")
    root = 0  # the root token is already emitted: it is not checked
    tree = Tree.from_lists(root, [(0, y, -1.0), (1, e, -2.0), (2, o, -3.0), (0, n, -1.5), (4, o, -2.5),
                                  (2, s, -2.2), (0, p, -4.0), (7, y, -5.0)])
    ch = HostChooser(SamplingParams(grammar=CHOICE), [], model=plain.target.model)
    cut = ch.cut(tree)
    assert cut.tokens.tolist() == [root, y, e, n, o, s]
    assert cut.parents.tolist() == [-1, 0, 1, 0, 3, 2]
    assert cut.depth.tolist() == [0, 1, 2, 1, 2, 3]
    assert ch.grammar.allows(y) and ch.grammar.allows(n)  # unchanged by the cut
    assert ch.cut(Tree.root(root)).tokens.tolist() == [root]
    ch.close()


def test_tree_select_checks_its_nodes():
    t = Tree.from_lists(5, [(0, 1, -1.0), (1, 2, -2.0), (0, 3, -1.0)])
    assert t.select(np.array([1, 0, 0, 1], bool)).parents.tolist() == [-1, 0]
    with pytest.raises(ValueError, match="parent"):
        t.select(np.array([1, 0, 1, 1], bool))
    with pytest.raises(ValueError, match="root"):
        t.select(np.array([0, 1, 1, 1], bool))


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.0),
                                SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=2.0, min_p=0.5)],
                         ids=str)
def test_constrained_draw_is_a_draw_among_the_allowed_kept_tokens(plain, sp):
    """``constrained_draw`` against its definition, computed over the whole masked row: the best Gumbel-max
    score among the kept tokens the grammar allows, else ``sample_row`` of the masked row; on rows whose
    kept sets are small (checked token by token) and large (masked), in several grammar states."""
    from tfm_local.decode.host_choice import constrained_draw
    from tfm_local.decode.sampling import draw_key, gumbel_noise, kept_set, sample_row

    g = Grammar(plain.target.model, CHOICE)
    rng = np.random.default_rng(1)
    fallbacks = 0
    for i in range(60):
        x = (rng.standard_normal(plain.target.model.n_vocab) * rng.choice([0.5, 4.0])).astype(np.float32)
        key = draw_key(7, i)
        allowed = g.mask(x) > -np.inf
        keep = kept_set(x, sp) & allowed
        ids = np.flatnonzero(keep)
        if ids.size:
            score = (x[ids].astype(np.float64) - x.max()) / np.float64(np.float32(sp.temperature)) \
                + gumbel_noise(key, ids)
            want = int(ids[np.argmax(score)])
        else:
            fallbacks += 1
            want = sample_row(np.where(allowed, x, -np.inf).astype(np.float32), sp, key)[0]
        got = constrained_draw(x, sp, key, g)
        assert got == want and allowed[got], i
        if i % 20 == 19:  # a new grammar state
            g.accept(got)
    assert fallbacks > 0 or sp.top_p == 1 and not sp.top_k and not sp.min_p  # (no filters: every token kept)
    g.close()


# -- plain decoding under a grammar ------------------------------------------------------
@pytest.mark.parametrize("sp", [SamplingParams(grammar=GBNF),
                                SamplingParams(temperature=0.9, top_p=0.95, seed=4, grammar=GBNF)], ids=["greedy", "seeded"])
def test_plain_output_follows_the_schema(plain, sp):
    """The tiny random target writes text; under the schema's grammar it writes a matching JSON object
    and then ends (an end-of-generation token is all the completed grammar allows)."""
    for prompt in PROMPTS:
        out = run_ids(plain, prompt, 200, sp)
        assert plain.stats.finish_reason == "stop", text(plain, out)
        check_schema(json.loads(text(plain, out)))


def test_greedy_takes_the_argmax_of_the_allowed_tokens(paths, plain):
    """Each emitted token is the argmax over the tokens the grammar allows after the ones before it
    (the rows recomputed one prefix at a time)."""
    from tfm_local.decode.verify import Target

    ids = plain.prompt_tokens(PROMPTS[1])
    out = run_ids(plain, PROMPTS[1], 60, SamplingParams(grammar=CHOICE))
    g = Grammar(plain.target.model, CHOICE)
    t = Target(paths[0], n_ctx=512)
    masked = 0
    try:
        for i, tok in enumerate(out):
            x = t.prefill(ids + out[:i]).copy()
            assert tok == int(np.argmax(g.mask(x))), i
            masked += tok != int(np.argmax(x))
            g.accept(tok)
        assert masked > 0  # the grammar changed choices
    finally:
        t.close()
        g.close()


# -- speculative decoding under a grammar: lossless -----------------------------------------
@pytest.mark.parametrize("p_wrong", [0.0, 0.3])
def test_greedy_chain_equals_plain_under_a_grammar(paths, plain, p_wrong):
    sp = SamplingParams(grammar=GBNF)
    with Engine(paths[0], paths[1], n_ctx=512, budget=None) as spec:
        cut = []  # per step: the grammar cut the drafted chain (fewer nodes verified than drafted)
        spec.on_step = lambda rec, stretch: cut.append(rec.n_nodes - 1 < rec.budget)
        for prompt in PROMPTS:
            ref = run_ids(plain, prompt, 80, sp)
            oracle = OracleDrafter(spec.drafter, len(plain.prompt_tokens(prompt)), ref, p_wrong)
            cut.clear()
            assert run_with_drafter(spec, oracle, prompt, 80, sp) == ref
            assert spec.stats.tau > (3 if p_wrong == 0 else 1.5), "accepted paths ran through the grammar"
            assert any(cut) or not p_wrong  # corrupted drafts the grammar rejects are not verified
            cut.clear()
            assert run_ids(spec, prompt, 60, sp) == ref[:60]  # the random drafter's drafts, mostly cut
            assert any(cut)


@pytest.mark.parametrize("mode", ["ddtree", "wide"])
def test_greedy_trees_equal_plain_under_a_grammar(paths, plain, mode):
    sp = SamplingParams(grammar=GBNF)
    with Engine(paths[0], paths[1], n_ctx=512, tree=mode, budget=12) as e:
        for prompt in PROMPTS:
            ids = plain.prompt_tokens(prompt)
            ref = run_ids(plain, prompt, 60, sp)
            oracle = TreeOracle(e.drafter, len(ids), ref, 0.0)
            assert run_with_drafter(e, oracle, prompt, 60, sp) == ref
            assert e.stats.tau > 1.5
            assert run_ids(e, prompt, 40, sp) == ref[:40]


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_sampled_same_seed_same_output_under_a_grammar(paths, plain, mode):
    if gpu_available():
        pytest.skip("CUDA's batched and one-row kernels differ numerically (see the distribution test)")
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=11, grammar=GBNF)
    with Engine(paths[0], paths[1], n_ctx=512, tree=mode, budget=None if mode == "chain" else 12) as e:
        for prompt in PROMPTS:
            ref = run_ids(plain, prompt, 80, sp)
            check_schema(json.loads(text(plain, ref)))
            oracle = (OracleDrafter if mode == "chain" else TreeOracle)(
                e.drafter, len(plain.prompt_tokens(prompt)), ref, 0.2 if mode == "chain" else 0.0)
            assert run_with_drafter(e, oracle, prompt, 80, sp) == ref
            assert e.stats.tau > 1.5


def test_sampled_distribution_equals_plain_under_a_grammar(paths, plain):
    """Two-sample chi-square on the first 3 tokens over 300 seeds each (false-alarm rate 1e-3), under the
    choice grammar, the oracle's script corrupted at random so drafts are accepted, rejected and cut."""
    sp_args = dict(temperature=1.0, grammar=CHOICE)
    prompt = PROMPTS[2]
    script = run_ids(plain, prompt, 6, SamplingParams(grammar=CHOICE))
    with Engine(paths[0], paths[1], n_ctx=512, budget=None) as spec:
        outs = assert_same_distribution(plain, spec, prompt, script, 3, sp_args)
    assert all(text(plain, o) in ("yes", "no") or text(plain, o).startswith("(") for o in outs), outs[:5]


def test_integer_bounds_are_enforced():
    """The converter ignores an integer's bounds; json_grammar's grammar of a bounded integer matches
    exactly its range (read here as a regular expression), with one bound or two."""
    import random
    import re

    from tfm_local.decode.grammar import _int_bounds, int_range_gbnf

    def matches(lo, hi):
        pattern = re.sub(r'"(-|\d)"', r"\1", int_range_gbnf(lo, hi)).replace(" ", "")
        return re.compile(f"^({pattern})$")

    rng = random.Random(0)
    cases = [(0, 99), (0, 0), (5, 5), (-5, 12), (-120, -3), (10, 1000), (37, 4821), (-1, 0)]
    cases += [(lo, lo + rng.randint(0, 3000)) for lo in (rng.randint(-5000, 5000) for _ in range(50))]
    for lo, hi in cases:
        r = matches(lo, hi)
        for x in rng.sample(range(lo - 300, hi + 300), min(400, hi - lo + 600)):
            assert bool(r.match(str(x))) == (lo <= x <= hi), (lo, hi, x)
        assert not r.match("-0") and not r.match("0" + str(max(lo, 1)))
    assert "([0-9]) | (\"1\" [0-2])" in json_grammar({"type": "integer", "minimum": 0, "maximum": 12})
    assert "[0-4]" in json_grammar({"type": "integer", "exclusiveMinimum": -0.5, "exclusiveMaximum": 5})
    one_sided = [(0, None), (1, None), (18, None), (99, None), (100, None), (-1, None), (-250, None),
                 (None, 0), (None, 7), (None, 1000), (None, -1), (None, -10), (None, -999)]
    one_sided += [(rng.randint(-5000, 5000), None) for _ in range(20)] + [(None, rng.randint(-5000, 5000))
                                                                         for _ in range(20)]
    for lo, hi in one_sided:  # the bounds json_grammar gives a schema with only minimum or only maximum
        r = matches(*_int_bounds({"type": "integer", **({"minimum": lo} if lo is not None else {"maximum": hi})}))
        b = lo if lo is not None else hi
        for x in list(range(b - 300, b + 300)) + [b - 123456789, b + 123456789, -(10 ** 30), 10 ** 30,
                                                  10 ** 16 - 1, 10 ** 16, 1 - 10 ** 16, -(10 ** 16)]:
            within = (lo is None or x >= lo) and (hi is None or x <= hi) and abs(x) < 10 ** 16  # 16 digits at most
            assert bool(r.match(str(x))) == within, (lo, hi, x)
        assert not r.match("-0") and not r.match("007") and not r.match("-007") and not r.match("")
    assert "integral-part" not in json_grammar({"type": "integer", "minimum": 3})
    up_to_12 = json_grammar({"type": "integer", "maximum": 12})
    assert '([0-9]) | ("1" [0-2]) | "-" ([1-9]) | "-" ([1-9] [0-9]) | ' in up_to_12
    assert '"-" ([1-9]' + " [0-9]" * 15 + "))" in up_to_12 and '"-" ([1-9]' + " [0-9]" * 16 not in up_to_12
    assert "integral-part" in json_grammar({"type": "integer"})
    with pytest.raises(GrammarError, match="empty"):
        json_grammar({"type": "integer", "minimum": 5, "maximum": 1})
    with pytest.raises(GrammarError, match="empty"):
        json_grammar({"type": "integer", "minimum": 10 ** 16})
