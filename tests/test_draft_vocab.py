"""A reduced draft vocabulary (tfm_convert.draft_vocab, drafters.apply_draft_vocab) on tiny synthetic GGUFs.

A reduced drafter computes its LM head over the draft ids only (``d2t`` + its own ``output.weight``,
the target head's rows) and llama.cpp scatters the logits into a full row of -inf: on the kept ids
they must equal the full drafter's, elsewhere be -inf; the engine's output stays the target's own.
"""
import subprocess
import sys

import gguf
import numpy as np
import pytest

from tfm_convert.draft_vocab import (always_ids, check_draft_ids, choose_draft_ids, coverage, draft_vocab_size,
                                     head_rows, lm_head, reduce_drafter, token_counts)
from tfm_convert.errors import ConvertError
from tfm_local.files.gguf_meta import dequantize_tensor, read_gguf_meta
from tfm_convert.vocab import NewTensor, attach_vocab, rewrite_gguf, strip_vocab
from tfm_local.decode.draft import DFlashDrafter, top_k_logprobs
from tfm_local.engine import Engine
from tfm_local.llama.model import gpu_available
from tfm_local.decode.sampling import SamplingParams
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target
from test_drafter_topk import advance

PROMPT = [11, 42, 7, 99, 3, 250, 18, 64, 5, 120, 77, 31]
QT = gguf.GGMLQuantizationType


def q8_head_target(plain, out):
    """``plain`` (tied F32 embeddings) plus an untied ``output.weight``: its embedding in Q8_0."""
    meta = read_gguf_meta(plain)
    emb = next(t for t in meta.tensors if t.name == "token_embd.weight")
    raw = np.frombuffer(plain.read_bytes(), np.uint8, count=emb.nbytes, offset=emb.begin)
    data = gguf.quants.quantize(dequantize_tensor(raw, emb), QT.Q8_0)
    return rewrite_gguf(plain, meta, list(meta.kv.values()), out,
                        extra=(NewTensor("output.weight", emb.ne, int(QT.Q8_0), data),))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("draft_vocab")
    target = write_tiny_target(d / "target.gguf", n_layer=3, n_embd=64, seed=7)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=5)
    ids = np.unique(np.concatenate([np.arange(0, 320, 3), always_ids(target)]))
    q8 = q8_head_target(target, d / "target-q8.gguf")
    return dict(dir=d, target=target, drafter=drafter, ids=ids, q8=q8,
                reduced=reduce_drafter(drafter, target, ids, d / "reduced.gguf"),
                reduced_q8=reduce_drafter(drafter, q8, ids, d / "reduced-q8.gguf"))


def run_pair(target, drafters, steps=(15, 4, 9, 15)):
    """Marginals of each drafter over a few draft / verify / inject cycles on one target."""
    tgt = Target(target, n_ctx=256, n_batch=64, n_threads=1)
    ds = [DFlashDrafter(p, tgt, n_threads=1) for p in drafters]
    try:
        tgt.prefill(PROMPT, lambda s, n: [d.inject(tgt.features(slice(0, n), n), s) for d in ds])
        out, last = [], int(PROMPT[-1])
        for i, n in enumerate(steps):
            pos = tgt.n_past
            rows = [np.array(d.marginals(last, pos, n)) for d in ds]
            out.append(rows)
            last = advance(tgt, ds, last, np.argmax(rows[0], axis=1), n_accept=i % 3)
        return out
    finally:
        for d in ds:
            d.close()
        tgt.close()


@pytest.mark.parametrize("head", ["tied-f32", "q8_0"])
def test_reduced_logits_equal_full_on_kept_ids_and_are_minus_inf_elsewhere(files, head):
    target, reduced = (files["target"], files["reduced"]) if head == "tied-f32" else (files["q8"], files["reduced_q8"])
    ids = files["ids"]
    off = np.setdiff1d(np.arange(320), ids)
    # on CUDA an f32 head goes through a matrix product whose kernel depends on the row count (320 rows
    # full, fewer reduced): the H200 gave up to 0.0087 apart on logits of size ~5; q8_0 and
    # the CPU agree to rounding
    tol = dict(rtol=0, atol=2e-2) if gpu_available() and head == "tied-f32" else dict(rtol=1e-5, atol=1e-4)
    for full, red in run_pair(target, [files["drafter"], reduced]):
        np.testing.assert_allclose(red[:, ids], full[:, ids], **tol)
        assert np.all(red[:, off] == -np.inf) and np.isfinite(red[:, ids]).all()


