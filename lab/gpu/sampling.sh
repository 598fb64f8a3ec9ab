#!/usr/bin/env bash
# The sampling session (sampling in the graph, the automatic budget, the 64-node divergences) on the
# GPU machine, after lab/gpu/setup.sh, the CUDA build (cuda_build.sh, or .whl/cuda_build_trim.sh from
# a trimmed sdist) and join.sh. Run from the call's checkout (its code, not ~/repo's), one stage per
# call; a stage runs detached and logs to ~/st/sampling-<stage>.log, so a call that ends early loses
# nothing: call the same stage again to wait for it and collect.
#   usage: sampling.sh STAGE [WAIT_SECONDS]
#   tests   the CUDA op's standalone check (st_test, when .xfer/cudatest is carried) and the sampling,
#           argmax and step tests on the GPU
#   bench   the bars: plain, auto, ddtree@auto and ddtree@16, greedy and T = 0.7 / top-p 0.95, first N (40)
#           prompts of each set, 256 tokens (tfm-bench --samplings; ~7 min)
#   keyab   patch 0014 against upstream's CUDA-graph key (ggml_ops/dev/cuda-graph-single-key-switch.patch
#           built in as 0099-): plain, auto, ddtree@auto, ddtree@16, greedy, 15 prompts a set, with and
#           without TFM_CUDA_GRAPH_SINGLE_KEY=1
#   t1      the same modes and ddtree@16 at T = 1 / top-p 1, and plain greedy for the ratio
#   div     lab/gpu/divergence.py: DDTree@64/@128 against plain greedy, and the pass spread per size
#   prof    lab/gpu/auto_overhead.py: plain against auto on 10 HumanEval then 10 GSM8K prompts (one
#           engine), and on 10 MT-Bench prompts: the probes one by one, the captured prompts' cost and
#           the Python functions whose time differs
#   depthab lab/gpu/auto_overhead.py on 40 HumanEval prompts, auto and ddtree@auto, with the budget's
#           measured_depth on and off (one engine each): did the rule, or a slow host, cut HumanEval's
#           gain from 1.21-1.30x (f84dd9b) to 1.01-1.06x (07ea590, docs/gpu.md)?
#   capture lab/gpu/prompt_capture.py: a captured prompt's cost part by part (prefill with and without
#           capture, the features' read, the drafter's injection whole and in power-of-two pieces)
# Results (JSON and logs) are copied to $OUT at the end of each call.
set -uo pipefail
stage=${1:?stage}; wait_s=${2:-560}
. lab/gpu/stage_env.sh
B="python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot"

case $stage in
  tests) cmd="set -x
    if [ -e .xfer/cudatest/st_test.cu ]; then
      (cd .xfer/cudatest && nvcc -std=c++17 -O3 -use_fast_math -arch=sm_90 -DGGML_CUDA_SAMPLE_TOKENS_STANDALONE -I. st_test.cu -o /tmp/st_test && /tmp/st_test)
    fi
    python3 -m pytest -p no:cacheprovider -q -ra tests/test_sample_op.py tests/test_backend_sampling.py tests/test_greedy_argmax.py tests/test_step.py tests/test_sampling.py" ;;
  bench) cmd="$B --modes plain,auto,ddtree@auto,ddtree@16 --samplings 'greedy;t=0.7,top_p=0.95' -n ${N:-40} --max-tokens 256 --json $ST/bench-sampling.json" ;;
  keyab) cmd="for V in '' 1; do echo == TFM_CUDA_GRAPH_SINGLE_KEY=\$V; env \${V:+TFM_CUDA_GRAPH_SINGLE_KEY=1} $B --modes plain,auto,ddtree@auto,ddtree@16 -n 15 --max-tokens 256 --json $ST/bench-keyab\$V.json | tail -16; done" ;;
  t1) cmd="$B --modes plain,auto,ddtree@auto,ddtree@16 --samplings 'greedy;t=1' -n 20 --max-tokens 256 --json $ST/bench-t1.json" ;;
  div) cmd="python3 lab/gpu/divergence.py --target $T --drafter auto --threads 4 --prompts 40 --tokens 256 --budgets 64,128 --sizes 1,2,4,8,16,64,128 --sources ddtree,chain --time-limit 270 --spread-share 0.35 --out $ST/divergence.json" ;;
  prof) cmd="for s in humaneval,gsm8k mtbench; do python3 lab/gpu/auto_overhead.py --target $T --set \$s -n 10 --tokens 256 --mode auto --out $ST/auto-overhead-\${s/,/-}.json || exit; done" ;;
  depthab) cmd="for M in auto ddtree@auto; do for V in True False; do python3 lab/gpu/auto_overhead.py --target $T --set humaneval -n 40 --tokens 256 --mode \$M --budget measured_depth=\$V --out $ST/auto-overhead-\${M/@/-}-depth\$V.json | tail -12 || exit; done; done" ;;
  capture) cmd="python3 lab/gpu/prompt_capture.py --target $T --sets humaneval,mtbench -n 10 --out $ST/prompt-capture.json" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
COLLECT="bench-*.json divergence.json auto-overhead-*.json prompt-capture.json" exec bash lab/gpu/run_stage.sh "sampling-$stage" "$wait_s" "$cmd"
