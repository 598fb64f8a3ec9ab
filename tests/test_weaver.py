"""The Weaver (tfm_local/train/weaver.py) and its training (weaver_fit.py) on a tiny synthetic target.

The module fixture writes a tiny qwen2 target, a random DFlash drafter for it and a small corpus of
the target's own responses (llama.cpp); the fit tests train a small Weaver on it on the CPU."""
import numpy as np
import pytest
import torch

from tfm_local.train.errors import TrainError
from tfm_local.train.weaver import Weaver, WeaverConfig, accepted_prefix, candidate_loss, path_mask
from tfm_local.train.weaver_fit import WeaverOptions, fit_weaver
from tfm_local.bench.provenance import problems


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    """Every test here on one torch thread (``conftest.one_torch_thread``)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tfm_convert.pipeline import init_random
    from tfm_local.testing.synth import write_tiny_target
    from tfm_local.train.smoke import TINY, make_corpus

    d = tmp_path_factory.mktemp("weaver")
    target = write_tiny_target(d / "target.gguf", **TINY)
    drafter, _ = init_random(target, d / "drafter.gguf", layers=1, seed=5, outtype="f32")
    other, _ = init_random(target, d / "other.gguf", layers=1, seed=6, outtype="f32")
    make_corpus(target, d / "corpus", n_prompts=16, max_new=40)
    return d, target, drafter, other


def _inputs(c: WeaverConfig, n=3, s=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = c.depth if s is None else s
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return (r(n, c.target_hidden), r(n, c.depth, c.drafter_hidden), r(n, s, c.target_hidden), r(n, s, c.top_k),
            r(n, s, c.top_k, c.target_hidden))


def _trained(c: WeaverConfig) -> Weaver:
    w = Weaver(c)
    torch.nn.init.normal_(w.out.weight, std=0.5)  # as after training: the correction is not zero
    return w


def test_a_fresh_weaver_scores_the_candidates_as_the_drafter():
    c = WeaverConfig(target_hidden=24, drafter_hidden=20, depth=6, top_k=5, width=32, heads=4, ffn=48, rank=8)
    w = Weaver(c)
    ht, hd, steps, logit, rows = _inputs(c)
    assert torch.equal(w(ht, hd, steps, logit, w.codes(rows)), logit)


def test_a_step_sees_the_prefix_and_its_own_path_only():
    """Changing the token of step 3 changes the scores of steps 3.. and nothing before; changing the
    drafter's state at a deep position changes every step (the whole prefix is visible)."""
    c = WeaverConfig(target_hidden=24, drafter_hidden=20, depth=6, top_k=5, width=32, heads=4, ffn=48, rank=8,
                     layers=2)
    w = _trained(c)
    ht, hd, steps, logit, rows = _inputs(c)
    base = w(ht, hd, steps, logit, w.codes(rows))
    steps2 = steps.clone()
    steps2[:, 3] += 1.0
    moved = w(ht, hd, steps2, logit, w.codes(rows))
    assert torch.allclose(moved[:, :3], base[:, :3], atol=1e-6) and not torch.allclose(moved[:, 3:], base[:, 3:])
    hd2 = hd.clone()
    hd2[:, -1] += 1.0
    moved = w(ht, hd2, steps, logit, w.codes(rows))
    assert not torch.allclose(moved[:, 0], base[:, 0])
    # a path scored one step at a time (each call with the steps so far) gives the same scores
    one = torch.stack([w(ht, hd, steps[:, :s + 1], logit[:, :s + 1], w.codes(rows[:, :s + 1]))[:, s]
                       for s in range(c.depth)], 1)
    assert torch.allclose(one, base, atol=1e-5)
    assert path_mask(2, 3).tolist() == [[[[True, True, True, True, False], [True, True, True, True, True]]]]


def test_candidate_loss_and_the_chain_proxy():
    logits = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 0.0]]])
    cand = torch.tensor([[[7, 8, 9], [4, 5, 6], [1, 2, 3]]])
    labels = torch.tensor([[7, 6, 99]])  # a top-1 hit, a candidate at rank 3, a token outside the pool
    loss, rows, top1 = candidate_loss(logits, cand, labels)
    want = -torch.log_softmax(logits[0, 0], -1)[0] - torch.log_softmax(logits[0, 1], -1)[2]
    assert rows.tolist() == [[True, True, False]] and top1.tolist() == [[True, False, False]]
    assert loss.item() == pytest.approx(want.item())
    _, rows, _ = candidate_loss(logits, cand, torch.tensor([[-100, 5, 1]]))
    assert rows.tolist() == [[False, True, True]]
    assert accepted_prefix(torch.tensor([[True, True, False, True], [False, True, True, True]])).tolist() == [2, 0]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="heads"):
        WeaverConfig(target_hidden=8, drafter_hidden=8, width=30, heads=4)
    with pytest.raises(ValueError, match="rank"):
        WeaverConfig(target_hidden=8, drafter_hidden=8, width=32, heads=4, rank=0)
    with pytest.raises(ValueError, match="unknown"):
        WeaverConfig.from_dict({"target_hidden": 8, "drafter_hidden": 8, "colour": 1})
    c = WeaverConfig(target_hidden=8, drafter_hidden=8, depth=4, top_k=3, width=16, heads=2, ffn=16, rank=4)
    w = Weaver(c)
    ht, hd, steps, logit, rows = _inputs(c)
    with pytest.raises(ValueError, match="depth"):
        w(ht, torch.cat([hd, hd], 1), steps, logit, w.codes(rows))
    assert WeaverConfig.from_dict(c.to_dict()) == c


OPTS = dict(lr=3e-3, batch_tokens=1024, anchors=8, max_len=512, log_every=10, save_every=10,
            shape=dict(width=64, heads=4, ffn=128, rank=32, top_k=128))


def test_fit_learns_to_correct_the_drafter_and_resumes(pair):
    """A random drafter's top-1 is almost never the target's token; 40 steps teach the Weaver to pick
    it out of the drafter's 128 candidates on the training data (the tiny target's responses repeat
    themselves), from the same scores at step 0. A second run with more steps continues the first;
    a run with another drafter in the same folder is refused."""
    d, target, drafter, other = pair
    lines = []
    res = fit_weaver(d / "corpus", target, drafter, d / "w", WeaverOptions(steps=40, **OPTS), "cpu", log=lines.append)
    first = [float(x.split(" loss ")[1].split()[0]) for x in lines if " loss " in x]
    assert res["steps"] == 40 and (d / "w" / "weaver.pt").is_file()
    assert first[-1] < 0.5 * first[0]
    assert res["train"]["top1"] > 0.5 > 0.2 > res["train"]["top1_drafter"]
    assert res["train"]["accepted"] > 5 * max(res["train"]["accepted_drafter"], 0.1)
    lines.clear()
    res = fit_weaver(d / "corpus", target, drafter, d / "w", WeaverOptions(steps=50, **OPTS), "cpu", log=lines.append)
    assert res["steps"] == 50 and lines[0].startswith("[weaver] step 50/50")
    with pytest.raises(TrainError, match="drafter"):
        fit_weaver(d / "corpus", target, other, d / "w", WeaverOptions(steps=60, **OPTS), "cpu", log=lines.append)


