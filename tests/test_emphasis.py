"""Emphasis files (tfm_local.train.emphasis): the keyword rule, the file, the repetition of sequences,
the `tfm-train emphasis` command on real ShareGPT prompts. The fit with --emphasis is tested in
test_train.py (it reuses that module's trained smoke artifacts)."""
import json

import numpy as np
import pytest

from tfm_local.train.corpus import Sequence
from tfm_local.train.emphasis import emphasise, keyword_ranks, load_emphasis, save_emphasis
from tfm_local.train.errors import CorruptArtifactError, TrainError

PROMPTS = [
    "Write a short story about a lighthouse keeper.",                       # 0 writing
    "How do I reverse a linked list in Python?",                            # 1
    [{"role": "user", "content": "Write a poem"}, {"role": "assistant", "content": "Roses..."},
     {"role": "user", "content": "Now explain recursion in C."}],          # 2 last turn: not writing
    "I want you to act as a travel guide in Rome.",                         # 3 role-play
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
     {"role": "user", "content": "Pretend you are a pirate captain and greet me."}],  # 4 role-play
    "What is 17 * 23?",                                                     # 5
    "Compose an email to my landlord about the broken heater.",             # 6 writing
    "Write a python script that renames files, in the style of a poem.",    # 7 code: not writing
    [{"role": "system", "content": "Write a story."}],                     # 8 no user message
]


def test_keyword_rule_reads_the_last_user_message():
    assert keyword_ranks(PROMPTS, np.arange(len(PROMPTS))).tolist() == [0, 3, 4, 6]
    assert keyword_ranks(PROMPTS, np.array([1, 2, 5])).tolist() == []
    assert keyword_ranks(PROMPTS, np.array([6, 0, 0])).tolist() == [0, 6]
    assert keyword_ranks(PROMPTS, np.array([7, 8])).tolist() == []
    with pytest.raises(TrainError, match="past the 9 prompts"):
        keyword_ranks(PROMPTS, np.array([9]))


def test_file_roundtrip_and_bad_files(tmp_path):
    p = save_emphasis(tmp_path / "e.npz", np.array([9, 2, 2]), '["order"]', "rule")
    assert load_emphasis(p) == ('["order"]', {2, 9})
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CorruptArtifactError, match="not an emphasis file"):
        load_emphasis(tmp_path / "bad.npz")
    np.savez(tmp_path / "noorder.npz", ranks=np.array([1]))
    with pytest.raises(CorruptArtifactError, match="not an emphasis file"):
        load_emphasis(tmp_path / "noorder.npz")
    np.savez(tmp_path / "neg.npz", ranks=np.array([-1]), order=np.frombuffer(b'"o"', np.uint8))
    with pytest.raises(CorruptArtifactError, match="non-negative"):
        load_emphasis(tmp_path / "neg.npz")
    (tmp_path / "cut.npz").write_bytes(p.read_bytes()[:300])
    (tmp_path / "empty.npz").write_bytes(b"")
    np.save(tmp_path / "ranks.npy", np.array([1, 2]))
    for bad in ("cut.npz", "empty.npz", "ranks.npy"):  # a truncated zip, an empty file, a bare array
        with pytest.raises(CorruptArtifactError, match="not an emphasis file"):
            load_emphasis(tmp_path / bad)
    with pytest.raises(FileNotFoundError, match="emphasis file not found"):
        load_emphasis(tmp_path / "gone.npz")
    with pytest.raises(TrainError, match=">= 0"):
        save_emphasis(tmp_path / "n.npz", np.array([3, -2]), '"o"', "rule")


def _seq(rank, order, tag):
    return Sequence(ids=np.array([tag, rank], np.int32), prompt_len=1, prompt_index=rank, prompt_order=order)


def test_emphasise_repeats_the_named_prompts_of_its_order_only(tmp_path):
    seqs = [_seq(r, '"a"', 1) for r in range(5)] + [_seq(r, '"b"', 2) for r in range(5)]
    path = save_emphasis(tmp_path / "e.npz", np.array([1, 3]), '"a"', "test")
    out, n = emphasise(seqs, path, 3)
    assert n == 2 and out[:10] == seqs
    assert [(s.prompt_order, s.prompt_index) for s in out[10:]] == [('"a"', 1), ('"a"', 3)] * 2
    assert emphasise(seqs, path, 1) == (seqs, 2) and emphasise(seqs, None, 4) == (seqs, 0)
    with pytest.raises(FileNotFoundError):  # read even when nothing is repeated
        emphasise(seqs, tmp_path / "gone.npz", 1)
    with pytest.raises(TrainError, match=">= 1"):
        emphasise(seqs, path, 0)
    other = save_emphasis(tmp_path / "o.npz", np.array([1]), '"c"', "test")
    with pytest.raises(TrainError, match="another prompt order"):
        emphasise(seqs, other, 2)


def test_cli_emphasis_on_sharegpt_prompts(tmp_path, capsys):
    """`tfm-train emphasis` over a prompt file of the first 300 ShareGPT conversations: the ranks it
    writes are the rule's hits among the file's kept prompts, in the prompt order a corpus of that
    file records."""
    from tfm_local.cli.train import main
    from tfm_local.train.prompts import PromptFile, Selection, select_prompts

    sel = Selection(scan_limit=300)
    texts = select_prompts(sel)
    ids = [None if r % 5 == 0 else np.array([1, 2], np.int32) for r in range(len(texts))]
    PromptFile(ids, [0], {"selection": sel.to_dict(), "target": {}, "max_prompt_tokens": 1024}).save(tmp_path / "p.npz")
    main(["emphasis", "--prompts", str(tmp_path / "p.npz"), "--out", str(tmp_path / "e.npz")])
    order, ranks = load_emphasis(tmp_path / "e.npz")
    kept = [r for r in range(len(texts)) if r % 5]
    assert ranks == set(keyword_ranks(texts, np.array(kept)).tolist()) and ranks and all(r % 5 for r in ranks)
    assert json.loads(order) == [sel.to_dict(), 1024]
    assert f"{len(ranks)} of {len(kept)} prompts" in capsys.readouterr().out


def test_cli_emphasis_times_needs_emphasis(tmp_path, capsys):
    from tfm_local.cli.train import main

    with pytest.raises(SystemExit):
        main(["fit", "--corpus", str(tmp_path), "--target", str(tmp_path / "t.gguf"), "--out", str(tmp_path / "r"),
              "--emphasis-times", "3"])
    assert "--emphasis-times needs --emphasis" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--corpus", str(tmp_path), "--target", "t", "--out", "r", "--emphasis-times", "x"])
    assert "must be an integer >= 1, got 'x'" in capsys.readouterr().err
