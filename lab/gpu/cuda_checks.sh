#!/usr/bin/env bash
# On one GPU (GPU, default 1) once the CUDA build and the corpus are done, cheapest-first so that a short
# hold still brings the decisive numbers: tfm-bench plain / chain / DDTree@8/16/32, the tree-GDN op at 128
# nodes on the synthetic tree and on five real DDTree@128 trees, upstream's DFlash chain (if
# upstream_build.sh finished), then the CUDA tests and compute-sanitizer runs (QUICK=1: no traces, no GDN).
# llama.cpp runs with THREADS (default 4) host threads: with every core in its pool, a fit on the other
# GPU (which keeps host cores busy) slowed plain decoding from ~550 to ~220 tokens/s in the ninth session.
# Outputs in ${ST:-~/st}/cuda/; ${ST:-~/st}/cuda.done at the end (whatever happened).
set -uo pipefail
. ~/env.sh
# timing.done once the timings are done (a fit on this GPU may start then: the tests and sanitizer runs
# after it are correctness only), cuda.done at the end; both also on a failed build or a killed check
trap 'touch ${ST:-~/st}/timing.done ${ST:-~/st}/cuda.done' EXIT
built() { [ -e ${ST:-~/st}/build.done ] || { [ -e ~/llama/llama_cpp/__init__.py ] &&
  ! pgrep -f "build.build_wheel|--target $HOME/llama" > /dev/null; }; }
while ! built || [ ! -e ${ST:-~/st}/gen.done ]; do
  [ -e ${ST:-~/st}/build.failed ] && { echo "the CUDA build failed: ${ST:-~/st}/build.log"; exit 1; }
  sleep 5
done
cd ~/repo
export CUDA_VISIBLE_DEVICES=${GPU:-1}
O=${ST:-~/st}/cuda; mkdir -p $O
T=~/w/model.gguf
# the shipped drafter (on a GPU "auto" is the full draft vocabulary: the fourteenth session's A/B of the
# reduced one gained no drafter time and lost 1-3% of tau; VOCAB_AB=1 runs that A/B again with the ids)
python3 -m tfm_local.bench --target $T --drafter auto --threads ${THREADS:-4} \
  --modes plain,chain,ddtree@8,ddtree@16,ddtree@32 -n 10 --max-tokens 256 --no-plot --json $O/bench.json \
  > $O/bench.txt 2>&1
[ -n "${VOCAB_AB:-}" ] && python3 -m tfm_local.bench --target $T --drafter auto --threads ${THREADS:-4} \
  --draft-vocab $(ls ~/repo/tfm_local/assets/*.draft-vocab.npy | head -1) \
  --modes plain,chain,ddtree@8,ddtree@16,ddtree@32 -n 10 --max-tokens 256 --no-plot --json $O/bench-vocab-ids.json \
  > $O/bench-vocab-ids.txt 2>&1
touch ${ST:-~/st}/ab.done
# QUICK=1: no graph traces and no tree-GDN timings (measured in earlier sessions): GPU 1 is free sooner
if [ -z "${QUICK:-}" ]; then
# which decode calls keep their graph and their CUDA graph, per context and call kind (the tenth session's
# CPU trace: the target reuses its verify graph, the drafter, alternating injection and block, never does)
for m in chain ddtree; do
  TFM_VERBOSE=1 LLAMA_GRAPH_RESULT_DEBUG=1 python3 lab/trace_graphs.py --target $T --gpu --mode $m --budget 15 --tokens 64 \
    > $O/trace-$m.log 2>&1
  echo "== $m"; python3 lab/trace_graphs.py --summarize $O/trace-$m.log
done > $O/graphs.txt
# tree GDN at 128 nodes: the synthetic tree of earlier sessions, then five real DDTree@128 trees of the
# shipped drafter (docs/results/trees-ddtree128.npz, from lab/capture_trees.py), spread over their per-branch cost
G="python3 -m tfm_local.bench gdn --device gpu --iters 30 --repeat 8 --rounds 5 --threads ${THREADS:-4}"
$G --nodes 128 --json $O/gdn.json > $O/gdn.txt 2>&1
$G --trees docs/results/trees-ddtree128.npz --tree-count 5 --json $O/gdn-real.json > $O/gdn-real.txt 2>&1
touch ${ST:-~/st}/gdn.done
fi
# upstream's chain with the same (vocabulary-attached) drafter
for i in $(seq 24); do [ -e ${ST:-~/st}/up.done ] || [ -e ${ST:-~/st}/up.failed ] && break; sleep 5; done
D=$(python3 -c "from pathlib import Path; from tfm_local.files.drafters import shipped_drafter_for; print(shipped_drafter_for(Path('$T'), 'full'))")
[ -e ${ST:-~/st}/up.done ] && python3 -m tfm_local.bench.upstream --binary ~/up/b/bin/llama-speculative-simple \
  --target $T --drafter "$D" -n 10 --json $O/bench-upstream.json > $O/bench-upstream.txt 2>&1
touch ${ST:-~/st}/timing.done
TESTS="tests/test_tree_gdn_ops.py tests/test_top_k_op.py tests/test_greedy_argmax.py tests/test_drafter_topk.py
  tests/test_tree_verify.py tests/test_tree_gdn_model.py tests/test_draft_vocab.py tests/test_drafter_graphs.py"
python3 -m pytest -q -p no:cacheprovider -ra $TESTS > $O/tests.log 2>&1
# (other solve warp counts: apply ggml_ops/dev/cuda-gdn-tree-ab-switches.patch and set TFM_CUDA_GDN_SOLVE_WARPS)
# the level-ordered solve under compute-sanitizer (the real library, through the op tests on the GPU: trees to 160 nodes,
# paths deeper than 32): shared-memory races, out-of-bounds accesses, barrier misuse
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
for tool in racecheck memcheck synccheck; do
  [ -n "$CS" ] && timeout 300 $CS --tool $tool --target-processes all --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/test_tree_gdn_ops.py -k "gpu and (deeper or ddtree)" \
    > $O/sanitizer-$tool.txt 2>&1
done