def test_the_reduced_head_is_the_targets_rows_byte_for_byte(files):
    for target, reduced in ((files["target"], files["reduced"]), (files["q8"], files["reduced_q8"])):
        head = lm_head(target)
        assert head.name == ("token_embd.weight" if target == files["target"] else "output.weight")
        meta = read_gguf_meta(reduced)
        t = {e.name: e for e in meta.tensors}
        data = reduced.read_bytes()
        assert t["output.weight"].ggml_type == head.ggml_type
        assert t["output.weight"].ne == (head.ne[0], files["ids"].size)
        out = t["output.weight"]
        assert data[out.begin:out.begin + out.nbytes] == head_rows(target, head, files["ids"]).tobytes()
        assert t["d2t"].ggml_type == int(QT.I64)
        np.testing.assert_array_equal(np.frombuffer(data, np.int64, files["ids"].size, t["d2t"].begin), files["ids"])
        assert draft_vocab_size(reduced) == files["ids"].size and draft_vocab_size(files["drafter"]) is None
    # dequantized: the Q8_0 rows are the rows of the dequantized head
    head = lm_head(files["q8"])
    full = dequantize_tensor(np.frombuffer(files["q8"].read_bytes(), np.uint8, head.nbytes, head.begin), head)
    rows = head_rows(files["q8"], head, files["ids"])
    part = gguf.quants.dequantize(rows, QT.Q8_0)
    np.testing.assert_array_equal(part, full[files["ids"]])


@pytest.mark.parametrize("k", [1, 8, 200])
def test_top_k_ids_come_from_the_draft_vocabulary(files, k):
    """Backend top-k and host top-k agree and only name draft ids (k <= K); past K the extra
    columns are -inf log-probs, never NaN."""
    ids = files["ids"]
    tgt = Target(files["target"], n_ctx=256, n_batch=64, n_threads=1)
    d = DFlashDrafter(files["reduced"], tgt, n_threads=1)
    try:
        tgt.prefill(PROMPT, lambda s, n: d.inject(tgt.features(slice(0, n), n), s))
        last, pos = int(PROMPT[-1]), tgt.n_past
        cand, logp = d.top_k(last, pos, 15, k)
        marg = np.array(d.marginals(last, pos, 15))
        hc, hl = top_k_logprobs(marg, k)
        assert not np.isnan(logp).any() and not np.isnan(hl).any()
        kk = min(k, ids.size)
        assert np.isin(cand[:, :kk], ids).all() and np.isin(hc[:, :kk], ids).all()
        np.testing.assert_allclose(logp[:, :kk], hl[:, :kk], atol=1e-4)
        assert np.all(logp[:, kk:] == -np.inf) and np.all(hl[:, kk:] == -np.inf)
        assert d.draft_chain(last, pos, 15) == [int(t) for t in np.argmax(marg, axis=1)]
    finally:
        d.close()
        tgt.close()


@pytest.fixture(scope="module")
def plain(files):
    e = Engine(files["target"], None, n_ctx=512)
    yield e
    e.close()


PROMPTS = ["hello world, this is a test", "<|im_start|>user\nthe quick brown fox<|im_end|>\n"]


@pytest.mark.parametrize("tree", ["chain", "ddtree"])
def test_engine_with_a_reduced_drafter_equals_plain_decoding(files, plain, tree):
    """Greedy: the target's own tokens. A tiny draft vocabulary (5 ids < tree_top_k 8) puts -inf
    candidates into the trees; sampling with a seed reads the same random stream as plain decoding."""
    tiny = reduce_drafter(files["drafter"], files["target"], [3, 10, 40, 41, 200], files["dir"] / "tiny.gguf")
    for drafter in (files["reduced"], tiny):
        e = Engine(files["target"], drafter, n_ctx=512, budget=None, tree=tree)
        try:
            for prompt in PROMPTS:
                ids = plain.prompt_tokens(prompt)
                greedy = SamplingParams()
                assert list(e.generate_ids(ids, 40, greedy)) == list(plain.generate_ids(ids, 40, greedy))
                assert e.stats.n_drafted > 0
            sp = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
            ids = plain.prompt_tokens(PROMPTS[0])
            assert list(e.generate_ids(ids, 32, sp)) == list(plain.generate_ids(ids, 32, sp))
        finally:
            e.close()


