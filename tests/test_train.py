"""tfm-train on tiny synthetic targets (CPU): corpus, PyTorch target and drafter, fit, export, parity.

The module fixture runs the smoke pipeline once (tiny qwen2 target, ShareGPT
prompts answered by that target through llama.cpp, a short fit, export,
llama.cpp drafting); the other tests reuse its artifacts. Parity compares
the PyTorch drafter with the same weights run by llama.cpp from GGUF, so a
wrong mask, RoPE, norm or tensor mapping on either side makes it fail.
"""
import json
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tfm_local.testing import synth  # noqa: E402
from tfm_convert.errors import ConvertError  # noqa: E402
from tfm_local.train import corpus as corpus_mod  # noqa: E402
from tfm_local.train.batching import IGNORE, make_batch, plan_batches, sample_anchors  # noqa: E402
from tfm_local.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from tfm_local.train.corpus import Sequence, append_shard, load_corpus, new_manifest  # noqa: E402
from tfm_local.train.errors import CorruptArtifactError, TrainError  # noqa: E402
from tfm_local.train.model import block_mask  # noqa: E402
from tfm_local.train.prompts import PromptFile, Selection, select_prompts  # noqa: E402
from tfm_local.train.recipe import FitOptions, acceptance_proxy, lr_factor, position_weights  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    """Every test here on one torch thread (``conftest.one_torch_thread``)."""


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from tfm_local.train.smoke import run_smoke

    return run_smoke(tmp_path_factory.mktemp("smoke"), steps=120)


def _conv(*turns):
    return {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}


# -- prompts and corpus ------------------------------------------------------------------

def test_select_prompts_dedup_bounds_seed():
    convs = [_conv(("human", "Hello there, how are you?"), ("gpt", "fine")),
             _conv(("human", "  hello THERE,   how are you? "), ("gpt", "dup")),  # duplicate after normalising
             _conv(("gpt", "I start"), ("human", "Second turn is the first user turn")),
             _conv(("human", "short")),  # under min_chars
             _conv(("human", "x" * 500)),  # over max_chars
             ] + [_conv(("human", f"question number {i} about something")) for i in range(20)]
    sel = Selection(seed=1, min_chars=8, max_chars=100)
    a = select_prompts(sel, convs)
    assert len(a) == 22
    assert sum(t.lower().startswith("hello there") for t in a) == 1
    assert "Second turn is the first user turn" in a
    assert a == select_prompts(sel, convs)
    b = select_prompts(Selection(seed=2, min_chars=8, max_chars=100), convs)
    assert sorted(a) == sorted(b) and a != b


def test_select_prompts_later_turns_carry_their_context():
    convs = [_conv(("system", "Be brief."), ("human", "First question here?"), ("gpt", "Answer one."),
                   ("human", "ok"),  # under min_chars: skipped, still context for the next turn
                   ("gpt", "Answer two."), ("human", "Third question here?"), ("gpt", "Answer three.")),
             _conv(("human", "x" * 500), ("gpt", "long"), ("human", "Follow-up question?"))]
    one = select_prompts(Selection(seed=0, min_chars=8, max_chars=100), convs)
    assert one == ["First question here?"]  # turns=1: as before (the second conversation's first turn is too long)
    many = select_prompts(Selection(seed=0, min_chars=8, max_chars=100, turns=3), convs)
    assert len(many) == 3 and "First question here?" in many
    third = next(p for p in many if isinstance(p, list) and p[-1]["content"] == "Third question here?")
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    follow = next(p for p in many if isinstance(p, list) and p[-1]["content"] == "Follow-up question?")
    assert follow[0]["content"] == "x" * 500  # a skipped turn stays in the context
    assert select_prompts(Selection(seed=0, min_chars=8, max_chars=100, turns=2), convs) != many
    # a conversation's turns stay together, in order, whatever the seed (held-out tails share no context)
    convs3 = [_conv(*[(r, f"conversation {c} turn {t} {r}") for t in range(3) for r in ("human", "gpt")])
              for c in range(6)]
    for seed in range(4):
        got = select_prompts(Selection(seed=seed, min_chars=8, max_chars=100, turns=3), convs3)
        keys = [tuple((p if isinstance(p, str) else p[-1]["content"]).split()[1:4:2]) for p in got]  # (conv, turn)
        assert len(keys) == 18
        for i in range(0, 18, 3):
            assert keys[i:i + 3] == [(keys[i][0], t) for t in "012"]
    assert "turns" not in Selection().to_dict() and Selection(turns=3).to_dict()["turns"] == 3