def test_a_time_budget_fits_the_schedule_to_the_steps_that_fit(pair, tmp_path):
    """--time-budget: with a budget far below 400 steps the schedule is re-fitted when the step time is
    first known (step 40 of the session, ``timebudget.FIRST``) and the fit ends there instead of at 400,
    logging its last step once, with the checkpoint at that step."""
    from tfm_local.train.checkpoint import load_checkpoint
    from tfm_local.train.timebudget import FIRST

    d, target, drafter, _ = pair
    lines = []
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w",
                     WeaverOptions(steps=400, time_budget_s=0.01, **OPTS), "cpu", log=lines.append)
    assert FIRST <= res["steps"] <= FIRST + 2
    assert load_checkpoint(tmp_path / "w" / "weaver.pt")["step"] == res["steps"]
    ends = [x for x in lines if x.startswith(f"[weaver] step {res['steps']}/")]
    assert len(ends) == 1 and ends[0].startswith(f"[weaver] step {res['steps']}/{res['steps']} ")


def test_fit_scores_held_out_sequences_and_refuses_a_corpus_of_another_target(pair, tmp_path):
    from tfm_local.testing.synth import write_tiny_target
    from tfm_local.train.smoke import TINY

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=3, holdout=3, **OPTS),
                     "cpu", log=lambda s: None)
    assert res["eval"]["positions"] > 0 and np.isfinite(res["eval"]["loss"])
    stranger = write_tiny_target(tmp_path / "other.gguf", **{**TINY, "seed": 99})
    with pytest.raises(TrainError, match="generated by"):
        fit_weaver(d / "corpus", stranger, drafter, tmp_path / "w2", WeaverOptions(steps=1, **OPTS), "cpu")


def test_tfm_trees_of_a_fresh_weaver_are_ddtree_and_a_trained_one_accepts_more(pair, tmp_path):
    """With every token a candidate, one entry popped a round and every candidate offered, a fresh
    Weaver's TfM tree is DDTree's (the same best-first order over the same path log-probabilities), so
    each draft accepts the same tokens, and so is its DARTree with W >= B and beta 0; after training,
    TfM@16 and DARTree@16 accept more than DDTree@16 on the sequences it was trained on (a random
    drafter: DDTree barely gets past the root), and DARTree's W and K sweep is reported."""
    from tfm_local.train.batching import make_batch
    from tfm_local.train.corpus import load_corpus
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.weaver_eval import compare_trees, dartree_accepted, ddtree_accepted, tfm_accepted
    from tfm_local.train.weaver_fit import load_frozen_drafter, weaver_inputs

    d, target, drafter, _ = pair
    tgt = TorchTarget(target)
    dft, _ = load_frozen_drafter(drafter, target, "cpu")
    seqs = load_corpus(d / "corpus")[1]
    V = tgt.head.shape[0]
    w = Weaver(WeaverConfig(target_hidden=tgt.hp.n_embd, drafter_hidden=dft.config.hidden_size,
                            depth=dft.config.block_size - 1, top_k=V, width=32, heads=4, ffn=32, rank=8))
    batch = make_batch(seqs[:3], 4, dft.config.block_size, dft.config.mask_token_id, 512, np.random.default_rng(0))
    x = weaver_inputs(tgt, dft, batch, V)
    for b in (3, 8):
        assert np.array_equal(tfm_accepted(w, tgt, x, b, width=1, children=V), ddtree_accepted(x, b))
        # and so is its DARTree with as many branches as nodes and no depth bonus (tree.build_dartree's doc)
        assert np.array_equal(dartree_accepted(w, tgt, x, b, width=b, beta=0.0), ddtree_accepted(x, b))
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=40, **OPTS), "cpu",
                     log=lambda s: None)
    from tfm_local.train.checkpoint import load_checkpoint

    st = load_checkpoint(res["checkpoint"])
    trained = Weaver(WeaverConfig.from_dict(st["config"]))
    trained.load_state_dict(st["model"])
    taus = compare_trees(trained, tgt, dft, seqs[:6], WeaverOptions(**OPTS), budgets=(16,))
    assert taus["drafts"] > 20 and taus["tfm@16"] > taus["ddtree@16"] + 1.0 and taus["chain_weaver"] > taus["chain"]
    assert taus["dartree@16"] > taus["ddtree@16"] + 1.0
    assert {"dartree@16/w4", "dartree@16/w24", "dartree@16/k8", "dartree@16/k32"} <= set(taus)
    assert taus["dartree@16/w24"] >= taus["dartree@16/w4"] - 0.5


def test_weaver_gguf_round_trip_export_and_refusals(pair, tmp_path):
    """An exported Weaver reads back to the same scores (F32 exactly; Q8_0 with the same top-1 almost
    everywhere); its codes are P times the target's LM head; a file of another kind, a truncated one, and
    a pair it was not trained for are refused with clear errors; so is resuming with another shape."""
    from tfm_convert.errors import ConvertError
    from tfm_convert.weaver_gguf import check_pair, read_weaver_gguf
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.weaver_fit import export_weaver

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=5, **OPTS), "cpu",
                     log=lambda s: None)
    paths = export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32", "q8_0"))
    from tfm_local.train.checkpoint import load_checkpoint

    st = load_checkpoint(res["checkpoint"])
    c = WeaverConfig.from_dict(st["config"])
    ref = Weaver(c)
    ref.load_state_dict(st["model"])
    torch.nn.init.normal_(ref.out.weight, std=0.5)  # make the correction count in the comparison
    st["model"]["out.weight"] = ref.out.weight.detach().clone()
    head = TorchTarget(target, n_layers=0).head.float()
    ht, hd, steps, logit, _ = _inputs(c, n=8)
    cand = torch.randint(0, head.shape[0], (8, c.depth, c.top_k), generator=torch.Generator().manual_seed(1))
    want = ref(ht, hd, steps, logit, ref.codes(head[cand]))
    for t, p in paths.items():
        wf = read_weaver_gguf(p)
        assert wf.config == pytest.approx(c.to_dict(), rel=1e-6) and wf.identity["drafter_sha256"] == st["drafter"]
        codes = torch.from_numpy(wf.tensors["codes"])
        assert codes.shape == (head.shape[0], c.rank)
        got_w = Weaver(c)
        state = {k: torch.from_numpy(v) for k, v in wf.state_dict().items()}
        state["out.weight"] = st["model"]["out.weight"]
        got_w.load_state_dict(state)
        got = got_w(ht, hd, steps, logit, codes[cand])
        if t == "f32":
            assert torch.allclose(codes, ref.codes(head), atol=1e-5) and torch.allclose(got, want, atol=1e-4)
        else:
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.97
    wf = read_weaver_gguf(paths["f32"])
    check_pair(wf, target_sha256=st["target"], drafter_sha256=st["drafter"], n_vocab=head.shape[0])
    with pytest.raises(ConvertError, match="trained for target"):
        check_pair(wf, target_sha256="0" * 64)
    with pytest.raises(ConvertError, match="another drafter"):
        check_pair(wf, drafter_sha256="f" * 64)
    with pytest.raises(ConvertError, match="not a Weaver GGUF"):
        read_weaver_gguf(target)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(paths["f32"].read_bytes()[:5000])
    with pytest.raises(ConvertError):
        read_weaver_gguf(cut)
    with pytest.raises(TrainError, match="already at step"):
        fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=3, **OPTS), "cpu")
    with pytest.raises(TrainError, match="vocabulary"):
        fit_weaver(d / "corpus", target, drafter, tmp_path / "w3",
                   WeaverOptions(steps=2, **{**OPTS, "shape": {**OPTS["shape"], "top_k": 100000}}), "cpu")
    with pytest.raises(TrainError, match="another shape"):
        fit_weaver(d / "corpus", target, drafter, tmp_path / "w",
                   WeaverOptions(steps=6, **{**OPTS, "shape": {**OPTS["shape"], "rank": 16}}), "cpu")


