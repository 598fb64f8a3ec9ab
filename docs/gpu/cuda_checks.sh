#!/usr/bin/env bash
# On one GPU (GPU, default 1) once the CUDA build and the corpus are done: the CUDA
# tests, the tree GDN kernel A/B (patch 0008, per-kernel split by patch 0009), and the target pass and
# tfm-bench of the shipped drafter with and without patch 0011's chunked MMVQ. Outputs in ${ST:-~/st}/cuda/; ${ST:-~/st}/cuda.done at the end.
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
python3 -m pytest -q -p no:cacheprovider -ra tests/test_tree_gdn_ops.py tests/test_top_k_op.py \
  tests/test_greedy_argmax.py tests/test_drafter_topk.py tests/test_tree_verify.py tests/test_tree_gdn_model.py \
  tests/test_cuda_mmvq.py \
  > $O/tests.log 2>&1
B="python3 -m tfm_local.cli.bench_gdn --device gpu --iters 50 --repeat 8"
$B --nodes 128 --json $O/gdn-new.json > $O/gdn-new.txt 2>&1
TFM_CUDA_GDN_PAIRS_PER_VHEAD=1 $B --nodes 128 --json $O/gdn-vhead.json > $O/gdn-vhead.txt 2>&1
for k in pairs state solve; do
  TFM_CUDA_GDN_TREE_TWICE=$k $B --nodes 128 --json $O/gdn-twice-$k.json > $O/gdn-twice-$k.txt 2>&1
done
$B --json $O/gdn-sweep.json > $O/gdn-sweep.txt 2>&1
touch ${ST:-~/st}/gdn.done
# patch 0011: one target pass of n tokens, MMQ (upstream) vs MMVQ in chunks of 8 columns
P="python3 -m tfm_local.cli.bench_pass --target $HOME/w/model.gguf --tokens 1,4,8,9,12,16 --variants argmax --drafter auto"
$P --json $O/pass-mmq.json > $O/pass-mmq.txt 2>&1
TFM_CUDA_MMVQ_MAX_COLS=16 $P --json $O/pass-mmvq16.json > $O/pass-mmvq16.txt 2>&1
for v in "" 16; do
  TFM_CUDA_MMVQ_MAX_COLS=$v python3 -m tfm_local.cli.bench --target ~/w/model.gguf --drafter auto \
    --modes plain,chain,ddtree@8,ddtree@16 -n 10 --max-tokens 256 --no-plot --json $O/bench-mmvq$v.json \
    > $O/bench-mmvq$v.txt 2>&1
done
touch ${ST:-~/st}/cuda.done