def test_chat_tokenizer_renders_a_conversation_prompt(tmp_path):
    from tfm_local.train.prompts import ChatTokenizer

    target = synth.write_tiny_target(tmp_path / "t.gguf")
    tok = ChatTokenizer(target)
    try:
        single = tok.prompt_ids("What is two plus two?")
        assert tok.prompt_ids([{"role": "user", "content": "What is two plus two?"}]) == single
        convo = tok.prompt_ids([{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"},
                                {"role": "user", "content": "What is two plus two?"}])
        assert len(convo) > len(single) and convo[-6:] == single[-6:]  # both end with the same last turn
    finally:
        tok.close()


def _seqs(n, rng, start=0):
    return [Sequence(rng.integers(0, 300, size=int(rng.integers(5, 40))).astype(np.int32), 3, start + i)
            for i in range(n)]


def test_corpus_roundtrip_and_counts(tmp_path):
    rng = np.random.default_rng(0)
    m = new_manifest({"name": "t", "size": 1, "sha256": "ab"}, {"seed": 0}, {"max_new_tokens": 8})
    s1, s2 = _seqs(5, rng), _seqs(7, rng, 5)
    append_shard(tmp_path, m, s1, (0, 6))
    append_shard(tmp_path, m, s2, (6, 13))
    m2, got = load_corpus(tmp_path)
    assert [s.ids.tolist() for s in got] == [s.ids.tolist() for s in s1 + s2]
    assert [s.prompt_index for s in got] == list(range(12))
    assert m2["counts"]["sequences"] == 12 and m2["counts"]["prompts_consumed"] == 13
    assert m2["counts"]["tokens"] == sum(len(s.ids) for s in s1 + s2)
    assert m2["counts"]["response_tokens"] == sum(len(s.ids) - 3 for s in s1 + s2)


def test_corrupt_corpus_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(1)
    m = new_manifest({"name": "t", "size": 1, "sha256": "ab"}, {}, {})
    append_shard(tmp_path, m, _seqs(4, rng), (0, 4))
    shard = tmp_path / "shard-00000.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match="corrupt"):
        load_corpus(tmp_path)
    with pytest.raises(CorruptArtifactError, match="unreadable"):
        load_corpus(tmp_path, verify=False)
    shard.unlink()
    with pytest.raises(CorruptArtifactError, match="missing"):
        load_corpus(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "tfm-corpus-v1", "shards": [')
    with pytest.raises(CorruptArtifactError, match="corrupt manifest"):
        load_corpus(tmp_path)
    with pytest.raises(TrainError, match="not a corpus"):
        load_corpus(tmp_path / "nowhere")


class _FakeBackend:
    """Deterministic 'generation': the response is a function of the prompt."""

    name = "fake"

    def generate(self, prompts, max_new, ranks=None):
        return [[int(p.sum()) % 97, 1, 2][: max_new] for p in prompts]


class _FakeSampler(_FakeBackend):
    """A 'sampling' backend: the manifest records its temperature and seed."""

    temperature, seed = 0.8, 5


class _FakePrompts:
    eog = [0]

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def get(self, r):
        return None if r % 5 == 4 else np.arange(r, r + 3 + r % 4, dtype=np.int32)


def test_build_corpus_resumes_and_appends(tmp_path):
    from tfm_local.train.generate import build_corpus

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False)
    build_corpus(tmp_path / "a", target, _FakePrompts(30), _FakeBackend(), n_prompts=12, shard_size=5, **kw)
    build_corpus(tmp_path / "a", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, shard_size=5, **kw)
    build_corpus(tmp_path / "b", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, shard_size=7, **kw)
    (ma, a), (mb, b) = load_corpus(tmp_path / "a"), load_corpus(tmp_path / "b")
    assert [s.ids.tolist() for s in a] == [s.ids.tolist() for s in b]
    assert [s.prompt_index for s in a] == [r for r in range(30) if r % 5 != 4]
    assert ma["counts"]["prompts_consumed"] == 30 and ma["target"]["size"] == len(b"pretend target")
    with pytest.raises(TrainError, match="selection"):
        build_corpus(tmp_path / "a", target, _FakePrompts(40), _FakeBackend(), n_prompts=40, shard_size=5,
                     **{**kw, "selection": {"seed": 1}})
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another target")
    with pytest.raises(TrainError, match="target"):
        build_corpus(tmp_path / "a", other, _FakePrompts(40), _FakeBackend(), n_prompts=40, shard_size=5, **kw)


def test_build_corpus_only_chosen_prompts_keeps_their_ranks(tmp_path):
    """OnlyPrompts: responses for the chosen ranks only (a skipped one stays skipped), under their own
    ranks; the ranks' record is part of the generation settings; a sampled corpus of them trains beside
    the full greedy one (other decoding), and the CLI refuses a ranks file of another prompt order."""
    from tfm_local.cli.train import _only_prompts
    from tfm_local.train.corpus import target_identity
    from tfm_local.train.emphasis import save_emphasis
    from tfm_local.train.fit import load_corpora
    from tfm_local.train.generate import OnlyPrompts, build_corpus

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False, shard_size=5)
    only = {"file": "w.npz", "sha256": "x", "prompts": 4}
    build_corpus(tmp_path / "w", target, OnlyPrompts(_FakePrompts(30), {3, 9, 20, 27}), _FakeSampler(), n_prompts=30,
                 only=only, **kw)
    m, seqs = load_corpus(tmp_path / "w")
    assert [s.prompt_index for s in seqs] == [3, 20, 27] and m["generation"]["only"] == only  # 9 % 5 == 4: skipped
    with pytest.raises(TrainError, match="generation settings"):
        build_corpus(tmp_path / "w", target, _FakePrompts(30), _FakeSampler(), n_prompts=30, **kw)
    build_corpus(tmp_path / "g", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, **kw)
    both = load_corpora([tmp_path / "w", tmp_path / "g"], target_identity(target))[1]
    assert len(both) == 3 + len(load_corpus(tmp_path / "g")[1])
    from tfm_local.train.fit import _check_heldout_source

    _check_heldout_source([tmp_path / "w", tmp_path / "g"], 5)
    _check_heldout_source([tmp_path / "g", tmp_path / "w"], 0)
    with pytest.raises(TrainError, match="put a corpus of all prompts last"):
        _check_heldout_source([tmp_path / "g", tmp_path / "w"], 5)
    path = save_emphasis(tmp_path / "e.npz", np.array([1, 2]), json.dumps([{"seed": 1}, 16], sort_keys=True), "t")
    with pytest.raises(TrainError, match="another prompt order"):
        _only_prompts(_FakePrompts(30), path, {"seed": 0}, 16)
    got, record = _only_prompts(_FakePrompts(30), save_emphasis(tmp_path / "f.npz", np.array([1, 2]),
                                json.dumps([{"seed": 0}, 16], sort_keys=True), "t"), {"seed": 0}, 16)
    assert record["prompts"] == 2 and record["file"] == "f.npz" and got.get(1) is not None and got.get(3) is None


class _BatchRecorder(_FakeBackend):
    """_FakeBackend that records the size of every batch it is given."""

    def __init__(self):
        self.batches = []

    def generate(self, prompts, max_new, ranks=None):
        self.batches.append(len(prompts))
        return super().generate(prompts, max_new, ranks)


def test_build_corpus_only_fills_its_batches(tmp_path):
    """A sparse OnlyPrompts choice: each shard spans as many ranks as hold shard_size chosen prompts (full
    batches, not ~5% of one as on the H200), and the corpus is the same as with rank-sized shards."""
    from tfm_local.train.generate import OnlyPrompts, build_corpus

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    chosen = {2, 3, 11, 12, 13, 22, 31, 36, 41, 47}  # none is skipped (r % 5 == 4)
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False)
    rec = _BatchRecorder()
    m = build_corpus(tmp_path / "a", target, OnlyPrompts(_FakePrompts(50), chosen), rec, n_prompts=50,
                     shard_size=3, **kw)
    assert rec.batches == [3, 3, 3, 1] and m["counts"]["prompts_consumed"] == 50
    build_corpus(tmp_path / "b", target, OnlyPrompts(_FakePrompts(50), chosen), _FakeBackend(), n_prompts=20,
                 shard_size=1, **kw)  # another shard size, stopped early and resumed: the same corpus
    build_corpus(tmp_path / "b", target, OnlyPrompts(_FakePrompts(50), chosen), _FakeBackend(), n_prompts=50,
                 shard_size=4, **kw)
    (_, a), (_, b) = load_corpus(tmp_path / "a"), load_corpus(tmp_path / "b")
    assert [s.prompt_index for s in a] == sorted(chosen) == [s.prompt_index for s in b]
    assert [s.ids.tolist() for s in a] == [s.ids.tolist() for s in b]


def test_build_corpus_slices_and_time_budget(tmp_path, monkeypatch):
    """Two slices (-n H, --first-prompt H) hold exactly the sequences of one whole corpus; a time budget
    stops before a shard that would overrun, leaves a loadable corpus, and the same call resumes it."""
    from tfm_local.train import generate
    from tfm_local.train.generate import build_corpus

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False, shard_size=5)
    build_corpus(tmp_path / "all", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, **kw)
    build_corpus(tmp_path / "lo", target, _FakePrompts(30), _FakeBackend(), n_prompts=13, **kw)
    build_corpus(tmp_path / "hi", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, first=13, **kw)
    whole = [s.ids.tolist() for s in load_corpus(tmp_path / "all")[1]]
    parts = [s.ids.tolist() for d in ("lo", "hi") for s in load_corpus(tmp_path / d)[1]]
    assert parts == whole
    assert load_corpus(tmp_path / "hi")[1][0].prompt_index == 13
    with pytest.raises(TrainError, match="generation settings"):  # the slice is part of the recorded settings
        build_corpus(tmp_path / "hi", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, **kw)
    from tfm_local.train.corpus import target_identity
    from tfm_local.train.fit import load_corpora

    ident = target_identity(target)
    assert [s.ids.tolist() for s in load_corpora([tmp_path / "lo", tmp_path / "hi"], ident)[1]] == whole
    with pytest.raises(TrainError, match=r"share 13 prompts .*ranks 13\.\.28"):  # 13..29 less 14, 19, 24, 29
        load_corpora([tmp_path / "all", tmp_path / "hi"], ident)

    clock = iter(range(0, 1000, 10))  # each monotonic() call of generate advances 10 s
    monkeypatch.setattr(generate, "time", types.SimpleNamespace(monotonic=lambda: float(next(clock))))
    m = build_corpus(tmp_path / "t", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, time_budget_s=35, **kw)
    assert 0 < m["counts"]["prompts_consumed"] < 30
    assert len(load_corpus(tmp_path / "t")[1]) == m["counts"]["sequences"]
    build_corpus(tmp_path / "t", target, _FakePrompts(30), _FakeBackend(), n_prompts=30, **kw)
    assert [s.ids.tolist() for s in load_corpus(tmp_path / "t")[1]] == whole


def test_prompt_file_roundtrip_and_corruption(tmp_path):
    ids = [np.arange(5, dtype=np.int32), None, np.arange(3, 9, dtype=np.int32)]
    PromptFile(ids, [7, 9], {"selection": {"seed": 3}, "max_prompt_tokens": 8}).save(tmp_path / "p.npz")
    pf = PromptFile.load(tmp_path / "p.npz")
    assert pf.ids[1] is None and pf.ids[0].tolist() == list(range(5)) and pf.ids[2].tolist() == list(range(3, 9))
    assert pf.eog == [7, 9] and pf.meta["selection"] == {"seed": 3}
    (tmp_path / "p.npz").write_bytes((tmp_path / "p.npz").read_bytes()[:40])
    with pytest.raises(CorruptArtifactError):
        PromptFile.load(tmp_path / "p.npz")


# -- batching and recipe -----------------------------------------------------------------

def test_anchors_blocks_and_labels():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = sample_anchors(7, 30, 8, rng)
        assert len(set(a.tolist())) == len(a) == 8 and a.min() >= 7 and a.max() <= 28
    assert len(sample_anchors(7, 8, 4, rng)) == 0
    seqs = [Sequence(np.arange(100, 120, dtype=np.int32), 5, 0), Sequence(np.arange(200, 209, dtype=np.int32), 6, 1)]
    b = make_batch(seqs, n_anchors=3, block=4, mask_id=99, max_len=64, rng=rng)
    assert b.ids.shape == (2, 20)
    assert b.anchor_ok[1].tolist() == [True, True, False]  # anchors 6 and 7 only
    for r in range(2):
        for k in range(3):
            if not b.anchor_ok[r, k]:
                assert (b.labels[r, 4 * k:4 * k + 4] == IGNORE).all()
                continue
            a = int(b.anchors[r, k])
            assert b.noise[r, 4 * k].item() == b.ids[r, a].item()
            assert (b.noise[r, 4 * k + 1:4 * k + 4] == 99).all()
            assert b.noise_pos[r, 4 * k:4 * k + 4].tolist() == [a, a + 1, a + 2, a + 3]
            n = len(seqs[r].ids)
            want = [IGNORE] + [int(seqs[r].ids[a + i]) if a + i < n else IGNORE for i in (1, 2, 3)]
            assert b.labels[r, 4 * k:4 * k + 4].tolist() == want


