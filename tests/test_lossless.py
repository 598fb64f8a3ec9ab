"""tfm_local.lossless: where two greedy outputs diverge, and whether that is a numerical near-tie."""
import numpy as np
import pytest

from tfm_local.lossless import CPU_TIE_GAP, TIE_GAP, WIDE_TIE_GAP, classify, first_divergence, tie_gap
from tfm_local.decode.verify import Target

from tfm_local.testing.synth import write_tiny_target

PROMPT = [11, 42, 7, 99, 3, 250, 18]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny_target(tmp_path_factory.mktemp("lossless") / "t.gguf", n_layer=2, seed=3)
    t = Target(path, n_ctx=128, n_batch=32, n_threads=1)
    yield t
    t.close()


def greedy(t, n):
    out = [int(np.argmax(t.prefill(PROMPT)))]
    while len(out) < n:
        out.append(int(np.argmax(t.prefill(PROMPT + out))))
    return out


@pytest.mark.parametrize("ref,out,want", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([4], [], 0)])
def test_first_divergence(ref, out, want):
    assert first_divergence(ref, out) == want


def test_equal_outputs_have_no_divergence(target):
    ref = greedy(target, 4)
    assert classify(target, PROMPT, ref, list(ref)) is None


def test_length_only_difference_is_not_a_tie(target):
    ref = greedy(target, 4)
    d = classify(target, PROMPT, ref, ref[:2])
    assert (d.index, d.ref_token, d.out_token, d.gaps, d.near_tie) == (2, ref[2], None, None, False)


def test_second_best_token_is_a_tie_only_within_the_gap(target):
    ref = greedy(target, 4)
    logits = np.asarray(target.prefill(PROMPT + ref[:2]), dtype=np.float64)
    second = int(np.argsort(-logits)[1])
    gap = float(logits.max() - logits[second])
    out = ref[:2] + [second, 9]
    d = classify(target, PROMPT, ref, out, gap=gap * 1.01)
    assert d.index == 2 and d.out_token == second and d.near_tie
    assert d.gaps == pytest.approx((0.0, gap))
    assert not classify(target, PROMPT, ref, out, gap=gap * 0.99).near_tie
    worst = int(np.argmin(logits))
    assert not classify(target, PROMPT, ref, ref[:2] + [worst]).near_tie or logits.max() - logits.min() < tie_gap(target)


def test_the_default_gap_follows_the_backend(target):
    """CPU targets get the gap measured on the CPU, GPU targets the CUDA one."""
    assert tie_gap(target) == (TIE_GAP if target.model.on_gpu else CPU_TIE_GAP)
    class OnGpu:
        class model:
            on_gpu = True
    assert tie_gap(OnGpu(), 8) == TIE_GAP and tie_gap(object()) == CPU_TIE_GAP
    # CUDA: passes of 16 nodes or more move gaps by up to 1.44 (H200), the CPU's gap holds for every size
    assert tie_gap(OnGpu()) == tie_gap(OnGpu(), 16) == tie_gap(OnGpu(), 65) == WIDE_TIE_GAP > 1.44
    assert tie_gap(object(), 65) == CPU_TIE_GAP


def test_relative_gap_scales_with_the_largest_logit(target):
    ref = greedy(target, 4)
    logits = np.asarray(target.prefill(PROMPT + ref[:2]), dtype=np.float64)
    second = int(np.argsort(-logits)[1])
    rel = float(logits.max() - logits[second]) / np.abs(logits).max()
    out = ref[:2] + [second]
    assert classify(target, PROMPT, ref, out, gap=0.0, rel=rel * 1.01).near_tie
    assert not classify(target, PROMPT, ref, out, gap=1e9, rel=rel * 0.99).near_tie


def test_penalties_apply_to_the_row(target):
    """With a generation's penalties the gaps are those of the penalised row: presence and frequency
    penalties on the tokens of ``ref`` before the divergence (the prompt does not count)."""
    from tfm_local.decode.sampling import SamplingParams

    ref = greedy(target, 4)
    raw = np.array(target.prefill(PROMPT + ref[:2]), dtype=np.float32)
    out = ref[:2] + [int(np.argsort(-raw)[1])]  # the second best
    sp = SamplingParams(presence_penalty=1.5, frequency_penalty=0.5)
    pen = raw.copy()
    for t in ref[:2]:
        pen[t] -= np.float32(0.5)
    for t in set(ref[:2]):
        pen[t] -= np.float32(1.5)
    pen = pen.astype(np.float64)
    d = classify(target, PROMPT, ref, out, gap=1e9, sp=sp)
    assert d.index == 2 and d.gaps == pytest.approx((pen.max() - pen[ref[2]], pen.max() - pen[out[2]]), abs=1e-5)
    plain = classify(target, PROMPT, ref, out, gap=1e9)
    assert plain.gaps == pytest.approx((raw.max() - raw[ref[2]], raw.max() - raw[out[2]]), abs=1e-5)
    assert (plain.gaps != d.gaps) == bool({ref[2], out[2]} & set(ref[:2]))


def test_cpu_chains_of_at_most_16_nodes_are_exact_there_is_no_near_tie(target, tmp_path):
    """On the CPU a chain of at most 16 nodes on a target of the small-batch types is batch-invariant
    (patch 0015): its tie gap is 0, so a divergence at the second-best token is a bug there, while a
    tree, a wider pass, a GPU target or a target with another weight type keeps the measured gap."""
    from types import SimpleNamespace

    from tfm_local.lossless import SMALL_BATCH_ROWS, batch_invariant, weight_types

    assert weight_types(target.model.path) <= {0, 2, 8, 12, 14}
    assert batch_invariant(target, SMALL_BATCH_ROWS, chain=True) and tie_gap(target, 16, chain=True) == 0.0
    assert not batch_invariant(target, SMALL_BATCH_ROWS + 1, chain=True) and tie_gap(target, 17, chain=True) == CPU_TIE_GAP
    assert not batch_invariant(target, 4, chain=False) and tie_gap(target, 4) == CPU_TIE_GAP
    assert not batch_invariant(target, None, chain=True)
    gpu = SimpleNamespace(model=SimpleNamespace(on_gpu=True, path=target.model.path))
    assert not batch_invariant(gpu, 4, chain=True) and tie_gap(gpu, 4, chain=True) == TIE_GAP
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "f16.gguf"), "qwen2")  # a file with an F16 weight takes the GEMMs
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 32), dtype=np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert weight_types(tmp_path / "f16.gguf") == {1}
    assert not batch_invariant(SimpleNamespace(model=SimpleNamespace(on_gpu=False, path=tmp_path / "f16.gguf")), 4, True)
    assert not batch_invariant(SimpleNamespace(model=SimpleNamespace(on_gpu=False, path=tmp_path / "none")), 4, True)
    ref = greedy(target, 4)
    logits = np.asarray(target.prefill(PROMPT + ref[:2]), dtype=np.float64)
    second = int(np.argsort(-logits)[1])
    out = ref[:2] + [second, 9]
    assert classify(target, PROMPT, ref, out, n_nodes=8).near_tie == (logits.max() - logits[second] < CPU_TIE_GAP)
    assert not classify(target, PROMPT, ref, out, n_nodes=8, chain=True).near_tie
