#!/usr/bin/env bash
# On one GPU (GPU, default 1) once the CUDA build and the corpus are done, cheapest-first so that a short
# hold still brings the decisive numbers: patch 0011's test, the target pass and tfm-bench with and without
# its chunked MMVQ (TFM_CUDA_MMVQ_MAX_COLS), upstream's DFlash chain (if upstream_build.sh finished), an
# ncu profile of the three tree-GDN kernels, the tree-GDN op at 128 nodes, then the CUDA tests.
# Outputs in ${ST:-~/st}/cuda/; ${ST:-~/st}/cuda.done at the end.
set -uo pipefail
. ~/env.sh
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
python3 -m pytest -q -p no:cacheprovider -ra tests/test_cuda_mmvq.py > $O/tests-mmvq.log 2>&1
# patch 0011: one target pass of n tokens, MMQ (upstream) vs MMVQ in chunks of 8 columns
P="python3 -m tfm_local.cli.bench_pass --target $T --tokens 1,4,8,9,12,16 --variants argmax --drafter auto"
$P --json $O/pass-mmq.json > $O/pass-mmq.txt 2>&1
TFM_CUDA_MMVQ_MAX_COLS=16 $P --json $O/pass-mmvq16.json > $O/pass-mmvq16.txt 2>&1
for v in "" 16; do
  TFM_CUDA_MMVQ_MAX_COLS=$v python3 -m tfm_local.cli.bench --target $T --drafter auto \
    --modes plain,chain,ddtree@8,ddtree@16 -n 10 --max-tokens 256 --no-plot --json $O/bench-mmvq$v.json \
    > $O/bench-mmvq$v.txt 2>&1
done
touch ${ST:-~/st}/ab.done
# upstream's chain with the same (vocabulary-attached) drafter
for i in $(seq 60); do [ -e ${ST:-~/st}/up.done ] || [ -e ${ST:-~/st}/up.failed ] && break; sleep 5; done
D=$(ls -t ~/.cache/tfm-local/drafters/*.gguf | head -1)
[ -e ${ST:-~/st}/up.done ] && python3 -m tfm_local.cli.bench_upstream --binary ~/up/b/bin/llama-speculative-simple \
  --target $T --drafter "$D" -n 10 --json $O/bench-upstream.json > $O/bench-upstream.txt 2>&1
# tree GDN: where the three kernels spend their time
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2> /dev/null)
[ -n "$NCU" ] && $NCU --set full --kernel-name regex:gated_delta_net_tree --launch-skip 30 --launch-count 3 \
  python3 -m tfm_local.cli.bench_gdn --device gpu --nodes 128 --iters 10 > $O/ncu-gdn.txt 2>&1
python3 -m tfm_local.cli.bench_gdn --device gpu --iters 50 --repeat 8 --nodes 128 --json $O/gdn-new.json > $O/gdn-new.txt 2>&1
touch ${ST:-~/st}/gdn.done
python3 -m pytest -q -p no:cacheprovider -ra tests/test_tree_gdn_ops.py tests/test_top_k_op.py \
  tests/test_greedy_argmax.py tests/test_drafter_topk.py tests/test_tree_verify.py tests/test_tree_gdn_model.py \
  > $O/tests.log 2>&1
touch ${ST:-~/st}/cuda.done