def test_block_mask_sees_context_before_anchor_and_own_block():
    m = block_mask(torch.tensor([[2, 5]]), ctx_len=6, block=3)[0, 0]
    assert m.shape == (6, 12)
    assert m[0, :6].tolist() == [True, True, False, False, False, False]
    assert m[3, :6].tolist() == [True] * 5 + [False]
    assert m[1, 6:].tolist() == [True] * 3 + [False] * 3
    assert m[4, 6:].tolist() == [False] * 3 + [True] * 3


def test_plan_batches_respects_budget_and_is_deterministic():
    lengths = list(np.random.default_rng(0).integers(10, 300, size=200))
    p = plan_batches(lengths, 1024, seed=3, epoch=1)
    assert sorted(i for b in p for i in b) == list(range(200))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 1024 for b in p)
    assert p == plan_batches(lengths, 1024, seed=3, epoch=1) != plan_batches(lengths, 1024, seed=3, epoch=2)


def test_loss_weights_schedule_and_acceptance_proxy():
    w = position_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1 and torch.isclose(w[8], torch.exp(torch.tensor(-1.0)))
    assert lr_factor(0, 100, 0.1, 0.0) == pytest.approx(0.1) and lr_factor(9, 100, 0.1, 0.0) == pytest.approx(1.0)
    assert lr_factor(99, 100, 0.1, 0.0) < 0.01
    correct = torch.tensor([[[1, 1, 0, 1], [0, 1, 1, 1]], [[1, 1, 1, 1], [1, 0, 0, 0]]], dtype=torch.bool)
    ok = torch.tensor([[True, True], [True, False]])
    assert acceptance_proxy(correct, ok) == pytest.approx((2 + 0 + 4) / 3)


# -- PyTorch target against llama.cpp -----------------------------------------------------

@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_feature_cosine_tiny_target(tmp_path, arch):
    from tfm_local.train.checks import feature_cosines

    target = synth.write_tiny_target(tmp_path / "t.gguf", arch=arch, n_layer=6, seed=4)
    seqs = [list(range(3, 60)), [260, 5, 17, 99, 3, 3, 3, 180, 42]]
    rows = feature_cosines(target, seqs, [0, 1, 3, 5], threads=1)
    assert [r.layer for r in rows] == [0, 1, 3, 5]
    for r in rows:
        assert r.mean >= 0.999 and r.min >= 0.99, r


def test_feature_cosine_detects_wrong_rope(tmp_path, monkeypatch):
    """The check can fail: with the RoPE style flipped, deep features no longer match."""
    from tfm_local.train import gguf_weights
    from tfm_local.train.checks import feature_cosines

    target = synth.write_tiny_target(tmp_path / "t.gguf", arch="qwen2", n_layer=4, seed=4)
    monkeypatch.setitem(gguf_weights.ROPE_NEOX, "qwen2", False)
    rows = feature_cosines(target, [list(range(3, 60))], [3], threads=1)
    assert rows[0].mean < 0.99


def test_sampled_corpus_records_its_decoding_and_is_other_data_than_greedy(tmp_path):
    """The manifest records the decoding; a resume with another decoding is refused; a fit takes a greedy and
    a sampled corpus of the same prompt ranks together, but not two greedy ones."""
    from tfm_local.train.corpus import target_identity
    from tfm_local.train.fit import load_corpora
    from tfm_local.train.generate import build_corpus

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False, n_prompts=10, shard_size=5)
    build_corpus(tmp_path / "g", target, _FakePrompts(10), _FakeBackend(), **kw)
    build_corpus(tmp_path / "g2", target, _FakePrompts(10), _FakeBackend(), **kw)
    m = build_corpus(tmp_path / "s", target, _FakePrompts(10), _FakeSampler(), **kw)
    assert m["generation"]["decoding"] == {"temperature": 0.8, "seed": 5}
    assert load_corpus(tmp_path / "g")[0]["generation"]["decoding"] == "greedy"
    with pytest.raises(TrainError, match="generation settings"):
        build_corpus(tmp_path / "s", target, _FakePrompts(20), _FakeBackend(), **{**kw, "n_prompts": 20})
    ident = target_identity(target)
    _, seqs = load_corpora([tmp_path / "g", tmp_path / "s"], ident)
    assert len(seqs) == 2 * len(load_corpus(tmp_path / "g")[1])
    with pytest.raises(TrainError, match="share"):
        load_corpora([tmp_path / "g", tmp_path / "g2"], ident)


def _first_token_counts(backend, prompt, n):
    toks = [r[0] for r in backend.generate([prompt] * n, 1)]
    return np.bincount(toks, minlength=512)


def test_torch_sampling_follows_the_target_distribution(tmp_path):
    """At T = 0.7, 6,000 first tokens of one prompt: each token of probability > 2% (llama.cpp's logits)
    within 5 binomial standard deviations of its probability, and so the mass of the tokens below 0.1%; seeded (same seed and key: the same
    responses, another seed: others); T = 0 is the argmax."""
    from tfm_local.train.generate import TorchBackend

    target = synth.write_tiny_target(tmp_path / "t.gguf", n_layer=2, seed=4)
    prompt = np.array([5, 17, 33, 2], dtype=np.int32)
    eog = [int(synth.TinyVocab().special["<|im_end|>"])]
    model = synth.load_model(target)
    ctx = synth.new_context(model)
    logits = synth.decode_tokens(ctx, prompt.tolist())[-1].astype(np.float64)
    p = np.exp((logits - logits.max()) / 0.7)
    p /= p.sum()
    n = 6000
    sampler = TorchBackend(target, eog, device="cpu", dtype="float32", batch_size=n, temperature=0.7, seed=1)
    counts = _first_token_counts(sampler, prompt, n)[: len(p)]
    big = p > 0.02
    assert big.sum() >= 3, p.max()  # a spread distribution, or the test proves little
    sd = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts[big] / n - p[big]) <= 5 * sd[big]), (counts[big] / n, p[big])
    tail = p[p < 1e-3].sum()  # the many unlikely tokens together: no mass moved into or out of them
    assert abs(counts[p < 1e-3].sum() / n - tail) <= 5 * np.sqrt(tail * (1 - tail) / n) + 1e-3, tail
    rows = [np.array([5 + i, 9, 2 * i + 1], dtype=np.int32) for i in range(6)]
    again = TorchBackend(target, eog, device="cpu", dtype="float32", batch_size=6, temperature=0.7, seed=1)
    other = TorchBackend(target, eog, device="cpu", dtype="float32", batch_size=6, temperature=0.7, seed=2)
    ranks = list(range(3, 9))
    assert again.generate(rows, 12, ranks) == again.generate(rows, 12, ranks)
    assert again.generate(rows, 12, ranks) != other.generate(rows, 12, ranks)
    greedy = TorchBackend(target, eog, device="cpu", dtype="float32", batch_size=1)
    assert greedy.generate([prompt], 1)[0][0] == int(np.argmax(logits))


def test_torch_generation_equals_llama(tmp_path):
    from tfm_local.train.generate import LlamaBackend, TorchBackend

    target = synth.write_tiny_target(tmp_path / "t.gguf", n_layer=3, seed=8)
    prompts = [np.array(p, dtype=np.int32) for p in ([1, 2, 3, 4, 5], [40, 50], list(range(100, 120)))]
    eog = [int(synth.TinyVocab().special["<|im_end|>"])]
    ref = LlamaBackend(target, n_ctx=128, n_gpu_layers=0, n_threads=1)
    try:
        want = ref.generate(prompts, 24)
    finally:
        ref.close()
    got = TorchBackend(target, eog, device="cpu", dtype="float32", batch_size=2).generate(prompts, 24)
    assert got == want


# -- the smoke pipeline -------------------------------------------------------------------

def test_smoke_loss_goes_down(smoke):
    k = 4
    first, last = np.mean(smoke.losses[:k]), np.mean(smoke.losses[-k:])
    assert smoke.n_sequences >= 40
    assert last < 0.5 * first, (first, last)
    assert np.mean(smoke.taus[-k:]) > np.mean(smoke.taus[:k]) + 1.0