def test_tfm_convert_writes_weaver_ggufs_and_refuses_what_does_not_fit(pair, tmp_path, capsys):
    from tfm_convert.cli import main
    from tfm_convert.weaver_gguf import read_weaver_gguf
    from tfm_local.testing.synth import write_tiny_target
    from tfm_local.train.smoke import TINY

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=2, **OPTS), "cpu",
                     log=lambda s: None)
    ckpt = res["checkpoint"]
    assert main(["--weaver", ckpt, "--target", str(target), "-o", str(tmp_path / "a.gguf"), "--outtype", "q4_0"]) == 0
    assert main(["--weaver", str(tmp_path / "a.gguf"), "--target", str(target), "-o", str(tmp_path / "b.gguf"),
                 "--outtype", "q8_0"]) == 0
    assert read_weaver_gguf(tmp_path / "b.gguf").config["rank"] == OPTS["shape"]["rank"]
    stranger = write_tiny_target(tmp_path / "other.gguf", **{**TINY, "seed": 98})
    bad = [(["--weaver", str(tmp_path / "a.gguf"), "--target", str(stranger), "-o", str(tmp_path / "c.gguf")],
            "trained for target"),
           (["--weaver", ckpt, "--target", str(stranger), "-o", str(tmp_path / "c.gguf")], "another target"),
           (["--weaver", str(drafter), "--target", str(target), "-o", str(tmp_path / "c.gguf")], "not a Weaver GGUF"),
           (["--weaver", str(d / "corpus" / "manifest.json"), "--target", str(target), "-o", str(tmp_path / "c.gguf")],
            "neither a Weaver GGUF"),
           (["--weaver", ckpt, "--target", str(target)], "-o OUT.gguf")]
    for argv, msg in bad:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err, argv
    assert not (tmp_path / "c.gguf").exists()
    from tfm_local.files.drafters import file_key

    assert read_weaver_gguf(tmp_path / "b.gguf").identity["target_key"] == file_key(target)


def test_the_weaver_on_the_backend_agrees_with_pytorch(pair, tmp_path):
    """Parity: a trained tiny Weaver exported to GGUF and run by the ggml CPU backend (tfm_weaver_q,
    codes on the host) against the PyTorch Weaver on the same drafts, for the teacher-forced paths and
    for random paths of every length: the same top-1 candidate at ≥ 99.9% (F32) / 99% (Q8_0) of them,
    F32 scores within 1e-3; bad inputs refused."""
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver
    from tfm_local.train.batching import make_batch
    from tfm_local.train.checkpoint import load_checkpoint
    from tfm_local.train.corpus import load_corpus
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.weaver_fit import export_weaver, load_frozen_drafter, weaver_inputs

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=30, **OPTS), "cpu",
                     log=lambda s: None)
    paths = export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32", "q8_0"))
    st = load_checkpoint(res["checkpoint"])
    ref = Weaver(WeaverConfig.from_dict(st["config"]))
    ref.load_state_dict(st["model"])
    tgt, (dft, _) = TorchTarget(target), load_frozen_drafter(drafter, target, "cpu")
    seqs = load_corpus(d / "corpus")[1]
    x = weaver_inputs(tgt, dft, make_batch(seqs[:4], 4, dft.config.block_size, dft.config.mask_token_id, 512,
                                           np.random.default_rng(3)), ref.config.top_k)
    N, D, K = x.cand.shape
    rng = np.random.default_rng(0)
    jobs = [(n, s, None) for n in range(N) for s in range(1, D + 1)]  # teacher-forced prefixes
    jobs += [(int(rng.integers(N)), int(s), rng.integers(0, K, int(s) - 1)) for s in rng.integers(1, D + 1, 60)]
    steps = []
    for n, s, ranks in jobs:
        ids = x.step_emb[n, :s] if ranks is None else tgt.embed(torch.cat([x.root[n:n + 1], x.cand[n, torch.arange(s - 1), torch.as_tensor(ranks)]]))
        steps.append(ids.float())
    with torch.no_grad():
        want = torch.stack([ref(x.h_target[n:n + 1], x.h_drafter[n:n + 1], steps[j][None], x.cand_logit[n:n + 1, :s],
                                ref.codes(x.head_rows[n:n + 1, :s]))[0, s - 1] for j, (n, s, _) in enumerate(jobs)]).numpy()
    cand = np.stack([x.cand[n, s - 1].numpy() for n, s, _ in jobs])
    logit = np.stack([x.cand_logit[n, s - 1].numpy() for n, s, _ in jobs])
    for t, p in paths.items():
        rt = RuntimeWeaver(p, "cpu", 1)
        q = rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([n for n, _, _ in jobs]),
                 np.array([s for _, s, _ in jobs]), torch.cat(steps).numpy())
        got = rt.scores(q, cand, logit)
        agree = (got.argmax(1) == want.argmax(1)).mean()
        assert agree >= (0.999 if t == "f32" else 0.99), (t, agree)
        if t == "f32":
            assert np.abs(got - want).max() < 1e-3
    with pytest.raises(ValueError):
        rt.q(x.h_target.numpy(), x.h_drafter.numpy()[:, :-1], np.array([0]), np.array([1]), steps[0][:1].numpy())
    with pytest.raises(ValueError):
        rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([N]), np.array([1]), steps[0][:1].numpy())
    with pytest.raises(ValueError):
        rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([0]), np.array([D + 1]),
             np.zeros((D + 1, x.h_target.shape[1]), np.float32))
    # a tree's rounds over the kept prefix (``steps``, one owner a draft, drafts interleaved so that the
    # prefix is recomputed on every change of owner) give what ``q`` gives, path for path
    from tfm_local.llama import weaver_native

    rt = RuntimeWeaver(paths["f32"], "cpu", 1)
    with pytest.raises(ValueError, match="no prefix"):
        weaver_native.weaver_steps(rt._w, rt.shape, np.array([0]), np.array([1]), steps[0][:1].numpy())
    want_q = rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([n for n, _, _ in jobs]),
                  np.array([s for _, s, _ in jobs]), torch.cat(steps).numpy())   # all N drafts in one call

    class Owner:  # a tree's scorer (weakly referenced by the Weaver)
        pass

    owners = [Owner() for _ in range(N)]
    for j in rng.permutation(len(jobs))[:40]:  # no q in between: each change of owner recomputes the prefix
        n, s, _ = jobs[j]
        kept = rt.steps(owners[n], x.h_target[n].numpy(), x.h_drafter[n].numpy(), np.array([s]), steps[j].numpy())
        again = rt.steps(owners[n], None, None, np.array([s]), steps[j].numpy())  # the prefix kept: not read
        assert np.abs(kept[0] - want_q[j]).max() < 1e-4 and np.array_equal(kept, again)
    # q over N drafts, then one draft's rounds, then q over N again on the same handle
    n, s, _ = jobs[0]
    assert np.abs(rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([n]), np.array([s]), steps[0].numpy())[0]
                  - want_q[0]).max() < 1e-4
    assert np.abs(rt.steps(owners[n], x.h_target[n].numpy(), x.h_drafter[n].numpy(), np.array([s]),
                           steps[0].numpy())[0] - want_q[0]).max() < 1e-4
    again_q = rt.q(x.h_target.numpy(), x.h_drafter.numpy(), np.array([n for n, _, _ in jobs]),
                   np.array([s for _, s, _ in jobs]), torch.cat(steps).numpy())
    assert np.abs(again_q - want_q).max() < 1e-5
    with pytest.raises(ValueError):  # a draft beyond the given ones: refused before the kept prefix changes
        rt.q(x.h_target.numpy()[:1], x.h_drafter.numpy()[:1], np.array([1]), np.array([1]), steps[0][:1].numpy())
    with pytest.raises(ValueError):
        weaver_native.weaver_prefix(rt._w, rt.shape, x.h_target.numpy()[:1], x.h_drafter.numpy()[:2])


