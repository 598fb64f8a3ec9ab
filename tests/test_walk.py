"""The held-out τ measured as the engine does (tfm_local/train/walk.py), on a tiny synthetic target and
drafter (CPU): the step rule, the batched drafting of every anchor against drafting each step from its
own context, DDTree, per-kind reports, the fit's log and the ``walk`` and ``kinds`` commands."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tfm_local.testing import synth  # noqa: E402
from tfm_local.train.corpus import Sequence, append_shard, new_manifest, order_key, target_identity  # noqa: E402
from tfm_local.train.errors import CorruptArtifactError, TrainError  # noqa: E402
from tfm_local.train.walk import walk, walk_tau  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    """Every test here on one torch thread (``conftest.one_torch_thread``)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target path, TorchTarget, a random 1-layer drafter of it)."""
    from tfm_local.train.warmstart import drafter_config
    from tfm_local.train.model import DFlashDraft
    from tfm_local.train.target_torch import TorchTarget

    path = synth.write_tiny_target(tmp_path_factory.mktemp("walk") / "t.gguf")
    torch.manual_seed(0)
    drafter = DFlashDraft(drafter_config(path, 1, 32)).eval()
    return path, TorchTarget(path), drafter


def test_walk_takes_the_engines_steps():
    """Each step emits its accepted drafts plus the target's token; the response's end and the generation
    cap (which counts the prefill's token) cut the last steps, as bench.replay.replay_chain's rule."""
    asked = []

    def three(i, k):
        asked.append((i, k))
        return min(3, k)

    assert walk(20, 256, 15, three) == (5, 19)  # anchors 0, 4, 8, 12, 16: the last emits the 3 tokens left
    assert [i for i, _ in asked] == [0, 4, 8, 12, 16]
    asked.clear()
    assert walk(20, 10, 15, three) == (3, 9)  # cap 10: 1 + 4 + 4 + 1
    assert asked == [(0, 8), (4, 4)]  # the last step drafts nothing (no room for a draft and the bonus)
    assert walk(1, 256, 15, three) == (0, 0)  # a one-token response: the prefill's token, no step


def _grow(drafter, target, prompt, accept, rng, n_vocab=300):
    """A response built step by step from the drafter's own chain drafted on the context so far alone:
    at each step the first ``accept[s]`` drafts, then a token other than the next draft (the target's
    bonus). Returns (prompt + response ids, steps taken)."""
    from tfm_local.train.walk import block_candidates

    ids = list(prompt) + [int(rng.integers(0, n_vocab))]
    for a in accept:
        cand, _ = block_candidates(drafter, target, torch.tensor(ids + [0]), len(prompt), 1, False)
        chain = cand[-1, :, 0]  # the block anchored on the last token, which sees only the tokens before it
        other = (int(chain[a]) + 1) % n_vocab if a < len(chain) else int(rng.integers(0, n_vocab))
        ids += [int(t) for t in chain[:a]] + [other]
    return np.array(ids, np.int32)


def test_batched_anchors_walk_as_steps_drafted_one_by_one(pair):
    """A response whose every step accepts a known number of drafts (each block drafted from the context
    before it alone): walk_tau's chain, drafted for all anchors in batched passes over the whole
    sequence, takes exactly those steps; a tree of one candidate a position is the chain."""
    _, target, drafter = pair
    rng = np.random.default_rng(3)
    accept = [4, 0, 15, 2, 7, 1]
    ids = _grow(drafter, target, [5, 6, 7, 8], accept, rng)
    seq = Sequence(ids, 4, 0)
    res = walk_tau(drafter, target, [seq], torch.device("cpu"), False, trees=(15,), top_k=1)
    steps, tokens = len(accept), sum(a + 1 for a in accept)
    assert res["walk_sequences"] == 1
    assert res["walk_chain"] == pytest.approx(tokens / steps)
    assert res["walk_ddtree@15"] == pytest.approx(res["walk_chain"])
    wide = walk_tau(drafter, target, [seq], torch.device("cpu"), False)
    assert wide["walk_ddtree@16"] >= wide["walk_chain"] == res["walk_chain"]


def test_walk_tau_pools_steps_and_reports_kinds(pair):
    """τ pools tokens over steps across sequences (tfm-bench's); per kind over that kind's sequences."""
    _, target, drafter = pair
    rng = np.random.default_rng(4)
    a = Sequence(_grow(drafter, target, [1, 2, 3], [9, 9], rng), 3, 0)
    b = Sequence(_grow(drafter, target, [4, 5], [0, 0, 0, 1], rng), 2, 1)
    res = walk_tau(drafter, target, [a, b], torch.device("cpu"), False, kinds=["code", "writing"])
    assert res["walk_chain/code"] == pytest.approx(10.0)
    assert res["walk_chain/writing"] == pytest.approx(5 / 4)
    assert res["walk_chain"] == pytest.approx(25 / 6)  # not the mean of 10 and 1.25
    assert res["walk_sequences/code"] == res["walk_sequences/writing"] == 1 and res["walk_sequences"] == 2
    capped = walk_tau(drafter, target, [a], torch.device("cpu"), False, max_tokens=8)
    assert capped["walk_chain"] == pytest.approx(7.0)  # the cap: one step of 1 + 6 drafts cut to 7 tokens


def test_prompt_kinds_and_kinds_file(tmp_path):
    from tfm_local.train.emphasis import load_kinds, prompt_kind, save_kinds

    assert prompt_kind("Act as a pirate and greet me") == "roleplay"
    assert prompt_kind([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                        {"role": "user", "content": "Write a Python function to sort a list"}]) == "code"
    assert prompt_kind("Solve the equation 3x + 2 = 11") == "math"
    assert prompt_kind("Write a poem about autumn") == "writing"
    assert prompt_kind("What is the capital of France?") == "other"
    save_kinds(tmp_path / "k.npz", [2, 5], ["code", "math"], order_key({"seed": 0}, 1024))
    assert load_kinds(tmp_path / "k.npz") == (order_key({"seed": 0}, 1024), {2: "code", 5: "math"})
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CorruptArtifactError, match="bad.npz is not a kinds file"):
        load_kinds(tmp_path / "bad.npz")


def _corpus(folder, target, n=12, seed=0):
    rng = np.random.default_rng(seed)
    sel = {"seed": 0}
    m = new_manifest(target_identity(target), sel, {"max_new_tokens": 32, "max_prompt_tokens": 64})
    seqs = [Sequence(rng.integers(0, 300, size=int(rng.integers(12, 40))).astype(np.int32), 4, i) for i in range(n)]
    append_shard(folder, m, seqs, (0, n))
    return order_key(sel, 64)


def test_fit_logs_the_walk_at_the_start_and_the_end_per_kind(pair, tmp_path):
    """A warm-started fit with held-out sequences and a kinds file: the step-0 and the last held-out lines
    carry the walked chain and DDTree@16 τ, per kind; the evaluations between carry none. A kinds file of
    another prompt order is refused."""
    from tfm_local.train.emphasis import save_kinds
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config
    from tfm_local.train.recipe import FitOptions

    path = pair[0]
    order = _corpus(tmp_path / "c", path)
    save_kinds(tmp_path / "k.npz", list(range(12)), ["code", "math"] * 6, order)
    opts = FitOptions(epochs=50, lr=1e-3, batch_tokens=512, anchors=4, max_len=64, max_steps=4, log_every=1,
                      holdout=4, eval_every=2, save_every=100)
    src = fit(tmp_path / "c", path, tmp_path / "a", FitOptions(**{**opts.__dict__, "max_steps": 1}),
              drafter_config(path, 1, 32), progress=False)
    fit(tmp_path / "c", path, tmp_path / "b", opts, None, progress=False, init_from=src, kinds=tmp_path / "k.npz")
    held = [x for x in map(json.loads, (tmp_path / "b" / "log.jsonl").read_text().splitlines()) if "heldout_loss" in x]
    assert [x["step"] for x in held] == [0, 2, 4]
    assert "walk_chain" not in held[1]
    for x in (held[0], held[2]):
        assert x["walk_sequences"] == 4 and x["walk_sequences/code"] == x["walk_sequences/math"] == 2
        assert 1.0 <= x["walk_chain"] <= x["walk_ddtree@16"] <= 16.0
        assert {"walk_chain/code", "walk_ddtree@16/math"} <= set(x)
    save_kinds(tmp_path / "other.npz", [0], ["code"], order_key({"seed": 1}, 64))
    with pytest.raises(TrainError, match="another prompt order"):
        fit(tmp_path / "c", path, tmp_path / "d", opts, None, progress=False, init_from=src,
            kinds=tmp_path / "other.npz")


def test_cli_walk_reads_a_sequence_file(pair, tmp_path, capsys):
    """``tfm-train walk``: each drafter's τ over a sequence file's responses, per kind, under the file's cap;
    a corrupt file is one clear line."""
    from tfm_local.cli.train import main
    from tfm_local.train.fit import fit
    from tfm_local.train.warmstart import drafter_config
    from tfm_local.train.recipe import FitOptions
    from tfm_local.train.walk import load_sequences, save_sequences

    path, target, drafter = pair
    rng = np.random.default_rng(5)
    seqs = [Sequence(_grow(drafter, target, [1, 2], [3, 5], rng), 2, 0),
            Sequence(_grow(drafter, target, [3], [1], rng), 1, 1)]
    save_sequences(tmp_path / "s.npz", seqs, ["humaneval", "mtbench"], 256)
    back, kinds, cap = load_sequences(tmp_path / "s.npz")
    assert [s.ids.tolist() for s in back] == [s.ids.tolist() for s in seqs] and cap == 256
    _corpus(tmp_path / "c", path)
    ckpt = fit(tmp_path / "c", path, tmp_path / "a", FitOptions(max_steps=1, batch_tokens=512, anchors=4, max_len=64),
               drafter_config(path, 1, 32), progress=False)
    main(["walk", "--target", str(path), "--drafter", str(ckpt), "--seqs", str(tmp_path / "s.npz"),
          "--device", "cpu", "--json", str(tmp_path / "w.json")])
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["walk_sequences/humaneval"] == row["walk_sequences/mtbench"] == 1
    assert json.loads((tmp_path / "w.json").read_text())["results"] == [row]
    (tmp_path / "bad.npz").write_bytes(b"x")
    with pytest.raises(SystemExit):
        main(["walk", "--target", str(path), "--drafter", str(ckpt), "--seqs", str(tmp_path / "bad.npz"),
              "--device", "cpu"])
    assert "bad.npz is not a sequence file" in capsys.readouterr().err