def test_exported_drafter_converts_loads_and_drafts(smoke, tmp_path):
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.decode.verify import Target
    from tfm_local.train.export import export

    cfg = json.loads((smoke.paths["hf"] / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"]["block_size"] == 16 and len(cfg["dflash_config"]["target_layer_ids"]) == 5
    assert len(smoke.drafted) == 15 and all(0 <= t < 320 for t in smoke.drafted)
    f16 = export(smoke.paths["checkpoint"], smoke.paths["target"], tmp_path, ("f16",))["f16"]
    tgt = Target(smoke.paths["target"], n_ctx=128, n_batch=64, n_gpu_layers=0, n_threads=1)
    try:
        dft = DFlashDrafter(f16, tgt, n_gpu_layers=0, n_threads=1)
        assert dft.layers == [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]
        assert dft.mask_token == cfg["dflash_config"]["mask_token_id"]
        dft.close()
    finally:
        tgt.close()


def test_parity_torch_vs_llama_cpp(smoke):
    assert smoke.parity_positions >= 300
    assert smoke.parity >= 0.99


def test_parity_detects_other_weights(smoke):
    """The parity check can fail: a drafter with other weights disagrees with the GGUF."""
    from tfm_local.train.checks import drafter_parity, load_torch_drafter
    from tfm_local.train.smoke import _sequences

    model = load_torch_drafter(smoke.paths["checkpoint"])
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(-1.0)
    agree, _ = drafter_parity(smoke.paths["f32"], model, smoke.paths["target"],
                              _sequences(smoke.paths["checkpoint"].parents[1] / "corpus", 1), threads=1)
    assert agree < 0.9


def test_drafter_marginals_rows_are_positions_1_to_15(smoke):
    from tfm_local.decode.draft import DFlashDrafter
    from tfm_local.decode.verify import Target
    from tfm_local.train.checks import block_logits

    ids = _first_sequence(smoke)
    tgt = Target(smoke.paths["target"], n_ctx=len(ids) + 20, n_batch=len(ids), n_gpu_layers=0, n_threads=1)
    dft = DFlashDrafter(smoke.paths["f32"], tgt, n_gpu_layers=0, n_threads=1)
    try:
        tgt.prefill(ids, lambda s, n: dft.inject(tgt.features(slice(0, n), n), s))
        want = block_logits(dft, ids[-1], len(ids))[1:]
        got = dft.marginals(ids[-1], len(ids), 15).copy()
        np.testing.assert_allclose(got, want, atol=1e-3)
    finally:
        dft.close()
        tgt.close()


def _first_sequence(smoke):
    from tfm_local.train.smoke import _sequences

    return _sequences(smoke.paths["checkpoint"].parents[1] / "corpus", 1)[0]


# -- fit: resume and checkpoints ----------------------------------------------------------

def _opts(steps):
    return FitOptions(epochs=50, lr=3e-3, warmup=0.05, batch_tokens=1024, anchors=4, max_len=256,
                      save_every=3, max_steps=steps, log_every=1)


def test_fit_resume_after_a_crash_equals_uninterrupted_run(smoke, tmp_path, monkeypatch):
    from tfm_local.train import fit as fit_mod
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    config = drafter_config(target, 1, 64)
    fit(corpus, target, tmp_path / "a", _opts(8), config, progress=False)
    real, calls = fit_mod.block_loss, []

    def crash_at_step_6(*a, **k):
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(fit_mod, "block_loss", crash_at_step_6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(corpus, target, tmp_path / "b", _opts(8), config, progress=False)
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 3  # save_every=3
    monkeypatch.setattr(fit_mod, "block_loss", real)
    fit(corpus, target, tmp_path / "b", _opts(8), config, progress=False)
    a, b = (load_checkpoint(tmp_path / x / "checkpoint.pt") for x in "ab")
    assert a["step"] == b["step"] == 8
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6)
    with pytest.raises(TrainError, match="fit options"):
        fit(corpus, target, tmp_path / "b", FitOptions(**{**_opts(8).__dict__, "lr": 1e-3}), config, progress=False)
    with pytest.raises(TrainError, match="another shape"):
        fit(corpus, target, tmp_path / "b", _opts(8), drafter_config(target, 2, 64), progress=False)


def test_heldout_split_takes_the_last_sequences_and_refuses_too_many():
    from tfm_local.train.heldout import split

    seqs = _seqs(5, np.random.default_rng(0))
    train, held = split(seqs, 2)
    assert train == seqs[:3] and held == seqs[3:]
    assert split(seqs, 0) == (seqs, [])
    for n in (5, 9, -1):
        with pytest.raises(TrainError):
            split(seqs, n)


def test_heldout_prompts_are_kept_out_of_training_in_every_corpus(tmp_path):
    """A greedy and a sampled corpus of the same prompts, fitted together: the prompts of the held-out
    sequences (the last corpus's last ones) are dropped from the other corpus's training sequences too."""
    from tfm_local.train.corpus import target_identity
    from tfm_local.train.fit import load_corpora
    from tfm_local.train.generate import build_corpus
    from tfm_local.train.heldout import split

    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    kw = dict(max_new=3, selection={"seed": 0}, max_prompt_tokens=16, progress=False, n_prompts=20, shard_size=5)
    build_corpus(tmp_path / "s", target, _FakePrompts(20), _FakeSampler(), **kw)
    build_corpus(tmp_path / "g", target, _FakePrompts(20), _FakeBackend(), **kw)
    _, seqs = load_corpora([tmp_path / "s", tmp_path / "g"], target_identity(target))
    train, held = split(seqs, 3)
    held_ranks = {s.prompt_index for s in held}
    assert len(held) == 3 and held == seqs[-3:]
    assert not held_ranks & {s.prompt_index for s in train}
    assert len(train) == len(seqs) - 6  # the three greedy ones and their three sampled twins


def test_fit_holdout_is_never_trained_and_is_scored(smoke, tmp_path, monkeypatch):
    """With 3 held-out sequences: training batches never contain them, the log gets a held-out line every
    eval_every steps and at the end, and resuming with another holdout is refused."""
    from tfm_local.train import fit as fit_mod
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    opts = FitOptions(**{**_opts(7).__dict__, "holdout": 3, "eval_every": 3})
    held_ids = {tuple(s.ids) for s in _sequences_of(corpus)[-3:]}
    seen, real = [], fit_mod.make_batch
    monkeypatch.setattr(fit_mod, "make_batch", lambda seqs, *a: seen.extend(tuple(s.ids) for s in seqs) or real(seqs, *a))
    fit(corpus, target, tmp_path / "h", opts, drafter_config(target, 1, 32), progress=False)
    assert seen and not held_ids & set(seen)
    lines = [json.loads(x) for x in (tmp_path / "h" / "log.jsonl").read_text().splitlines()]
    held = [x for x in lines if "heldout_loss" in x]
    assert [x["step"] for x in held] == [3, 6, 7]
    assert all(np.isfinite(x["heldout_loss"]) and 0 <= x["heldout_tau"] <= 15 for x in held)
    with pytest.raises(TrainError, match="fit options"):
        fit(corpus, target, tmp_path / "h", FitOptions(**{**opts.__dict__, "holdout": 2, "max_steps": 9}),
            drafter_config(target, 1, 32), progress=False)


def test_fit_from_init_scores_the_starting_point(smoke, tmp_path):
    """--init-from with held-out sequences: the log holds the source's held-out score at step 0 (before any
    step), then every eval_every steps; with lr 0 both scores are the same weights' (the step-0 one is real)."""
    from tfm_local.train.fit import fit

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    opts = FitOptions(**{**_opts(3).__dict__, "holdout": 3, "eval_every": 3, "lr": 0.0})
    fit(corpus, target, tmp_path / "w", opts, None, progress=False, init_from=smoke.paths["hf"])
    lines = [json.loads(x) for x in (tmp_path / "w" / "log.jsonl").read_text().splitlines()]
    held = [x for x in lines if "heldout_loss" in x]
    assert [x["step"] for x in held] == [0, 3]
    assert held[0]["heldout_loss"] == pytest.approx(held[1]["heldout_loss"], rel=1e-5)  # lr 0: unchanged


def test_fit_emphasis_repeats_named_training_sequences_never_held_out_ones(smoke, tmp_path, monkeypatch):
    """--emphasis naming every prompt with --emphasis-times 3: each training sequence is planned three
    times per epoch, the held-out ones still never; the log's first line counts them; resuming without
    the emphasis is refused (the plan would differ)."""
    from tfm_local.train import fit as fit_mod
    from tfm_local.train.corpus import read_manifest
    from tfm_local.train.emphasis import save_emphasis
    from tfm_local.train.fit import fit, prompt_order
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    seqs = _sequences_of(corpus)
    path = save_emphasis(tmp_path / "e.npz", np.array([s.prompt_index for s in seqs]),
                         prompt_order(read_manifest(corpus)), "all")
    opts = FitOptions(**{**_opts(4).__dict__, "holdout": 3, "eval_every": 4, "emphasis": str(path),
                         "emphasis_times": 3})
    held = {tuple(s.ids) for s in seqs[-3:]}
    planned = []
    real = fit_mod.plan_batches
    monkeypatch.setattr(fit_mod, "plan_batches", lambda lengths, *a: planned.append(len(lengths)) or real(lengths, *a))
    seen, real_batch = [], fit_mod.make_batch
    monkeypatch.setattr(fit_mod, "make_batch", lambda b, *a: seen.extend(tuple(s.ids) for s in b) or real_batch(b, *a))
    fit(corpus, target, tmp_path / "e", opts, drafter_config(target, 1, 32), progress=False)
    first = json.loads((tmp_path / "e" / "log.jsonl").read_text().splitlines()[0])
    n_train = first["sequences"] // 3
    assert first["emphasised"] == n_train > 0 and set(planned) == {3 * n_train}
    assert seen and not held & set(seen)
    with pytest.raises(TrainError, match="fit options: emphasis file"):
        fit(corpus, target, tmp_path / "e", FitOptions(**{**opts.__dict__, "emphasis": None, "max_steps": 6}),
            drafter_config(target, 1, 32), progress=False)
    # the file is compared by its contents: another spelling of it resumes, other ranks under its name do not
    monkeypatch.chdir(tmp_path)
    fit(corpus, target, tmp_path / "e", FitOptions(**{**opts.__dict__, "emphasis": "./e.npz", "max_steps": 5}),
        drafter_config(target, 1, 32), progress=False)
    assert load_checkpoint(tmp_path / "e" / "checkpoint.pt")["step"] == 5
    save_emphasis(path, np.array([seqs[0].prompt_index]), prompt_order(read_manifest(corpus)), "one")
    with pytest.raises(TrainError, match="emphasis file"):
        fit(corpus, target, tmp_path / "e", FitOptions(**{**opts.__dict__, "max_steps": 6}),
            drafter_config(target, 1, 32), progress=False)


def test_fit_on_several_corpora(smoke, tmp_path):
    """--corpus A B trains on both (here the smoke corpus and a copy recorded as another prompt order);
    the same corpus twice is refused (its prompts would count twice); the run is tied to that list:
    resuming with one of them is refused."""
    import shutil

    from tfm_local.train.fit import fit, load_corpora
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    other = shutil.copytree(corpus, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["selection"]["seed"] = 12345
    (other / "manifest.json").write_text(json.dumps(manifest))
    ident = corpus_mod.target_identity(target)
    one_id, one = load_corpora(corpus, ident)
    two_id, two = load_corpora([corpus, other], ident)
    assert len(two) == 2 * len(one) and two_id != one_id and load_corpora([corpus], ident)[0] == one_id
    with pytest.raises(TrainError, match="trained on twice"):
        load_corpora([corpus, corpus], ident)
    fit([corpus, other], target, tmp_path / "m", _opts(2), drafter_config(target, 1, 32), progress=False)
    assert load_checkpoint(tmp_path / "m" / "checkpoint.pt")["corpus_id"] == two_id
    with pytest.raises(TrainError, match="another target or corpus"):
        fit(corpus, target, tmp_path / "m", _opts(3), drafter_config(target, 1, 32), progress=False)


def _sequences_of(corpus):
    from tfm_local.train.batching import usable
    from tfm_local.train.corpus import load_corpus

    seqs = load_corpus(corpus)[1]
    return [seqs[i] for i in usable(seqs, 256)]


def test_time_budget_shortens_the_schedule(smoke, tmp_path, monkeypatch):
    """With a fake clock of 1 s per step and a 60 s budget, the fit stops near 0.97 × 60 steps."""
    from tfm_local.train import fit as fit_mod
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    _fake_clock(monkeypatch, fit_mod, lambda n: 1.0)
    opts = FitOptions(**{**_opts(None).__dict__, "epochs": 400, "time_budget_s": 60.0})
    fit(corpus, target, tmp_path / "r", opts, drafter_config(target, 1, 32), progress=False)
    step = load_checkpoint(tmp_path / "r" / "checkpoint.pt")["step"]
    assert 55 <= step <= 59, step


def _fake_clock(monkeypatch, fit_mod, seconds_per_step):
    """Make ``time.time`` a clock that advances only inside ``block_loss``, by ``seconds_per_step(n)`` at call n."""
    clock, calls = [1000.0], [0]
    real = fit_mod.block_loss

    def timed(*a, **k):
        clock[0] += seconds_per_step(calls[0])
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(fit_mod, "block_loss", timed)
    monkeypatch.setattr(fit_mod.time, "time", lambda: clock[0])
    return clock


def test_time_budget_follows_a_step_time_that_changes(smoke, tmp_path, monkeypatch):
    """Slow first steps (3 s for 60 steps, then 1 s): the re-fitted schedule still ends close to the budget.

    A single estimate from the first steps would stop after ~130 steps (62% of the budget).
    """
    from tfm_local.train import fit as fit_mod
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    _fake_clock(monkeypatch, fit_mod, lambda n: 3.0 if n < 60 else 1.0)
    opts = FitOptions(**{**_opts(None).__dict__, "epochs": 400, "save_every": 1000, "log_every": 10,
                         "time_budget_s": 400.0})
    fit(corpus, target, tmp_path / "r", opts, drafter_config(target, 1, 32), progress=False)
    step = load_checkpoint(tmp_path / "r" / "checkpoint.pt")["step"]
    used = 60 * 3.0 + (step - 60) * 1.0
    assert 0.93 * 400 <= used <= 0.97 * 400, (step, used)
    log = [json.loads(x) for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == log[-1]["total"] == step


# -- fit over several processes (torchrun, gloo) ----------------------------------------------

_DP_ARGS = ["--layers", "1", "--ffn", "32", "--epochs", "50", "--lr", "3e-3", "--warmup", "0.05",
            "--batch-tokens", "512", "--anchors", "4", "--max-len", "256", "--save-every", "3", "--log-every", "1",
            "--holdout", "3", "--eval-every", "4", "--device", "cpu", "--no-export"]


def _dp_opts(steps):
    """The FitOptions of ``_DP_ARGS`` with ``--max-steps steps`` (15 training batches an epoch on the smoke corpus)."""
    return FitOptions(**{**_opts(steps).__dict__, "batch_tokens": 512, "holdout": 3, "eval_every": 4})


def _torchrun(smoke, out, *args, clock="none"):
    """``tfm-train fit`` with ``_DP_ARGS`` + ``args`` on the smoke corpus in 2 processes (torchrun, gloo) through
    tests/torchrun_fit.py, into ``out/run``; returns (each rank's dump: step, total, model; the stdout)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    corpus = smoke.paths["checkpoint"].parents[1] / "corpus"
    (out / "dump").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).with_name("torchrun_fit.py")), str(out / "dump"), clock, "fit", "--corpus", str(corpus),
           "--target", str(smoke.paths["target"]), "--out", str(out / "run"), *_DP_ARGS, *args]
    r = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).parents[1], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [torch.load(out / "dump" / f"rank-{i}.pt") for i in range(2)], r.stdout


@pytest.fixture(scope="module")
def dp_run(smoke, tmp_path_factory):
    """9 steps of a fit in 2 processes (held-out set, a checkpoint every 3 steps): (run folder, rank dumps, stdout)."""
    out = tmp_path_factory.mktemp("dp")
    ranks, stdout = _torchrun(smoke, out, "--max-steps", "9")
    return out / "run", ranks, stdout


def _log_of(run):
    return [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]


def test_steps_of_two_processes_split_the_batches_of_single_steps(smoke, tmp_path):
    """An epoch of 15 plan batches in steps of 2: 8 steps, the last of one batch (rank 1 gets none); rank r takes
    the r-th batch of a step, and the ranks' batches, anchors included, are those of one batch a step, in order."""
    from tfm_local.train.fit import _Run
    from tfm_local.train.warmstart import drafter_config
    from tfm_local.train.parallel import Comm

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    opts = FitOptions(**{**_dp_opts(None).__dict__, "epochs": 2})
    run = lambda rank, world: _Run(corpus, target, tmp_path, opts, drafter_config(target, 1, 32),  # noqa: E731
                                   Comm(torch.device("cpu"), rank, world))
    single, ranks = run(0, 1), [run(0, 2), run(1, 2)]
    assert single.total == 30 and ranks[0].total == ranks[1].total == 16
    steps = [list(r.steps()) for r in ranks]
    assert [n for _, _, n in steps[0]] == [n for _, _, n in steps[1]] == 2 * ([2] * 7 + [1])
    assert [len(mine) for _, mine, _ in steps[1]] == 2 * ([1] * 7 + [0])
    split = [b for s0, s1 in zip(*steps) for b in s0[1] + s1[1]]
    flat = [mine[0] for _, mine, _ in single.steps()]
    assert len(split) == len(flat) == 30
    for a, b in zip(split, flat):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


def test_fit_in_two_processes_equals_one_process_averaging_two_batches(smoke, dp_run, tmp_path):
    """9 steps in 2 processes (step 8 has one batch: rank 1 adds zero gradients) give the weights, losses and
    held-out numbers of one process that averages the gradients of the same 2 batches a step (accumulate=2)."""
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    run, _, _ = dp_run
    ref = load_checkpoint(fit(corpus, target, tmp_path / "ref", _dp_opts(9), drafter_config(target, 1, 32),
                              progress=False, accumulate=2))
    got = load_checkpoint(run / "checkpoint.pt")
    assert got["step"] == ref["step"] == 9 and (got["world_size"], got["batches_per_step"]) == (2, 2)
    for k in ref["model"]:
        torch.testing.assert_close(got["model"][k], ref["model"][k], rtol=0, atol=1e-5)
    log, ref_log = _log_of(run), _log_of(tmp_path / "ref")
    assert [sorted(x) for x in log] == [sorted(x) for x in ref_log]
    for a, b in zip(log, ref_log):
        for k in set(a) - {"elapsed_s"}:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a, b)


def test_fit_in_two_processes_keeps_the_ranks_in_step_and_rank_0_writes(dp_run):
    """Both ranks end at step 9 with the same weights, the checkpoint's; the log (rank 0 alone) counts global
    steps, each once; rank 0 alone reports the checkpoint."""
    run, ranks, stdout = dp_run
    assert [(r["step"], r["total"]) for r in ranks] == [(9, 9), (9, 9)]
    ckpt = load_checkpoint(run / "checkpoint.pt")
    for k, v in ckpt["model"].items():
        assert torch.equal(ranks[0]["model"][k], v) and torch.equal(ranks[1]["model"][k], v)
    log = _log_of(run)
    assert [x["step"] for x in log if "loss" in x] == list(range(1, 10))
    assert [x["step"] for x in log if "heldout_loss" in x] == [4, 8, 9]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "log.jsonl"]
    assert stdout.count("checkpoint: ") == 1


def test_time_budget_of_rank_0_stops_every_rank_at_the_same_step(smoke, tmp_path):
    """Fake clocks of 1 s a step on rank 0 and 5 s on rank 1, a 1-minute budget: rank 0 re-fits the step total
    and every rank follows it, so both stop where one process with rank 0's clock would (55..59 steps)."""
    ranks, _ = _torchrun(smoke, tmp_path, "--time-budget", "1", "--save-every", "1000", "--log-every", "10",
                         clock="1,5")
    step = ranks[0]["step"]
    assert 55 <= step <= 59 and [(r["step"], r["total"]) for r in ranks] == [(step, step)] * 2
    assert _log_of(tmp_path / "run")[-1]["step"] == load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == step


def test_resuming_a_two_process_checkpoint_in_one_process_is_refused(smoke, dp_run, tmp_path):
    """A checkpoint of 2 processes resumed by 1 would number its steps otherwise: refused, naming the torchrun
    command; one process taking 2 batches a step (accumulate=2) takes the same steps and may resume it."""
    import shutil

    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    run = shutil.copytree(dp_run[0], tmp_path / "run")
    with pytest.raises(TrainError, match=r"2 batches per step \(2 processes\).*--nproc_per_node 2"):
        fit(corpus, target, run, _dp_opts(12), drafter_config(target, 1, 32), progress=False)
    fit(corpus, target, run, _dp_opts(12), drafter_config(target, 1, 32), progress=False, accumulate=2)
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 12


def _source_tensors(path):
    """The drafter tensors of a z-lab folder or a checkpoint, float32 torch."""
    from tfm_convert.zlab import index_tensors

    from tfm_local.train.warmstart import load_init_source

    if path.is_dir():
        return {k: torch.from_numpy(t.load()) for k, t in index_tensors(path).items()}
    return load_init_source(path).state


def test_init_from_starts_with_the_source_weights(smoke, tmp_path):
    """F32 and BF16 z-lab folders and a checkpoint: step-0 weights equal the source's; path and sha256 recorded."""
    import hashlib

    from tfm_convert.zlab import read_config, write_checkpoint
    from tfm_local.train.fit import fit

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    hf = smoke.paths["hf"]
    bf16 = write_checkpoint(tmp_path / "bf16", read_config(hf),
                            {k: v.numpy() for k, v in _source_tensors(hf).items()}, "BF16")
    for i, (src, weights) in enumerate([(hf, hf / "model.safetensors"), (bf16, bf16 / "model.safetensors"),
                                        (smoke.paths["checkpoint"], smoke.paths["checkpoint"])]):
        out = tmp_path / f"run{i}"
        fit(corpus, target, out, _opts(0), None, progress=False, init_from=src)
        ck = load_checkpoint(out / "checkpoint.pt")
        want = _source_tensors(src)
        assert ck["step"] == 0 and sorted(ck["model"]) == sorted(want)
        for k in want:
            assert torch.equal(ck["model"][k], want[k]), k
        sha = hashlib.sha256(weights.read_bytes()).hexdigest()
        assert ck["init_from"]["sha256"] == sha and ck["init_from"]["path"] == str(src.resolve())
        first = json.loads((out / "log.jsonl").read_text().splitlines()[0])
        assert first["init_from"] == ck["init_from"]


def test_init_from_lowers_the_first_loss_and_resumes(smoke, tmp_path):
    """Step 1 from the trained smoke drafter has a lower loss than from a fresh init of the same shape;
    --init-from given again on resume is ignored (even a path that no longer exists) and is no changed option."""
    from tfm_local.train.fit import config_from_dict, fit
    from tfm_local.train.warmstart import ShapeRequest

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    config = config_from_dict(load_checkpoint(smoke.paths["checkpoint"])["config"])
    fit(corpus, target, tmp_path / "fresh", _opts(1), config, progress=False)
    fit(corpus, target, tmp_path / "warm", _opts(1), None, progress=False, init_from=smoke.paths["hf"])
    loss = {}
    for name in ("fresh", "warm"):
        lines = [json.loads(x) for x in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        loss[name] = [x for x in lines if x.get("step") == 1][0]["loss"]
    assert loss["warm"] < 0.8 * loss["fresh"], loss
    record = load_checkpoint(tmp_path / "warm" / "checkpoint.pt")["init_from"]
    fit(corpus, target, tmp_path / "warm", _opts(3), None, progress=False, init_from=tmp_path / "gone",
        shape=ShapeRequest(layers=config.num_hidden_layers))
    ck = load_checkpoint(tmp_path / "warm" / "checkpoint.pt")
    assert ck["step"] == 3 and ck["init_from"] == record
    with pytest.raises(TrainError, match="another shape"):
        fit(corpus, target, tmp_path / "warm", _opts(4), None, progress=False, init_from=smoke.paths["hf"],
            shape=ShapeRequest(ffn=config.intermediate_size + 1))
    with pytest.raises(TrainError, match="another shape.*--layers 2"):
        fit(corpus, target, tmp_path / "new", _opts(1), None, progress=False, init_from=smoke.paths["hf"],
            shape=ShapeRequest(layers=2))
    with pytest.raises(FileNotFoundError):
        fit(corpus, target, tmp_path / "new", _opts(1), None, progress=False, init_from=tmp_path / "gone")


def test_init_from_a_drafter_gguf(smoke, tmp_path):
    """F32 GGUF: the exported weights exactly; q8_0: within its step; without vocabulary: the
    target's size; a wrong file is a clear error, never a traceback from deep inside."""
    from tfm_convert.read_drafter import read_drafter_gguf
    from tfm_convert.vocab import strip_vocab
    from tfm_convert.zlab import read_config
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import load_init_source

    target, want = smoke.paths["target"], _source_tensors(smoke.paths["hf"])
    hf_config = read_config(smoke.paths["hf"])
    f32 = load_init_source(smoke.paths["f32"], target)
    assert f32.record["kind"] == "gguf" and sorted(f32.state) == sorted(want)
    assert f32.config.target_layer_ids == hf_config.target_layer_ids
    assert f32.config.mask_token_id == hf_config.mask_token_id
    for k in want:
        assert torch.equal(f32.state[k], want[k]), k
    q8 = load_init_source(smoke.paths["q8_0"], target).state
    for k in want:
        step = want[k].abs().amax() / 127 if want[k].ndim > 1 else 0
        assert (q8[k] - want[k]).abs().max() <= step + 1e-7, k
    bare = strip_vocab(smoke.paths["q8_0"], tmp_path / "bare.gguf")
    assert load_init_source(bare, target).config.vocab_size == hf_config.vocab_size
    with pytest.raises(ConvertError, match="no vocabulary"):
        read_drafter_gguf(bare)
    with pytest.raises(TrainError, match="not a DFlash drafter"):
        load_init_source(target, target)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smoke.paths["f32"].read_bytes()[:-100])
    with pytest.raises(TrainError, match="truncated or corrupt"):
        load_init_source(cut, target)
    corpus = smoke.paths["checkpoint"].parents[1] / "corpus"
    fit(corpus, target, tmp_path / "run", _opts(0), None, progress=False, init_from=bare)
    ck = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ck["init_from"]["kind"] == "gguf" and ck["step"] == 0


def test_init_from_refuses_a_drafter_of_another_target(smoke, tmp_path):
    from tfm_local.train.warmstart import load_init_source

    other = synth.write_tiny_target(tmp_path / "wide.gguf", n_embd=96, n_head=4, n_head_kv=2)
    with pytest.raises(TrainError, match="hidden size"):
        load_init_source(smoke.paths["hf"], other)
    assert load_init_source(smoke.paths["hf"], smoke.paths["target"]).config.num_hidden_layers == 1


def test_cli_init_from_with_another_layer_count_is_a_clear_error(smoke, tmp_path, capsys):
    from tfm_local.cli.train import main

    corpus = str(smoke.paths["checkpoint"].parents[1] / "corpus")
    with pytest.raises(SystemExit) as e:
        main(["fit", "--corpus", corpus, "--target", str(smoke.paths["target"]), "--out", str(tmp_path / "run"),
              "--init-from", str(smoke.paths["hf"]), "--layers", "3", "--device", "cpu", "--no-export"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--layers 3 (drafter: 1)" in err and "Traceback" not in err


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    save_checkpoint(tmp_path / "c.pt", {"step": 3, "model": {"w": torch.ones(4)}})
    assert load_checkpoint(tmp_path / "c.pt")["step"] == 3
    data = (tmp_path / "c.pt").read_bytes()
    (tmp_path / "c.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptArtifactError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "c.pt")
    torch.save({"something": "else"}, tmp_path / "d.pt")
    with pytest.raises(CorruptArtifactError, match="not a tfm-train checkpoint"):
        load_checkpoint(tmp_path / "d.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "none.pt")


# -- CLI --------------------------------------------------------------------------------

def test_cli_parity_export_and_errors(smoke, tmp_path, capsys):
    from tfm_local.cli.train import main

    corpus = str(smoke.paths["checkpoint"].parents[1] / "corpus")
    main(["parity", "--drafter", str(smoke.paths["f32"]), "--weights", str(smoke.paths["hf"]),
          "--target", str(smoke.paths["target"]), "--corpus", corpus, "--n-seqs", "1", "--threads", "1"])
    assert "top-1 agreement" in capsys.readouterr().out
    main(["export", "--checkpoint", str(smoke.paths["checkpoint"]), "--target", str(smoke.paths["target"]),
          "--out", str(tmp_path / "exp"), "--outtype", "q8_0"])
    assert (tmp_path / "exp" / "drafter-q8_0.gguf").is_file()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--corpus", str(tmp_path / "nothing"), "--target", str(smoke.paths["target"]),
              "--out", str(tmp_path / "run")])
    assert e.value.code == 2 and "not a corpus folder" in capsys.readouterr().err


def _head_runs(soft_weight: float):
    """A random LM head problem run in one chunk and in chunks of 5: (head, h, ht, labels, w, results),
    results = [(total, hits, grad of h)] per chunking; ht (the target's states) only with soft_weight > 0."""
    from tfm_local.train.recipe import _chunked_head_loss

    g = torch.Generator().manual_seed(0)
    head = torch.randn(50, 8, generator=g)
    h = torch.randn(23, 8, generator=g, requires_grad=True)
    ht = torch.randn(23, 8, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (23,), generator=g)
    w = torch.rand(23, generator=g)
    soft = (ht, torch.full((23,), soft_weight)) if soft_weight > 0 else None
    results = []
    for chunk in (1000, 5):
        h.grad = None
        total, hits = _chunked_head_loss(lambda x: x @ head.T, h, labels, w, autocast=False, chunk=chunk, soft=soft)
        total.backward()
        results.append((total.detach(), hits, h.grad.clone()))
    (t1, k1, g1), (t2, k2, g2) = results
    torch.testing.assert_close(t1, t2)
    assert torch.equal(k1, k2) and k1.dtype == torch.bool and k1.shape == (23,)
    torch.testing.assert_close(g1, g2)
    return head, h.detach(), ht, labels, w, t1


def test_chunked_head_loss_equals_one_shot_loss_and_gradient():
    """Checkpointed chunks of the LM head give the loss, hits and input gradient of one big chunk."""
    head, h, _, labels, w, total = _head_runs(0.0)
    ref = (torch.nn.functional.cross_entropy(h @ head.T, labels, reduction="none") * w).sum()
    torch.testing.assert_close(total, ref)


def test_soft_targets_chunked_equal_one_shot_and_reference():
    """The distillation mix: (1-a) CE(label) + a CE(softmax(target logits)), chunked = one shot, and
    no gradient flows into the target's hidden states."""
    head, h, ht, labels, w, total = _head_runs(0.3)
    assert ht.grad is None
    logp = torch.log_softmax(h @ head.T, -1)
    p_t = torch.softmax(ht.detach() @ head.T, -1)
    ref = ((0.7 * torch.nn.functional.nll_loss(logp, labels, reduction="none") - 0.3 * (p_t * logp).sum(-1)) * w).sum()
    torch.testing.assert_close(total, ref)


def test_soft_targets_read_the_state_before_each_label(smoke, monkeypatch):
    """block_loss gives the distillation term, for the label at position p = anchor + k, the target's
    final state at p - 1 (the one whose logits predict token p), on random token ids (the smoke
    corpus repeats itself too much for an off-by-one to show in the labels)."""
    from tfm_local.train import recipe
    from tfm_local.train.batching import make_batch
    from tfm_local.train.checks import load_torch_drafter
    from tfm_local.train.corpus import Sequence
    from tfm_local.train.target_torch import TorchTarget

    drafter = load_torch_drafter(smoke.paths["checkpoint"])
    target = TorchTarget(smoke.paths["target"])
    rng = np.random.default_rng(5)
    seqs = [Sequence(rng.integers(3, 200, size=n).astype(np.int32), 4, i) for i, n in enumerate((40, 55, 31))]
    b = make_batch(seqs, 4, 16, drafter.config.mask_token_id, 256, rng)
    seen = {}
    real = recipe._chunked_head_loss

    def spy(lm_head, h, labels, w, autocast, chunk=recipe.HEAD_CHUNK, soft=None):
        seen["rows"], seen["labels"] = soft[0], labels
        return real(lm_head, h, labels, w, autocast, chunk, soft)

    monkeypatch.setattr(recipe, "_chunked_head_loss", spy)
    recipe.block_loss(drafter, target, b, recipe.position_weights(16, 7.0), 16, False, soft_weight=0.5)
    _, final = target.layer_inputs_and_final(b.ids, drafter.feature_layers)
    want = [final[i, b.anchors[i, a] + k - 1] for i in range(len(seqs)) for a in range(4) for k in range(16)
            if b.labels[i, a * 16 + k] != IGNORE]
    assert torch.equal(seen["labels"], b.labels[b.labels != IGNORE])
    torch.testing.assert_close(seen["rows"], torch.stack(want))
    with pytest.raises(TrainError, match="need all"):
        TorchTarget(smoke.paths["target"], n_layers=1).layer_inputs_and_final(b.ids, [1])


def test_fit_with_soft_targets_learns(smoke, tmp_path):
    """--soft-weight: the fit loads the whole target, runs, and its loss falls."""
    import dataclasses

    from tfm_local.train.fit import config_from_dict, fit

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    config = config_from_dict(load_checkpoint(smoke.paths["checkpoint"])["config"])
    fit(corpus, target, tmp_path / "s", dataclasses.replace(_opts(30), soft_weight=0.5), config, progress=False)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "s" / "log.jsonl").read_text().splitlines() if "loss" in x]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5])