def test_a_trees_nodes_keep_their_keys_and_values_and_give_the_steps_q(pair, tmp_path):
    """``Weaver.nodes_add`` (each node's keys and values kept on the backend, one row a node) gives the q
    that ``Weaver.steps`` gives for the path ending at each node: random trees added in calls of 1-6 nodes
    (padded rows, parents within a call), two trees in a row on one store; what does not fit is refused."""
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver
    from tfm_local.train.weaver_fit import export_weaver

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=20, **OPTS), "cpu",
                     log=lambda s: None)
    rt = RuntimeWeaver(export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32",))["f32"], "cpu", 1)
    sh, rng = rt.shape, np.random.default_rng(7)
    D, Ht = sh["depth"], sh["target_hidden"]

    class Owner:
        pass

    for tree in range(2):
        ht = rng.standard_normal(Ht).astype(np.float32)
        hd = rng.standard_normal((D, sh["drafter_hidden"])).astype(np.float32)
        emb = rng.standard_normal((24, Ht)).astype(np.float32)  # node v's step: emb[v]
        parent, depth = [-1], [0]
        for v in range(1, 24):  # a random tree of 24 nodes, none deeper than the block
            p = int(rng.choice([u for u in range(v) if depth[u] < D - 1]))
            parent.append(p)
            depth.append(depth[p] + 1)
        owner = Owner()
        rt.nodes_begin(owner, ht, hd, 24)
        got, v = [], 0
        while v < 24:
            n = int(min(rng.integers(1, 7), 24 - v))
            got.append(rt.nodes_add(owner, np.array(parent[v:v + n]), emb[v:v + n]))
            v += n
        got = np.concatenate(got)
        for v in range(24):
            path = [v]
            while parent[path[-1]] >= 0:
                path.append(parent[path[-1]])
            want = rt.steps(Owner(), ht, hd, np.array([len(path)]), emb[path[::-1]])
            assert np.abs(got[v] - want[0]).max() < 1e-4, (tree, v)
    owner = Owner()
    rt.nodes_begin(owner, ht, hd, 2)
    rt.nodes_add(owner, np.array([-1, 0]), emb[:2])
    with pytest.raises(ValueError):  # the store is full
        rt.nodes_add(owner, np.array([1]), emb[:1])
    rt.nodes_begin(owner, ht, hd, 40)
    chain = np.arange(-1, D - 1)  # a path of D steps fits, one more does not
    rt.nodes_add(owner, chain, emb[:1].repeat(D, 0))
    with pytest.raises(ValueError):
        rt.nodes_add(owner, np.array([D - 1]), emb[:1])
    with pytest.raises(ValueError):  # a parent that does not exist yet
        rt.nodes_add(owner, np.array([D + 5]), emb[:1])
    rt.steps(Owner(), ht, hd, np.array([1]), emb[:1])  # another prefix took the backend
    with pytest.raises(RuntimeError):
        rt.nodes_add(owner, np.array([-1]), emb[:1])
    from tfm_local.llama import weaver_native

    with pytest.raises(ValueError, match="prefix replaced"):  # the library's own check
        weaver_native.weaver_nodes_add(rt._w, rt.shape, np.array([-1]), emb[:1])


def test_runtime_tfm_trees_are_the_trainers_trees(pair, tmp_path):
    """``decode.weaver.tfm_tree`` (the ggml Weaver, the target's embedding rows from its GGUF, the tree
    builder ``build_tfm``) accepts what the trainer's PyTorch reference tree accepts, draft for draft,
    one, two (the paper's at 32 nodes) and four entries a round."""
    from tfm_local.decode.weaver import TargetEmbeddings, tfm_tree
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver
    from tfm_local.train.batching import make_batch
    from tfm_local.train.checkpoint import load_checkpoint
    from tfm_local.train.corpus import load_corpus
    from tfm_local.train.target_torch import TorchTarget
    from tfm_local.train.weaver_eval import accepted_length, tfm_accepted
    from tfm_local.train.weaver_fit import export_weaver, load_frozen_drafter, weaver_inputs

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=30, **OPTS), "cpu",
                     log=lambda s: None)
    path = export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32",))["f32"]
    st = load_checkpoint(res["checkpoint"])
    ref = Weaver(WeaverConfig.from_dict(st["config"]))
    ref.load_state_dict(st["model"])
    tgt, (dft, _) = TorchTarget(target), load_frozen_drafter(drafter, target, "cpu")
    x = weaver_inputs(tgt, dft, make_batch(load_corpus(d / "corpus")[1][:4], 4, dft.config.block_size,
                                           dft.config.mask_token_id, 512, np.random.default_rng(5)), ref.config.top_k)
    rt, embed = RuntimeWeaver(path, "cpu", 1), TargetEmbeddings(target)
    assert np.allclose(embed(x.root[:3].numpy()), x.step_emb[:3, 0].numpy())
    for budget, width in ((16, 4), (8, 1), (32, None)):
        want = tfm_accepted(ref, tgt, x, budget, width or 2)
        got = []
        for n in range(len(want)):
            t = tfm_tree(rt, embed, int(x.root[n]), x.h_target[n].numpy(), x.h_drafter[n].numpy(), x.cand[n].numpy(),
                         x.cand_logit[n].numpy(), budget, width)
            assert len(t) == budget + 1 and np.all(t.parents[1:] < np.arange(1, budget + 1))
            got.append(accepted_length(t.parents, t.tokens, x.labels[n].numpy()))
        assert np.array_equal(np.array(got), want), (budget, got, want)


