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
]


def test_keyword_rule_reads_the_last_user_message():
    assert keyword_ranks(PROMPTS, np.arange(len(PROMPTS))).tolist() == [0, 3, 4, 6]
    assert keyword_ranks(PROMPTS, np.array([1, 2, 5])).tolist() == []
    assert keyword_ranks(PROMPTS, np.array([6, 0, 0])).tolist() == [0, 6]
    with pytest.raises(TrainError, match="past the 7 prompts"):
        keyword_ranks(PROMPTS, np.array([7]))


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
    with pytest.raises(FileNotFoundError):
        load_emphasis(tmp_path / "gone.npz")


def _seq(rank, order, tag):
    return Sequence(ids=np.array([tag, rank], np.int32), prompt_len=1, prompt_index=rank, prompt_order=order)


def test_emphasise_repeats_the_named_prompts_of_its_order_only(tmp_path):
    seqs = [_seq(r, '"a"', 1) for r in range(5)] + [_seq(r, '"b"', 2) for r in range(5)]
    path = save_emphasis(tmp_path / "e.npz", np.array([1, 3]), '"a"', "test")
    out, n = emphasise(seqs, path, 3)
    assert n == 2 and out[:10] == seqs
    assert [(s.prompt_order, s.prompt_index) for s in out[10:]] == [('"a"', 1), ('"a"', 3)] * 2
    assert emphasise(seqs, path, 1) == (seqs, 0) and emphasise(seqs, None, 4) == (seqs, 0)
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
