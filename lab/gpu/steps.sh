#!/usr/bin/env bash
# The step-cost session: where a speculative step's time goes on the GPU, on the default pair and on a
# random-weight twin of a 7B-class target (tfm-bench twin). After lab/gpu/setup.sh, the CUDA build and
# join.sh; run from the call's checkout, one stage per call (lab/gpu/run_stage.sh: detached, logged to
# ~/st/steps-<stage>.log; call the same stage again to wait and collect). Results go to $OUT.
#   usage: steps.sh STAGE [WAIT_SECONDS]
#   twin    write the qwen2.5-7b twin and its random 5-layer q8_0 drafter to ~/w/twin7b (CPU only:
#           start it right after setup.sh, beside the build; ~4.3 GB)
#   prof    lab/gpu/step_profile.py (phases: wall, CUDA API calls, kernels, GPU busy) for plain, chain,
#           DDTree@16 and @64 on the default pair and on the twin; tfm-bench pass on the twin (n = 1 … 64,
#           argmax and features); profile_passes on the twin (kernels per pass size)
#   trace   lab/trace_graphs.py on the default pair, DDTree@16 and @64 (TFM_CUDA_GRAPH_WHY=1: build with
#           ggml_ops/dev/cuda-graph-why.patch copied into patches/): which target passes llama.cpp
#           reuses and which ggml-cuda replays as a CUDA graph (the profile saw trees launch kernels
#           one by one), summarized
#   pinned  who allocates pinned host memory (cudaMallocHost, 0.2-1.1 ms a tree step in the profile)
#           during decoding: a DDTree@64 generation under gdb (or cuda-gdb) with a backtrace at every
#           cudaMallocHost / cudaFreeHost; then the same run's tfm-bench with GGML_CUDA_NO_PINNED=1
#   twinbench  tfm-bench on the twin (plain, chain, DDTree@16/@64, 10 prompts per set, 128 tokens), then
#           tfm-bench project: its step costs with the default pair's τ (bench-steps.json or the pinned run's)
#   mmq     the A/B of ggml_ops/dev/cuda-mmq-tiling-switch.patch (built in): tfm-bench pass of both targets
#           and DDTree@16 on the default pair with TFM_CUDA_MMQ_TILING unset and at 6, 14, 35, 74 blocks
#   graphkey  a trace of which computes replay a CUDA graph, DDTree@16 (patch 0014's key per graph shape;
#           ggml_ops/dev/cuda-graph-why.patch built in). Its A/B against upstream's key: sampling.sh keyab
#   soak    tfm-bench soak on the default pair: 20,000 tokens per mode (auto, ddtree@16) at T = 0.8, then
#           greedy (the reliability issue's full run)
#   bench   the step-cost bar's run: plain, chain, DDTree@8/16/32/64 and ddtree@auto, greedy, first 40
#           prompts of each set, 256 tokens (~9 min: call it twice)
set -uo pipefail
stage=${1:?stage}; wait_s=${2:-560}
. lab/gpu/stage_env.sh
W=~/w/twin7b
SP="python3 lab/gpu/step_profile.py --modes plain,chain,ddtree@16,ddtree@64 --threads 4"
case $stage in
  twin) cmd="python3 -m tfm_local.bench twin --shape qwen2.5-7b --out $W" ;;
  prof) cmd="set -x
    $SP --target $T --drafter auto --set humaneval -n 3 --tokens 128 --out $ST/step-profile-1.5b.json
    $SP --target $W/target.gguf --drafter $W/drafter.gguf --set humaneval -n 2 --tokens 96 --out $ST/step-profile-7b.json
    python3 -m tfm_local.bench pass --target $W/target.gguf --drafter $W/drafter.gguf --tokens 1,8,16,32,64 --variants argmax,features --threads 4 --json $ST/pass-7b.json
    python3 -m tfm_local.bench.profile_passes --target $W/target.gguf --drafter $W/drafter.gguf --tokens 1,8,16,64 --threads 4 --json $ST/kernels-7b.json" ;;
  trace) cmd="for b in 16 64; do TFM_CUDA_GRAPH_WHY=1 TFM_VERBOSE=1 LLAMA_GRAPH_RESULT_DEBUG=1 python3 lab/trace_graphs.py --target $T --mode ddtree --budget \$b --tokens 96 --gpu > $ST/trace-\$b.log 2>&1; python3 lab/trace_graphs.py --summarize $ST/trace-\$b.log | tee $ST/trace-summary-\$b.txt
      { grep -o 'compute key.*' $ST/trace-\$b.log | sed 's/first .* use_graph/use_graph/' | sort | uniq -c | sort -rn | head -40; grep -o 'key [^:]*: .*' $ST/trace-\$b.log | sed 's/ne [0-9,]*$//' | sort | uniq -c | sort -rn | head -60; } > $ST/trace-why-\$b.txt; head -c 3000000 $ST/trace-\$b.log | gzip > $ST/trace-log-\$b.txt.gz; done" ;;
  pinned) cmd="G=\$(command -v gdb || command -v cuda-gdb); printf '%s\\n' 'set pagination off' 'set breakpoint pending on' 'break cudaMallocHost' 'break cudaFreeHost' 'commands 1-2' 'silent' 'bt 14' 'cont' 'end' 'run' > /tmp/pinned.gdb
    \$G -batch -x /tmp/pinned.gdb --args \$(python3 -c 'import sys; print(sys.executable)') lab/trace_graphs.py --target $T --mode ddtree --budget 64 --tokens 96 --gpu > $ST/pinned-gdb.log 2>&1
    grep -c '^#0' $ST/pinned-gdb.log; grep -A14 '^#0' $ST/pinned-gdb.log | grep -o 'in [a-zA-Z_:~]*' | sort | uniq -c | sort -rn | head -30 | tee $ST/pinned-summary.txt
    PB='python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot --modes plain,ddtree@16,ddtree@64 -n 10 --max-tokens 256 --sets humaneval'
    \$PB --json $ST/bench-pinned0.json | tail -12; GGML_CUDA_NO_PINNED=1 \$PB --json $ST/bench-pinned1.json | tail -12" ;;
  twinbench) cmd="python3 -m tfm_local.bench --target $W/target.gguf --drafter $W/drafter.gguf --threads 4 --no-plot --modes plain,chain,ddtree@16,ddtree@64 -n 10 --max-tokens 128 --json $ST/bench-twin7b.json
    R=\$(ls $ST/bench-steps.json $ST/bench-pinned0.json 2>/dev/null | head -1); python3 -m tfm_local.bench project --costs $ST/bench-twin7b.json --tau \$R --json $ST/projection-7b.json" ;;
  mmq) cmd="for K in 0 6 14 35 74; do echo == TFM_CUDA_MMQ_TILING=\$K; for t in $T $W/target.gguf; do TFM_CUDA_MMQ_TILING=\$K python3 -m tfm_local.bench pass --target \$t --tokens 1,8,16,32,64 --variants argmax --threads 4 --json $ST/pass-mmq\$K-\$(basename \$(dirname \$t)).json | grep -A8 ' n  variant'; done; done
    for K in 0 6 35; do TFM_CUDA_MMQ_TILING=\$K python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot --modes plain,ddtree@16 -n 10 --max-tokens 256 --sets humaneval --json $ST/bench-mmq\$K.json | tail -6; done" ;;
  graphkey) cmd="TFM_CUDA_GRAPH_WHY=1 TFM_VERBOSE=1 python3 lab/trace_graphs.py --target $T --mode ddtree --budget 16 --tokens 96 --gpu 2>&1 | grep -o 'compute key.*' | sed 's/first .* use_graph/use_graph/' | sort | uniq -c | sort -rn | head -30 | tee $ST/trace-why-pershape.txt" ;;
  soak) cmd="python3 -m tfm_local.bench soak --target $T --drafter auto --threads 4 --json $ST/soak-h200.json" ;;
  bench) cmd="python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot --modes plain,chain,ddtree@8,ddtree@16,ddtree@32,ddtree@64,ddtree@auto -n 40 --max-tokens 256 --json $ST/bench-steps.json" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
COLLECT="step-profile-*.json pass-7b.json kernels-7b.json trace-summary-*.txt trace-why-*.txt trace-log-*.txt.gz bench-steps.json bench-twin7b.json projection-7b.json bench-mmq*.json bench-graphkey*.json trace-why-pershape.txt soak-h200.json pinned-summary.txt bench-pinned*.json" exec bash lab/gpu/run_stage.sh "steps-$stage" "$wait_s" "$cmd"