@pytest.fixture(scope="module")
def full_pool_weaver(pair, tmp_path_factory):
    """A Weaver of the tiny pair over every token (K = the vocabulary), 60 steps, exported to F32."""
    d, target, drafter, _ = pair
    out = tmp_path_factory.mktemp("wfull")
    shape = {**OPTS["shape"], "top_k": 320}
    res = fit_weaver(d / "corpus", target, drafter, out / "w", WeaverOptions(steps=60, **{**OPTS, "shape": shape}),
                     "cpu", log=lambda s: None)
    from tfm_local.train.weaver_fit import export_weaver

    return export_weaver(res["checkpoint"], target, out / "export", ("f32",))["f32"]


def test_engine_tfm_is_lossless_and_accepts_more_than_ddtree(pair, full_pool_weaver, tmp_path):
    """``Engine(tree="tfm" | "dartree", weaver=...)`` on the tiny pair (a random drafter, a Weaver trained
    on the target's own responses): greedy outputs are plain decoding's, a seeded sampled output is plain
    decoding's with the same seed, and TfM@16 and DARTree@16 accept far more than DDTree@16 with the same
    drafter.
    A missing Weaver, or one of another target, is refused."""
    from tfm_local.decode.sampling import SamplingParams
    from tfm_local.engine import Engine
    from tfm_local.testing.synth import write_tiny_target
    from tfm_local.train.corpus import load_corpus
    from tfm_local.train.smoke import TINY

    d, target, drafter, _ = pair
    seqs = load_corpus(d / "corpus")[1]
    taus = {"tfm": [], "ddtree": [], "dartree": []}
    with Engine(target, None, n_ctx=512, n_threads=1) as plain, \
            Engine(target, drafter, n_ctx=512, tree="tfm", weaver=full_pool_weaver, budget=16, n_threads=1) as tfm, \
            Engine(target, drafter, n_ctx=512, tree="ddtree", budget=16, n_threads=1) as dd:
        for s in seqs[:4]:
            ids = [int(t) for t in s.ids[:s.prompt_len]]
            ref = list(plain.generate_ids(ids, 40, SamplingParams()))
            for name, e in (("tfm", tfm), ("ddtree", dd), ("dartree", tfm)):
                e.set_draft(name, 16)
                assert list(e.generate_ids(ids, 40, SamplingParams())) == ref, name
                taus[name].append(e.stats.tau)
        tfm.set_draft("tfm", 16)
        sp = SamplingParams(temperature=0.8, seed=7)
        ids = [int(t) for t in seqs[0].ids[:seqs[0].prompt_len]]
        assert list(tfm.generate_ids(ids, 40, sp)) == list(plain.generate_ids(ids, 40, sp))
        tfm.set_draft("ddtree", 16)  # and back: the target stops keeping its hidden states
        assert list(tfm.generate_ids(ids, 20, SamplingParams())) == list(plain.generate_ids(ids, 20, SamplingParams()))
    assert np.mean(taus["tfm"]) > 2.0 and np.mean(taus["tfm"]) > np.mean(taus["ddtree"]) + 1.0, taus
    assert np.mean(taus["dartree"]) > np.mean(taus["ddtree"]) + 1.0, taus
    with pytest.raises(ValueError, match="needs a Weaver"):
        Engine(target, drafter, n_ctx=512, tree="tfm")
    with Engine(target, drafter, n_ctx=256, tree="ddtree", n_threads=1) as e, pytest.raises(ValueError, match="Weaver"):
        e.set_draft("tfm", 16)
    stranger = write_tiny_target(tmp_path / "other.gguf", **{**TINY, "seed": 97})
    from tfm_convert.pipeline import init_random

    other_drafter, _ = init_random(stranger, tmp_path / "od.gguf", layers=1, seed=1)
    with pytest.raises(ValueError, match="another pair"):
        Engine(stranger, other_drafter, n_ctx=256, tree="tfm", weaver=full_pool_weaver, n_threads=1)


def test_tfm_bench_takes_tfm_modes_and_wants_the_weaver(capsys):
    from tfm_local.bench.tfm_bench import main, parse_mode

    assert (parse_mode("tfm@16").tree, parse_mode("tfm@16").budget) == ("tfm", 16)
    with pytest.raises(SystemExit) as e:
        main(["--modes", "plain,tfm@16", "-n", "1", "--no-plot"])
    assert e.value.code != 0 and "--weaver" in capsys.readouterr().err