def test_grow_layers_starts_as_the_source_and_trains_the_new_layer(smoke, tmp_path):
    """--grow-layers 2 from the 1-layer smoke drafter: layer 0 is the source's, layer 1's output projections
    are zero, so the first step's loss equals the plain warm start's; training then opens layer 1; growing
    to as many layers as the source has, or without a source, is a clear error."""
    from tfm_local.train.fit import fit

    target, corpus, hf = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus", smoke.paths["hf"]
    fit(corpus, target, tmp_path / "grown0", _opts(0), None, progress=False, init_from=hf, grow=2)
    ck = load_checkpoint(tmp_path / "grown0" / "checkpoint.pt")
    src = _source_tensors(hf)
    assert ck["config"]["num_hidden_layers"] == 2 and ck["init_from"]["grown_from_layers"] == 1
    for k, v in src.items():
        assert torch.equal(ck["model"][k], v), k
    for k in ("layers.1.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"):
        assert not ck["model"][k].any(), k
    assert ck["model"]["layers.1.self_attn.q_proj.weight"].abs().sum() > 0  # the model's own init, not zeros
    loss = {}
    for name, grow in (("warm", None), ("grown", 2)):
        fit(corpus, target, tmp_path / name, _opts(3), None, progress=False, init_from=hf, grow=grow)
        lines = [json.loads(x) for x in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        loss[name] = [x for x in lines if x.get("step") == 1][0]["loss"]
    assert loss["grown"] == pytest.approx(loss["warm"], rel=1e-5), loss
    trained = load_checkpoint(tmp_path / "grown" / "checkpoint.pt")["model"]
    assert trained["layers.1.self_attn.o_proj.weight"].abs().sum() > 0
    with pytest.raises(TrainError, match="has 1 layers already"):
        fit(corpus, target, tmp_path / "bad", _opts(0), None, progress=False, init_from=hf, grow=1)
    with pytest.raises(TrainError, match="needs the drafter to grow"):
        fit(corpus, target, tmp_path / "bad2", _opts(0), None, progress=False, grow=2)
    ckpt = tmp_path / "grown" / "checkpoint.pt"
    with pytest.raises(TrainError, match="holds a 2-layer drafter"):
        fit(corpus, target, tmp_path / "grown", _opts(4), None, progress=False, init_from=hf, grow=3)
    with pytest.raises(TrainError, match="has 1 layers already"):  # --restart with a bad option keeps the run
        fit(corpus, target, tmp_path / "grown", _opts(4), None, progress=False, init_from=hf, grow=1, restart=True)
    assert load_checkpoint(ckpt)["step"] == 3


def test_llama_backend_samples_per_prompt_seed(tmp_path):
    """LlamaBackend at T > 0: each prompt is seeded by (seed, its rank): the same ranks give the same
    responses, in any shard; other ranks give others; sampled responses differ from greedy ones."""
    from tfm_local.train.generate import LlamaBackend

    target = synth.write_tiny_target(tmp_path / "t.gguf", n_layer=2, seed=4)
    prompts = [np.array([5 + i, 9, 2 * i + 1], dtype=np.int32) for i in range(4)]
    greedy = LlamaBackend(target, n_ctx=128, n_gpu_layers=0, n_threads=1)
    sampler = LlamaBackend(target, n_ctx=128, n_gpu_layers=0, n_threads=1, temperature=1.0, seed=3)
    try:
        g = greedy.generate(prompts, 16)
        ranks = [10, 11, 13, 14]  # rank 12 skipped (too long, say)
        a, b = sampler.generate(prompts, 16, ranks), sampler.generate(prompts, 16, ranks)
        assert a == b and a != g
        assert sampler.generate(prompts, 16, [r + 100 for r in ranks]) != a
        assert sampler.generate(prompts[2:], 16, ranks[2:]) == a[2:]  # another shard, the same ranks
    finally:
        greedy.close()
        sampler.close()


@pytest.mark.parametrize("name, msg", [("gpu", "must be auto, cpu, cuda or cuda:N"),
                                       ("cuda:x", "must be auto, cpu, cuda or cuda:N")])
def test_cli_device_name_is_checked(name, msg, capsys):
    from tfm_local.cli.train import _device

    with pytest.raises(SystemExit) as e:
        _device(name)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_cli_device_cuda_without_a_gpu_is_a_clear_error(capsys):
    import torch

    from tfm_local.cli.train import _device

    if torch.cuda.is_available():
        assert _device("cuda") == "cuda" and _device("auto") == "cuda"
        return
    assert _device("auto") == "cpu" and _device("cpu") == "cpu"
    for name in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit) as e:
            _device(name)
        assert e.value.code == 2 and "sees no CUDA GPU" in capsys.readouterr().err