def test_auto_draft_vocabulary_is_the_full_one_where_the_drafter_runs_on_a_gpu(files, tmp_path, monkeypatch):
    """draft_vocab_on: "auto" becomes "full" on a GPU only. Engine: with a GPU reported (gpu_available
    patched to True: this CPU build has none; the offload request is then ignored by llama.cpp) the
    shipped ids are not applied, unless the model stays on the CPU (n_gpu_layers=0)."""
    from tfm_local.llama import model as llm
    from tfm_local.files.drafters import draft_vocab_on

    assert draft_vocab_on("auto", True) == "full" and draft_vocab_on("auto", False) == "auto"
    assert draft_vocab_on("full", False) == "full" and draft_vocab_on(tmp_path / "x.npy", True) == tmp_path / "x.npy"
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    bare = strip_vocab(files["drafter"], tmp_path / "d.novocab.gguf")
    np.save(tmp_path / "d.draft-vocab.npy", files["ids"].astype(np.int32))
    monkeypatch.setattr(llm, "gpu_available", lambda: True)
    for n_gpu_layers, size in ((-1, None), (0, files["ids"].size)):
        e = Engine(files["target"], bare, n_ctx=256, n_gpu_layers=n_gpu_layers, greedy_argmax="host")
        try:
            assert draft_vocab_size(e.drafter.model.path) == size
        finally:
            e.close()


def test_bad_draft_ids_give_clear_errors(files):
    d, t = files["drafter"], files["target"]
    cases = [([], "empty"), ([1, 2, 2], "unique; 2 appears"), ([5, 320], "320 is outside"), ([-1], "-1 is outside"),
             ([[1, 2]], "one-dimensional"), ([1.0, 2.0], "integers")]
    for ids, msg in cases:
        with pytest.raises(ConvertError, match=msg):
            reduce_drafter(d, t, np.array(ids), files["dir"] / "bad.gguf")
    assert not (files["dir"] / "bad.gguf").exists()
    with pytest.raises(ConvertError, match="not a DFlash drafter"):
        reduce_drafter(t, t, [1, 2], files["dir"] / "bad.gguf")
    np.testing.assert_array_equal(check_draft_ids([9, 1, 4], 10), [1, 4, 9])
    other = write_tiny_target(files["dir"] / "wide.gguf", n_layer=2, n_embd=96, seed=1)
    with pytest.raises(ConvertError, match="width"):
        reduce_drafter(d, other, [1, 2], files["dir"] / "bad.gguf")


def test_a_reduced_drafter_is_reduced_again_and_keeps_d2t_through_strip_and_attach(files):
    again = reduce_drafter(files["reduced"], files["target"], [1, 2, 3], files["dir"] / "again.gguf")
    assert draft_vocab_size(again) == 3
    bare = strip_vocab(files["reduced"], files["dir"] / "reduced.novocab.gguf")
    back = attach_vocab(bare, files["target"], files["dir"] / "back.gguf")
    table = [(t.name, t.ne, t.ggml_type, t.nbytes) for t in read_gguf_meta(files["reduced"]).tensors]
    assert [(t.name, t.ne, t.ggml_type, t.nbytes) for t in read_gguf_meta(back).tensors] == table
    assert draft_vocab_size(bare) == files["ids"].size


def test_choose_draft_ids_counts_ties_and_always_kept_ids():
    counts = np.array([5, 0, 7, 5, 1, 7, 0, 2])
    np.testing.assert_array_equal(choose_draft_ids(counts, 3), [0, 2, 5])  # 7, 7, then 5 at id 0 before id 3
    np.testing.assert_array_equal(choose_draft_ids(counts, 3, always=[6]), [2, 5, 6])
    np.testing.assert_array_equal(choose_draft_ids(counts, 8), np.arange(8))
    assert coverage(counts, [2, 5]) == pytest.approx(14 / 27)
    for k, always, msg in [(0, (), "1..8"), (9, (), "1..8"), (1, (1, 2), "smaller"), (2, (8,), "0..7")]:
        with pytest.raises(ConvertError, match=msg):
            choose_draft_ids(counts, k, always)


def test_always_ids_are_the_special_and_chat_template_tokens(files):
    from tfm_convert.target_info import read_target_info

    info = read_target_info(files["target"])
    got = set(always_ids(files["target"]).tolist())
    assert info.special_ids <= got
    toks = next(e for e in info.tokenizer if e.key == "tokenizer.ggml.tokens").value
    names = {toks[i].decode() if isinstance(toks[i], bytes) else toks[i] for i in got}
    assert {"<|im_start|>", "<|im_end|>"} <= names


def write_corpus(folder, seqs):
    from tfm_local.train.corpus import Sequence, append_shard, new_manifest

    m = new_manifest({"name": "t"}, {}, {})
    rows = [Sequence(np.array(ids, np.int32), plen, i) for i, (ids, plen) in enumerate(seqs)]
    append_shard(folder, m, rows, (0, len(seqs)))
    return folder


