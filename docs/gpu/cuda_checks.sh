#!/usr/bin/env bash
# On one GPU (GPU, default 1) once the CUDA build and the corpus are done, cheapest-first so that a short
# hold still brings the decisive numbers: patch 0012's test, the target pass and tfm-bench with and without
# its one-block-per-tile MMQ (TFM_CUDA_MMQ_TILES_MAX_COLS), the tree-GDN op at 128 nodes with and without
# patch 0013's solve (TFM_CUDA_GDN_SOLVE=2) and an ncu profile of its kernels, upstream's DFlash chain (if
# upstream_build.sh finished), then the CUDA tests.
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
python3 -m pytest -q -p no:cacheprovider -ra tests/test_cuda_mmq_tiles.py > $O/tests-tiles.log 2>&1
# patch 0012: one target pass of n tokens, stream-k MMQ (upstream) vs one CUDA block per tile
P="python3 -m tfm_local.cli.bench_pass --target $T --tokens 1,8,9,12,16,24,32 --variants argmax --drafter auto"
$P --json $O/pass-streamk.json > $O/pass-streamk.txt 2>&1
TFM_CUDA_MMQ_TILES_MAX_COLS=64 $P --json $O/pass-tiles.json > $O/pass-tiles.txt 2>&1
for v in "" 64; do
  TFM_CUDA_MMQ_TILES_MAX_COLS=$v python3 -m tfm_local.cli.bench --target $T --drafter auto \
    --modes plain,chain,ddtree@8,ddtree@16,ddtree@32 -n 10 --max-tokens 256 --no-plot --json $O/bench-tiles$v.json \
    > $O/bench-tiles$v.txt 2>&1
done
touch ${ST:-~/st}/ab.done
# tree GDN at 128 nodes: today's solve kernel and patch 0013's level-ordered one, then where the kernels spend their time
G="python3 -m tfm_local.cli.bench_gdn --device gpu --iters 50 --repeat 8 --nodes 128"
$G --json $O/gdn-solve1.json > $O/gdn-solve1.txt 2>&1
TFM_CUDA_GDN_SOLVE=2 $G --json $O/gdn-solve2.json > $O/gdn-solve2.txt 2>&1
TFM_CUDA_GDN_SOLVE=2 TFM_CUDA_GDN_SOLVE_WARPS=16 $G --json $O/gdn-solve2-w16.json > $O/gdn-solve2-w16.txt 2>&1
for k in solve; do
  TFM_CUDA_GDN_SOLVE=2 TFM_CUDA_GDN_TREE_TWICE=$k $G --json $O/gdn-solve2-twice-$k.json > $O/gdn-solve2-twice-$k.txt 2>&1
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2> /dev/null)
[ -n "$NCU" ] && TFM_CUDA_GDN_SOLVE=2 $NCU --set full --kernel-name regex:gated_delta_net_tree --launch-skip 30 \
  --launch-count 3 python3 -m tfm_local.cli.bench_gdn --device gpu --nodes 128 --iters 10 > $O/ncu-gdn.txt 2>&1
touch ${ST:-~/st}/gdn.done
# upstream's chain with the same (vocabulary-attached) drafter
for i in $(seq 24); do [ -e ${ST:-~/st}/up.done ] || [ -e ${ST:-~/st}/up.failed ] && break; sleep 5; done
D=$(ls -t ~/.cache/tfm-local/drafters/*.gguf | head -1)
[ -e ${ST:-~/st}/up.done ] && python3 -m tfm_local.cli.bench_upstream --binary ~/up/b/bin/llama-speculative-simple \
  --target $T --drafter "$D" -n 10 --json $O/bench-upstream.json > $O/bench-upstream.txt 2>&1
touch ${ST:-~/st}/timing.done
TESTS="tests/test_tree_gdn_ops.py tests/test_top_k_op.py tests/test_greedy_argmax.py tests/test_drafter_topk.py
  tests/test_tree_verify.py tests/test_tree_gdn_model.py"
python3 -m pytest -q -p no:cacheprovider -ra $TESTS > $O/tests.log 2>&1
for w in 8 16; do
  TFM_CUDA_GDN_SOLVE=2 TFM_CUDA_GDN_SOLVE_WARPS=$w python3 -m pytest -q -p no:cacheprovider -ra tests/test_tree_gdn_ops.py \
    tests/test_tree_gdn_model.py > $O/tests-solve2-w$w.log 2>&1
done
# patch 0013 under compute-sanitizer (the real library, through the op tests on the GPU: trees to 160 nodes,
# paths deeper than 32): shared-memory races, out-of-bounds accesses, barrier misuse
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
for tool in racecheck memcheck synccheck; do
  [ -n "$CS" ] && TFM_CUDA_GDN_SOLVE=2 timeout 300 $CS --tool $tool --target-processes all --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/test_tree_gdn_ops.py -k "gpu and (deeper or ddtree)" \
    > $O/sanitizer-$tool.txt 2>&1
done