def test_dflash2_warm_start_trains_the_selector_and_exports(smoke, tmp_path):
    """--dflash2 --init-from the smoke's DFlash drafter: at step 0 the DFlash weights, identity
    convolutions and zero successor codes (the same drafts); training lowers the selector's loss on a
    fixed batch; the export converts to a DFlash2 GGUF whose lattice matches the PyTorch model."""
    from tfm_local.train.checks import lattice_parity, load_torch_drafter
    from tfm_local.train.export import export
    from tfm_local.train.fit import fit
    from tfm_local.train.recipe import selector_loss
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.warmstart import ShapeRequest
    from tfm_local.train.smoke import _sequences

    target, corpus = smoke.paths["target"], smoke.paths["checkpoint"].parents[1] / "corpus"
    shape = ShapeRequest(dflash2=True)
    fit(corpus, target, tmp_path / "s0", _opts(0), None, progress=False, init_from=smoke.paths["hf"], shape=shape)
    ck0 = load_checkpoint(tmp_path / "s0" / "checkpoint.pt")
    src = _source_tensors(smoke.paths["hf"])
    assert all(torch.equal(ck0["model"][k], v) for k, v in src.items())
    base = ck0["model"]["layers.0.attention_conv.base_kernel"]
    assert torch.equal(base[:, 0], torch.ones_like(base[:, 0])) and not base[:, 1:].any()
    assert not ck0["model"]["layers.0.mlp_conv.kernel_projection.weight"].any()
    assert not ck0["model"]["candidate_selector.successor_codebook"].any()

    ckpt = fit(corpus, target, tmp_path / "s1", _opts(100), None, progress=False, init_from=smoke.paths["hf"],
               shape=shape)
    seqs = _sequences(corpus, 3)
    tt = TorchTarget(target, n_layers=None)
    responses = [(torch.tensor(q.ids.tolist())[None], q.prompt_len) for q in load_corpus(corpus)[1][:6]]

    def sel_loss(path, pair=True):
        """The selector's loss over blocks anchored in the responses (teacher-forced predecessors);
        ``pair=False``: with zero successor codes (the drafter's logits alone)."""
        model = load_torch_drafter(path)
        if not pair:
            with torch.no_grad():
                model.candidate_selector.successor_codebook.zero_()
        S, total, n = model.config.block_size, 0.0, 0
        for ids, p0 in responses:
            L = ids.shape[1]
            if L - S - p0 < 8:
                continue
            anchors = torch.arange(p0, L - S, max(1, (L - S - p0) // 6))[None, :6]
            noise = torch.full((1, anchors.shape[1] * S), model.config.mask_token_id)
            noise_pos = (anchors[0, :, None] + torch.arange(S)).reshape(1, -1)
            noise[0, ::S] = ids[0, anchors[0]]
            with torch.no_grad():
                h = model(tt.layer_inputs(ids, model.feature_layers).float(), torch.arange(L),
                          tt.embed(noise).float(), noise_pos, block_mask(anchors, L, S))[0]
                keep = torch.ones(h.shape[0], dtype=torch.bool)
                keep[::S] = False  # the anchors
                labels, prev = ids[0, noise_pos[0][keep]], ids[0, noise_pos[0][keep] - 1]
                loss = selector_loss(model, tt.lm_head, h[keep], prev, labels, torch.ones(int(keep.sum())), False)[0]
            total, n = total + loss.item(), n + 1
        assert n >= 3
        return total / n

    assert sel_loss(tmp_path / "s0" / "checkpoint.pt") == sel_loss(tmp_path / "s0" / "checkpoint.pt", pair=False)
    with_pair, alone = sel_loss(ckpt), sel_loss(ckpt, pair=False)
    assert with_pair < 0.9 * alone, (with_pair, alone)
    paths = export(ckpt, target, tmp_path / "export", ("f32",))
    cfg = json.loads((paths["hf"] / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    rows, err, n = lattice_parity(paths["f32"], load_torch_drafter(ckpt), target, seqs[:1], n_points=3, threads=1)
    # the score bound is the property; best successors may flip at near-ties with the CPU's kernels
    # (test_dflash2.py::test_pytorch_dflash2_matches_the_gguf_in_llama_cpp says why): 0.9 of 45 rows
    assert n == 3 * 15 and rows >= 0.9 and err < 1e-2