def test_the_weaver_is_loaded_where_its_trees_are_built_fastest(pair, tmp_path, monkeypatch):
    """``fastest_weaver``: each device's tree is timed (the real Weaver's graph on the CPU for both
    "devices" here, one made slower), the faster kept and the other closed; one device is loaded untimed."""
    import time as _time

    from tfm_local.decode import weaver as rt
    from tfm_local.train.weaver_fit import export_weaver

    d, target, drafter, _ = pair
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=2, **OPTS), "cpu",
                     log=lambda s: None)
    path = export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32",))["f32"]
    made = []

    class Timed(rt.Weaver):
        def __init__(self, p, device, n_threads=None):
            super().__init__(p, "cpu", n_threads)
            self.device, self.closed = device, False
            made.append(self)

        def nodes_add(self, *a):
            if self.device == "gpu":
                _time.sleep(0.002)
            return super().nodes_add(*a)

        def dartree(self, *a, **kw):
            if self.device == "cpu":
                _time.sleep(0.002)
            return super().dartree(*a, **kw)

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(rt, "Weaver", Timed)
    w, ms = rt.fastest_weaver(path, ("gpu", "cpu"), 1, budget=8)
    assert w.device == "cpu" and not w.closed and set(ms) == {"gpu", "cpu"} and ms["gpu"] > ms["cpu"]
    assert [x.closed for x in made] == [True, False]
    # placed for DARTree: its backend trees are timed instead (here the "cpu" one made slower)
    wd, msd = rt.fastest_weaver(path, ("gpu", "cpu"), 1, budget=8, dartree_target=str(target))
    assert wd.device == "gpu" and wd.attached == str(target) and msd["cpu"] > msd["gpu"]
    assert [x.closed for x in made] == [True, False, False, True]
    made[:] = made[:2]
    w1, ms1 = rt.fastest_weaver(path, ("cpu",), 1)
    assert ms1 == {} and w1.device == "cpu" and len(made) == 3
    with pytest.raises(ValueError):
        rt.fastest_weaver(path, ())

    class NoGpu(Timed):  # a device that cannot load it is skipped; none at all raises its error
        def __init__(self, p, device, n_threads=None):
            if device == "gpu":
                raise RuntimeError("no GPU backend")
            super().__init__(p, device, n_threads)

    monkeypatch.setattr(rt, "Weaver", NoGpu)
    w2, ms2 = rt.fastest_weaver(path, ("gpu", "cpu"), 1, budget=8)
    assert w2.device == "cpu" and set(ms2) == {"cpu"}
    with pytest.raises(RuntimeError, match="no GPU"):
        rt.fastest_weaver(path, ("gpu", "gpu"), 1)


def test_a_bad_drafter_is_named_by_the_weavers_option(pair, tmp_path):
    """``tfm-train weaver --drafter`` of a missing or non-drafter file: the error names --drafter (the
    loader is the fit's --init-from one)."""
    d, target, _, _ = pair
    with pytest.raises(FileNotFoundError, match="--drafter"):
        fit_weaver(d / "corpus", target, tmp_path / "none.gguf", tmp_path / "w", WeaverOptions(steps=1, **OPTS), "cpu")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(Exception, match="--drafter") as e:
        fit_weaver(d / "corpus", target, tmp_path / "junk.pt", tmp_path / "w", WeaverOptions(steps=1, **OPTS), "cpu")
    assert "--init-from" not in str(e.value)


def test_tfm_bench_json_records_where_the_weaver_ran(tmp_path):
    """The bench JSON keeps ``Engine.weaver_ms`` (the TfM tree's ms on each device timed at load)."""
    import json
    from types import SimpleNamespace

    from tfm_local.bench.tfm_bench import write_json

    model = SimpleNamespace(path=tmp_path / "m.gguf")
    engine = SimpleNamespace(target=SimpleNamespace(model=model), drafter=None, weaver_ms={"gpu": 4.1, "cpu": 2.3})
    args = SimpleNamespace(json=str(tmp_path / "b.json"), threads=2, cpu=True, max_tokens=8, n_prompts=1,
                           modes="plain")
    write_json(args, [], [], engine, argv=["--modes", "plain"])
    assert json.loads((tmp_path / "b.json").read_text())["weaver_ms"] == {"gpu": 4.1, "cpu": 2.3}
    engine.weaver_ms = {}
    write_json(args, [], [], engine, argv=["--modes", "plain"])
    assert "weaver_ms" not in json.loads((tmp_path / "b.json").read_text())


def test_weaver_option_needs_drafting_and_notes_an_unused_tree(capsys):
    """tfm-chat / tfm-serve: ``--weaver`` without drafting is an error (nothing would read it); with a tree
    that does not use it, a note."""
    from argparse import Namespace

    from tfm_local.cli.common import check_weaver_use

    for bad in (dict(no_draft=True, budget="auto"), dict(no_draft=False, budget=0)):
        with pytest.raises(SystemExit):
            check_weaver_use(Namespace(weaver="w.gguf", tree="tfm", **bad))
        assert "--weaver" in capsys.readouterr().err
    check_weaver_use(Namespace(weaver="w.gguf", tree="ddtree", no_draft=False, budget="auto"))
    assert "note: --weaver" in capsys.readouterr().err
    check_weaver_use(Namespace(weaver="w.gguf", tree="tfm", no_draft=False, budget=16))
    check_weaver_use(Namespace(weaver=None, tree="chain", no_draft=True, budget=0))
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def dartree_weaver(pair, tmp_path_factory):
    """A Weaver of the tiny pair fitted 20 steps, exported to F32: the DARTree tests' (its path)."""
    from tfm_local.train.weaver_fit import export_weaver

    d, target, drafter, _ = pair
    out = tmp_path_factory.mktemp("wdartree")
    res = fit_weaver(d / "corpus", target, drafter, out / "w", WeaverOptions(steps=20, **OPTS), "cpu",
                     log=lambda s: None)
    return export_weaver(res["checkpoint"], target, out / "export", ("f32",))["f32"]