def test_token_counts_read_response_tokens_of_corpora(tmp_path):
    a = write_corpus(tmp_path / "a", [([1, 2, 3, 3], 2), ([4, 3], 1)])
    b = write_corpus(tmp_path / "b", [([5, 6, 6], 1)])
    np.testing.assert_array_equal(token_counts([a, b], 8), [0, 0, 0, 3, 0, 0, 2, 0])
    np.testing.assert_array_equal(token_counts([a], 8, responses_only=False), [0, 1, 1, 3, 1, 0, 0, 0])
    with pytest.raises(ConvertError, match="outside 0..2"):
        token_counts([a], 3)
    with pytest.raises(ConvertError, match="not a corpus"):
        token_counts([tmp_path], 8)


def test_tfm_convert_reduce_from_a_corpus_and_from_ids(files, tmp_path):
    corpus = write_corpus(tmp_path / "c", [(PROMPT + [5, 5, 6, 7, 100], len(PROMPT))])
    cmd = [sys.executable, "-m", "tfm_convert.cli", "--target", str(files["target"])]
    r = subprocess.run(cmd + ["--reduce", str(files["drafter"]), "--corpus", str(corpus), "--draft-vocab-size", "16",
                              "--save-ids", str(tmp_path / "ids.npy"), "-o", str(tmp_path / "r.gguf")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "16 draft ids covering 100.00%" in r.stdout
    ids = np.load(tmp_path / "ids.npy")
    assert ids.size == 16 and {5, 6, 7, 100} | set(always_ids(files["target"]).tolist()) <= set(ids.tolist())
    assert draft_vocab_size(tmp_path / "r.gguf") == 16
    r = subprocess.run(cmd + ["--reduce", str(files["drafter"]), "--ids", str(tmp_path / "ids.npy"),
                              "-o", str(tmp_path / "r2.gguf")], capture_output=True, text=True)
    assert r.returncode == 0 and draft_vocab_size(tmp_path / "r2.gguf") == 16
    np.save(tmp_path / "bad.npy", np.array([1, 1]))
    for extra, msg in [(["--ids", str(tmp_path / "bad.npy")], "unique"), (["--ids", str(tmp_path / "ids.npy"),
                       "--corpus", str(corpus)], "exactly one"), ([], "exactly one")]:
        r = subprocess.run(cmd + ["--reduce", str(files["drafter"]), "-o", str(tmp_path / "x.gguf")] + extra,
                           capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_resolve_drafter_builds_the_shipped_draft_vocabulary_once_and_keys_it_by_the_ids(files, tmp_path, monkeypatch):
    """``<stem>.draft-vocab.npy`` next to a (vocabulary-less) drafter: its reduced copy is cached under a
    name that changes with the ids; "full", TFM_DRAFT_VOCAB=0 and a bad mode behave as documented."""
    from tfm_local.files.drafters import resolve_drafter

    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    bare = strip_vocab(files["drafter"], tmp_path / "d.novocab.gguf")
    attached = resolve_drafter(bare, files["target"], "full")
    assert draft_vocab_size(attached) is None
    assert resolve_drafter(bare, files["target"]) == attached  # no ids shipped: nothing to reduce
    np.save(tmp_path / "d.draft-vocab.npy", files["ids"].astype(np.int32))
    got = resolve_drafter(bare, files["target"])
    assert got.parent == tmp_path / "cache" / "drafters" and draft_vocab_size(got) == files["ids"].size
    assert "tokenizer.ggml.model" in read_gguf_meta(got).kv
    mtime = got.stat().st_mtime_ns
    assert resolve_drafter(bare, files["target"]) == got and got.stat().st_mtime_ns == mtime  # built once
    assert resolve_drafter(bare, files["target"], "full") == attached
    monkeypatch.setenv("TFM_DRAFT_VOCAB", "0")
    assert resolve_drafter(bare, files["target"]) == attached
    monkeypatch.delenv("TFM_DRAFT_VOCAB")
    np.save(tmp_path / "d.draft-vocab.npy", files["ids"][:-1].astype(np.int32))
    other = resolve_drafter(bare, files["target"])
    assert other != got and draft_vocab_size(other) == files["ids"].size - 1
    np.save(tmp_path / "explicit.npy", np.array([1, 2, 3]))
    assert draft_vocab_size(resolve_drafter(files["drafter"], files["target"], tmp_path / "explicit.npy")) == 3
    assert draft_vocab_size(resolve_drafter(files["reduced"], files["target"])) == files["ids"].size  # as given
    assert draft_vocab_size(resolve_drafter(files["reduced"], files["target"], tmp_path / "explicit.npy")) == 3
    for bad in ("half", tmp_path / "missing.npy"):
        with pytest.raises(ValueError, match="draft vocabulary must be"):
            resolve_drafter(bare, files["target"], bad)
    with pytest.raises(ValueError, match="draft vocabulary must be"):
        Engine(files["target"], bare, draft_vocab="none")
