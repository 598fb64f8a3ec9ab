"""ShareGPT's own replies as training data (``prompts --replies``, ``data --backend reference``) and the fit's
per-sequence distillation weight for them (``--reference-weight``), on tiny synthetic targets (CPU)."""
import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tfm_local.testing import synth  # noqa: E402
from tfm_local.train.batching import make_batch  # noqa: E402
from tfm_local.train.corpus import Sequence, load_corpus, target_identity  # noqa: E402
from tfm_local.train.errors import CorruptArtifactError, TrainError  # noqa: E402
from tfm_local.train.generate import FilePrompts, ReferenceBackend, build_corpus  # noqa: E402
from tfm_local.train.prompts import PromptFile, Selection, select_pairs, select_prompts, turn_pairs  # noqa: E402
from tfm_local.train.recipe import FitOptions  # noqa: E402


def _conv(*turns):
    return {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_pairs_carry_the_reply_that_followed_each_prompt():
    conv = _conv(("human", "First question here?"), ("gpt", "  Answer one.  "), ("human", "ok"), ("gpt", "Two."),
                 ("human", "Third question here?"), ("gpt", ""), ("human", "Last question, unanswered?"))
    pairs = turn_pairs(conv, 4, 8, 100)
    assert [(p if isinstance(p, str) else p[-1]["content"], r) for p, r in pairs] == [
        ("First question here?", "Answer one."), ("Third question here?", None), ("Last question, unanswered?", None)]
    convs = [conv] + [_conv(("human", f"question number {i} here"), ("gpt", f"reply {i}")) for i in range(9)]
    sel = Selection(seed=3, min_chars=8, max_chars=100, turns=4)
    got = select_pairs(sel, convs)
    assert [p for p, _ in got] == select_prompts(sel, convs)
    assert all(r == f"reply {p.split()[2]}" for p, r in got if isinstance(p, str) and p.startswith("question"))


def test_reply_ids_are_the_targets_turn_after_the_generation_prompt(tmp_path):
    from tfm_local.llama.tokenizer import encode_chat
    from tfm_local.train.prompts import ChatTokenizer

    target = synth.write_tiny_target(tmp_path / "t.gguf")
    tok = ChatTokenizer(target)
    try:
        prompt = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": "What is two plus two?"}]
        head, reply = tok.prompt_ids(prompt), tok.reply_ids(prompt, "It is four.")
        assert reply and tok.tok.is_eog(reply[-1]) and not any(tok.tok.is_eog(t) for t in reply[:-1])
        full = encode_chat(tok.model, tok.tok, prompt + [{"role": "assistant", "content": "It is four."}], False)
        assert full[:len(head) + len(reply)] == head + reply
        assert "It is four." in tok.tok.decode(reply[:-1])
        assert tok.reply_ids(prompt, None) is None and tok.reply_ids("What is two plus two?", "") is None
    finally:
        tok.close()


def test_prompt_file_keeps_replies_and_reads_old_files(tmp_path):
    ids = [np.arange(5, dtype=np.int32), None, np.arange(3, 9, dtype=np.int32)]
    replies = [np.array([4, 5, 7], dtype=np.int32), None, None]
    meta = {"selection": {"seed": 3}, "max_prompt_tokens": 8}
    PromptFile(ids, [7], meta, replies).save(tmp_path / "r.npz")
    pf = PromptFile.load(tmp_path / "r.npz")
    assert pf.replies[0].tolist() == [4, 5, 7] and pf.replies[1] is None and pf.replies[2] is None
    assert pf.ids[2].tolist() == list(range(3, 9))
    PromptFile(ids, [7], meta).save(tmp_path / "p.npz")
    assert PromptFile.load(tmp_path / "p.npz").replies is None
    with np.load(tmp_path / "r.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["reply_ranks"] = np.array([9], dtype=np.int32)  # a rank past the end
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(CorruptArtifactError, match="inconsistent"):
        PromptFile.load(tmp_path / "bad.npz")


def _reference_corpus(tmp_path, target, n=12):
    """A prompt file of ``n`` prompts (every 4th dropped, every 3rd without a reply) and its reference corpus."""
    rng = np.random.default_rng(1)
    ids = [None if r % 4 == 3 else rng.integers(3, 200, size=6 + r % 5).astype(np.int32) for r in range(n)]
    replies = [None if r % 3 == 2 else rng.integers(3, 200, size=20 + r).astype(np.int32) for r in range(n)]
    pf = PromptFile(ids, [0], {"selection": {"seed": 0}, "max_prompt_tokens": 16}, replies)
    m = build_corpus(tmp_path / "ref", target, FilePrompts(pf), ReferenceBackend(pf), n_prompts=n, max_new=24,
                     shard_size=5, selection={"seed": 0}, max_prompt_tokens=16, progress=False)
    return pf, m


def test_reference_backend_writes_the_replies_as_a_corpus(tmp_path):
    target = tmp_path / "t.gguf"
    target.write_bytes(b"pretend target")
    pf, m = _reference_corpus(tmp_path, target)
    assert m["generation"]["decoding"] == "reference"
    seqs = load_corpus(tmp_path / "ref")[1]
    want = [r for r in range(12) if r % 4 != 3 and r % 3 != 2]  # a prompt kept and a reply present
    assert [s.prompt_index for s in seqs] == want
    for s in seqs:
        assert s.ids[:s.prompt_len].tolist() == pf.ids[s.prompt_index].tolist()
        assert s.ids[s.prompt_len:].tolist() == pf.replies[s.prompt_index][:24].tolist()  # cut to max_new
    with pytest.raises(TrainError, match="--replies"):
        ReferenceBackend(PromptFile(pf.ids, [0], pf.meta))


def test_fit_weighs_reference_sequences_by_the_target_distribution(tmp_path, monkeypatch):
    """Reference sequences get α = --reference-weight, the others --soft-weight; the whole target is loaded for
    them even when --soft-weight is 0; a reference corpus given last (held-out source) is refused."""
    from tfm_local.train import fit as fit_mod
    from tfm_local.train import recipe
    from tfm_local.train.fit import fit, load_corpora
    from tfm_local.train.warmstart import drafter_config

    target = synth.write_tiny_target(tmp_path / "t.gguf")
    pf, _ = _reference_corpus(tmp_path, target, n=40)
    greedy = tmp_path / "g"

    class Echo:  # 'greedy' responses: a function of the prompt (no model needed for the corpus format)
        name = "fake"

        def generate(self, prompts, max_new, ranks=None):
            return [[int(p.sum()) % 97 + 3, 5, 6, 7, 8, 9][:max_new] for p in prompts]

    build_corpus(greedy, target, FilePrompts(pf), Echo(), n_prompts=40, max_new=6, shard_size=8,
                 selection={"seed": 0}, max_prompt_tokens=16, progress=False)
    _, seqs = load_corpora([tmp_path / "ref", greedy], target_identity(target))
    assert {s.reference for s in seqs if len(s.ids) - s.prompt_len > 6} == {True}
    assert not any(s.reference for s in load_corpora(greedy, target_identity(target))[1])
    seen = []
    real = recipe.block_loss

    def spy(drafter, tgt, batch, weights, block, autocast, soft_weight=0.0, reference_weight=1.0):
        seen.append((batch.reference.clone(), soft_weight, reference_weight, tgt.n_loaded))
        return real(drafter, tgt, batch, weights, block, autocast, soft_weight, reference_weight)

    monkeypatch.setattr(fit_mod, "block_loss", spy)
    opts = FitOptions(epochs=5, lr=3e-3, batch_tokens=256, anchors=2, max_len=64, max_steps=6, log_every=1,
                      save_every=100, holdout=2, eval_every=3, reference_weight=0.75)
    fit([tmp_path / "ref", greedy], target, tmp_path / "run", opts, drafter_config(target, 1, 32), progress=False)
    assert seen and all(s == 0.0 and r == 0.75 for _, s, r, _ in seen)
    assert {n for *_, n in seen} == {2}  # every block of the 2-layer target: the distribution needs them all
    assert any(bool(b.any()) for b, *_ in seen) and any(not bool(b.all()) for b, *_ in seen)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(x["loss"]) for x in log if "loss" in x) and any("heldout_tau" in x for x in log)
    with pytest.raises(TrainError, match="ShareGPT's replies"):
        fit([greedy, tmp_path / "ref"], target, tmp_path / "run2", opts, drafter_config(target, 1, 32), progress=False)


def test_per_row_alpha_mixes_label_and_distribution_row_by_row():
    """_chunked_head_loss with α per row: each row's loss is (1-α_i) CE(label) + α_i CE(p_target)."""
    from tfm_local.train.recipe import _chunked_head_loss

    g = torch.Generator().manual_seed(0)
    head, h, ht = torch.randn(50, 8, generator=g), torch.randn(9, 8, generator=g), torch.randn(9, 8, generator=g)
    labels, w = torch.randint(0, 50, (9,), generator=g), torch.rand(9, generator=g)
    alpha = torch.tensor([0.0, 1.0, 0.5] * 3)
    total, _ = _chunked_head_loss(lambda x: x @ head.T, h, labels, w, autocast=False, chunk=4, soft=(ht, alpha))
    logp = torch.log_softmax(h @ head.T, -1)
    ce_label = torch.nn.functional.nll_loss(logp, labels, reduction="none")
    ce_target = -(torch.softmax(ht @ head.T, -1) * logp).sum(-1)
    torch.testing.assert_close(total, (((1 - alpha) * ce_label + alpha * ce_target) * w).sum())


def test_batches_mark_reference_sequences():
    rng = np.random.default_rng(0)
    seqs = [Sequence(rng.integers(3, 90, size=30).astype(np.int32), 4, i, reference=bool(i % 2)) for i in range(4)]
    b = make_batch(seqs, 3, 16, 1, 64, rng)
    assert b.reference.tolist() == [False, True, False, True] and b.reference.dtype == torch.bool
    assert dataclasses.replace(seqs[0]).reference is False


def test_cli_reference_backend_needs_a_prompt_file(tmp_path, capsys):
    from tfm_local.cli.train import main

    target = synth.write_tiny_target(tmp_path / "t.gguf")
    with pytest.raises(SystemExit, match="--backend reference needs --prompts"):
        main(["data", "--target", str(target), "--out", str(tmp_path / "c"), "--backend", "reference"])