def _dartree_prefix(shape: dict, seed: int = 11):
    """A random draft's prefix (h_target, h_drafter) for a Weaver of ``shape``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape["target_hidden"]).astype(np.float32),
            rng.standard_normal((shape["depth"], shape["drafter_hidden"])).astype(np.float32))


def _random_draft(r, n_vocab: int, D: int, K: int, scale: float = 3.0):
    """Candidates ``[D, K]`` (distinct at each depth), their logits (``scale`` × N(0, 1)) and a root token."""
    cand = np.stack([r.choice(n_vocab, K, replace=False) for _ in range(D)]).astype(np.int32)
    return cand, (scale * r.standard_normal((D, K))).astype(np.float32), int(r.integers(n_vocab))


def _same_tree(got, want, what) -> None:
    """``got`` is ``want`` node for node (parents, tokens, depths; path scores to float32 rounding)."""
    assert got is not None and len(got) == len(want), what
    for f in ("parents", "tokens", "depth"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), (what, f)
    assert np.abs(got.logp - want.logp).max() < 1e-3 * max(1.0, np.abs(want.logp).max()), what


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_dartree_on_the_backend_is_the_hosts_dartree(pair, dartree_weaver, device):
    """``Weaver.dartree`` (the whole DARTree in one backend graph: every round's Weaver rows, the candidates'
    scores, the top-W branches and the global top-B on the device, only the chosen nodes read back) builds
    the tree ``tree.build_dartree`` builds with the Weaver on the host (``WeaverPaths``), node for node:
    random drafts, full and shorter depths, K from 3 to the Weaver's, widths 1-12, budgets beyond the
    supertree, beta 0 and below; what does not fit is refused."""
    from tfm_local.decode.tree import build_dartree
    from tfm_local.decode.weaver import TargetEmbeddings, WeaverPaths
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver

    d, target, drafter, _ = pair
    rt = RuntimeWeaver(dartree_weaver, device, 1)
    embed = TargetEmbeddings(target)
    sh = rt.shape
    ht, hd = _dartree_prefix(sh)
    with pytest.raises(ValueError, match="attach_target"):
        rt.dartree(3, ht, hd, np.zeros((2, 2), np.int32), np.zeros((2, 2)), 4)
    rt.attach_target(target)
    cases = [(sh["depth"], sh["top_k"], 12, 64, -0.2), (sh["depth"], sh["top_k"], 4, 16, 0.0),
             (3, 5, 2, 200, -0.5), (sh["depth"], 3, 1, 8, -0.2), (2, sh["top_k"], 12, 1, -0.1)]
    for i, (D, K, W, B, beta) in enumerate(cases):
        for seed in range(3):
            cand, logit, root = _random_draft(np.random.default_rng(100 * i + seed), embed.n_vocab, D, K)
            score = WeaverPaths(rt, embed, root, ht, hd, cand, logit, capacity=1 + W * D)
            _same_tree(rt.dartree(root, ht, hd, cand, logit, B, W, beta), build_dartree(root, cand, B, score, W, beta),
                       (i, seed))
    cand = np.zeros((2, 3), np.int32)
    for bad in (dict(cand=cand + embed.n_vocab), dict(beta=0.1), dict(cand=np.zeros((sh["depth"] + 1, 3), np.int32))):
        kw = {"cand": cand, "beta": -0.2, **bad}
        with pytest.raises(ValueError):
            rt.dartree(0, ht, hd, kw["cand"], np.zeros(kw["cand"].shape), 8, 2, kw["beta"])
    with pytest.raises(ValueError, match="cannot use the embeddings"):
        rt.attach_target(drafter)  # a GGUF without the target's embeddings


def _host_dartree(rt, embed, ht, hd, root, cand, logit, B, W, beta):
    """``tree.build_dartree``'s tree with the Weaver on the host (``WeaverPaths``), and its margin: the smallest
    gap (float64) between the last path score kept and the first left out, at each depth's top-W cut and at the
    global top-B cut (the backend's float32 scores match the host's to far less than the margins asked)."""
    from tfm_local.decode.tree import dartree_select, dartree_supertree
    from tfm_local.decode.weaver import WeaverPaths

    sup = dartree_supertree(cand, WeaverPaths(rt, embed, root, ht, hd, cand, logit, capacity=1 + W * len(cand)), W)
    _, depth, scores, _ = sup
    gaps = []
    for cut, n in [(-np.sort(-scores[depth == d]), W) for d in range(1, len(cand))] + \
                  [(-np.sort(-(scores + beta * depth)[1:]), B)]:
        if len(cut) > n:
            gaps.append(cut[n - 1] - cut[n])
    return dartree_select(root, cand, sup, B, beta), min(gaps, default=np.inf)


def _attached(path, target, device="cpu"):
    """The runtime Weaver of ``path`` on ``device`` (one CPU thread), attached to ``target``."""
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver

    rt = RuntimeWeaver(path, device, 1)
    rt.attach_target(target)
    return rt


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_dartree_on_the_backend_keeps_unlikely_candidates_finite(pair, dartree_weaver, device):
    """The drafter's logits ×60 (std 180): most candidates' log-probabilities are far below −87, where float32's
    exp underflows. The backend's log-softmax (z − max − log Σ exp(z − max)) keeps them finite, so its DARTree is
    still the host's node for node (a log of the softmax made them −inf: ties among the −inf children chose the
    live branches and the selection arbitrarily). Each draft is checked where the host's choices have a margin
    of 0.05 at every cut (the float32 path scores of depth ≤ 16 trees of |score| < 10⁴ are within 0.02 of the
    host's float64 ones, on any CPU's kernels; on the GPU, built with fast math, a log of the softmax flushed
    them to −inf from −87 down, the CPU's from −104); most drafts have it, at least three a case are required."""
    from tfm_local.decode.weaver import TargetEmbeddings

    d, target, _, _ = pair
    rt, embed = _attached(dartree_weaver, target, device), TargetEmbeddings(target)
    sh = rt.shape
    ht, hd = _dartree_prefix(sh)
    lowest = 0.0
    for i, (D, K, W, B, beta) in enumerate([(sh["depth"], sh["top_k"], 12, 64, -0.2),
                                            (sh["depth"], sh["top_k"], 4, 200, -0.5), (3, 5, 2, 30, -0.1)]):
        kept = 0
        for seed in range(12):
            cand, logit, root = _random_draft(np.random.default_rng(1000 * i + seed), embed.n_vocab, D, K, scale=180.0)
            want, margin = _host_dartree(rt, embed, ht, hd, root, cand, logit, B, W, beta)
            if margin < 0.05:
                continue
            kept += 1
            _same_tree(rt.dartree(root, ht, hd, cand, logit, B, W, beta), want, (i, seed))
            lowest = min(lowest, (want.logp[1:] - want.logp[want.parents[1:]]).min())  # a node's own log p
        assert kept >= 3, (i, kept)
    assert lowest < -200  # the trees hold candidates far beyond float32 exp's range


def test_dartree_graphs_are_bounded_and_trees_stay_the_hosts_after_eviction(pair, dartree_weaver):
    """One graph is kept per DARTree shape (depth, K, W, B, beta); with ``budget="auto"`` B changes from step to
    step, so the kept graphs are bounded: after trees of 50 budgets at most ``weaver_native.DARTREE_GRAPHS`` (8), the
    least recently used freed first. A budget whose graph was freed is rebuilt and a kept one reused: the same
    trees, the host's; a new attach frees them all."""
    from tfm_local.decode.tree import build_dartree
    from tfm_local.decode.weaver import TargetEmbeddings, WeaverPaths
    from tfm_local.llama import weaver_native

    d, target, _, _ = pair
    rt, embed = _attached(dartree_weaver, target), TargetEmbeddings(target)
    sh = rt.shape
    ht, hd = _dartree_prefix(sh)
    D, K, W, beta = sh["depth"], 8, 4, -0.2
    cand, logit, root = _random_draft(np.random.default_rng(5), embed.n_vocab, D, K)
    kept = lambda: weaver_native.weaver_dartree_graphs(rt._w)  # noqa: E731
    assert kept() == 0
    first = {}
    for B in range(1, 51):
        first[B] = rt.dartree(root, ht, hd, cand, logit, B, W, beta)
        assert kept() == min(B, weaver_native.DARTREE_GRAPHS), B
    rt.dartree(root, ht, hd, cand, logit, 43, W, beta)  # kept: 44 is now the least recently used
    rt.dartree(root, ht, hd, cand, logit, 1, W, beta)   # rebuilt in 44's place
    assert kept() == weaver_native.DARTREE_GRAPHS
    for B in (1, 2, 50, 44, 43, 25, 50):
        score = WeaverPaths(rt, embed, root, ht, hd, cand, logit, capacity=1 + W * D)
        got = rt.dartree(root, ht, hd, cand, logit, B, W, beta)
        _same_tree(got, first[B], B)
        _same_tree(got, build_dartree(root, cand, B, score, W, beta), B)
        assert kept() == weaver_native.DARTREE_GRAPHS
    rt.attach_target(target)
    assert kept() == 0


def _raw_dartree(rt, ht, hd, cand, logit, root, width, budget) -> int:
    """``tfm_weaver_dartree``'s return code, called directly (no Python checks), outputs sized as it writes them."""
    from tfm_local.llama import weaver_native

    ffi, h = weaver_native.lib()
    D, K = cand.shape
    rows = weaver_native.dartree_rows(D, K, width)
    live, sel = np.empty(max(1, sum(rows[1:])), np.float32), np.empty(min(budget, K * sum(rows)), np.float32)
    f = lambda a, t: ffi.cast(t, a.ctypes.data)  # noqa: E731
    c, cl = np.ascontiguousarray(cand, np.int32), np.ascontiguousarray(logit, np.float32)
    return h.tfm_weaver_dartree(rt._w, f(ht, "float *"), f(hd, "float *"), D, K, f(c, "int32_t *"), f(cl, "float *"),
                                root, width, budget, -0.2, f(live, "int32_t *"), f(live.copy(), "float *"),
                                f(sel, "int32_t *"), f(sel.copy(), "float *"))


def test_dartree_width_above_the_limit_is_refused_clearly(pair, dartree_weaver, capsys):
    """DARTree's width W (live branches a depth) costs O(W²) a depth in the backend graph's masks: a huge W ended
    in std::bad_alloc through the C API. Widths above ``weaver_native.DARTREE_MAX_WIDTH`` (256), K above
    ``DARTREE_MAX_TOP_K`` are refused: a ValueError naming the limit from ``Weaver.dartree`` and
    ``TfmDrafter.dartree`` (on the host builder's path too), -4 from the library itself, and exit status 2
    with one line from ``tfm-bench-trees --width``; W at the limit still builds the host's tree."""
    from tfm_local.bench.trees import main
    from tfm_local.decode.weaver import TargetEmbeddings, TfmDrafter
    from tfm_local.llama import weaver_native

    d, target, _, _ = pair
    rt, embed = _attached(dartree_weaver, target), TargetEmbeddings(target)
    ht, hd = _dartree_prefix(rt.shape)
    lim = weaver_native.DARTREE_MAX_WIDTH
    cand, logit, root = _random_draft(np.random.default_rng(9), embed.n_vocab, 3, 3)
    want, _ = _host_dartree(rt, embed, ht, hd, root, cand, logit, 16, lim, -0.2)
    _same_tree(rt.dartree(root, ht, hd, cand, logit, 16, lim, -0.2), want, lim)
    tfm = TfmDrafter(rt, embed)
    for width in (lim + 1, 10**6):
        with pytest.raises(ValueError, match=f"width {width} is outside 1..{lim}"):
            rt.dartree(root, ht, hd, cand, logit, 16, width, -0.2)
        with pytest.raises(ValueError, match=f"1..{lim}"):
            tfm.dartree(root, ht, cand, logit, hd, 16, width=width)
        assert _raw_dartree(rt, ht, hd, cand[:2], logit[:2], root, width, 16) == -4
    assert _raw_dartree(rt, ht, hd, cand[:2], logit[:2], root, lim, 16) > 0
    big = np.zeros((2, weaver_native.DARTREE_MAX_TOP_K + 1), np.int32)
    assert _raw_dartree(rt, ht, hd, big, np.zeros(big.shape), root, 2, 16) == -4
    with pytest.raises(ValueError, match=f"top_k {big.shape[1]} is outside"):
        rt.dartree(root, ht, hd, big, np.zeros(big.shape), 16, 2, -0.2)
    assert main(["--weaver", str(dartree_weaver), "--target", str(target), "--width", str(lim + 1)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfm-bench-trees: --width") and str(lim) in err and err.count("\n") == 1


def test_attach_target_does_not_read_the_weavers_file_again(pair, dartree_weaver, tmp_path):
    """The codes table is read with the rest of the Weaver at load: ``attach_target`` after the Weaver's file was
    replaced by a broken one, then deleted, still works and gives the trees of a Weaver attached while the file
    was there (it re-read the codes from the file: -1, "cannot use the embeddings")."""
    import shutil

    from tfm_local.decode.weaver import TargetEmbeddings
    from tfm_local.decode.weaver import Weaver as RuntimeWeaver

    d, target, _, _ = pair
    embed = TargetEmbeddings(target)
    ref = _attached(dartree_weaver, target)
    path = tmp_path / "w.gguf"
    shutil.copy(dartree_weaver, path)
    rt = RuntimeWeaver(path, "cpu", 1)
    ht, hd = _dartree_prefix(rt.shape)
    path.write_bytes(b"GGUF" + bytes(64))
    for step in ("replaced", "deleted"):
        rt.attach_target(target)
        for seed in range(3):
            cand, logit, root = _random_draft(np.random.default_rng(seed), embed.n_vocab, rt.shape["depth"], 8)
            _same_tree(rt.dartree(root, ht, hd, cand, logit, 32, 6, -0.2),
                       ref.dartree(root, ht, hd, cand, logit, 32, 6, -0.2), (step, seed))
        path.unlink(missing_ok=True)


def test_tfm_bench_trees_refuses_bad_input_clearly(pair, tmp_path, capsys):
    """tfm-bench-trees: bad budgets, a positive beta, an unknown device, a missing Weaver or an unreadable
    target end with one clear line and exit status 2, no traceback; a small run prints its table and JSON."""
    import json

    from tfm_local.bench.trees import main
    from tfm_local.train.weaver_fit import export_weaver

    d, target, drafter, _ = pair
    for argv, msg in ((["--budgets", "1,x"], "--budgets"), (["--beta", "0.1"], "--beta"),
                      (["--devices", "tpu"], "--devices"), (["--target", str(drafter) + ".nope"], "target"),
                      (["--weaver", str(tmp_path / "none.gguf")], "none.gguf")):
        kw = {"--weaver": str(tmp_path / "none.gguf"), "--target": str(target)}
        kw.update(dict(zip(argv[::2], argv[1::2])))
        assert main([x for kv in kw.items() for x in kv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tfm-bench-trees: ") and msg in err and "Traceback" not in err
    res = fit_weaver(d / "corpus", target, drafter, tmp_path / "w", WeaverOptions(steps=2, **OPTS), "cpu",
                     log=lambda s: None)
    w = export_weaver(res["checkpoint"], target, tmp_path / "export", ("f32",))["f32"]
    assert main(["--weaver", str(w), "--target", str(target), "--budgets", "8", "--drafts", "2", "--devices", "cpu",
                 "--threads", "1", "--json", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    rows = doc["rows"]
    assert len(rows) == 1 and rows[0]["same"] == 2 and rows[0]["dartree_ms"] > 0
    assert problems(doc["provenance"], ["weaver", "target"]) == []
