#!/usr/bin/env bash
# After scale_fit.sh and cuda_build.sh: tfm-bench chain (greedy, 40 prompts a set, 256 tokens) of the new
# q4_0 drafter, then of the shipped one (full vocabulary on the GPU), each JSON in ~/st.
set -uo pipefail
. ~/env.sh
ST=${ST:-$HOME/st}
cd ~/repo
B="python3 -m tfm_local.bench --target $HOME/w/model.gguf --threads 4 --no-plot -n 40 --max-tokens 256 --modes chain --draft-vocab full"
$B --drafter ~/w/run0/export/drafter-q4_0.gguf --json $ST/bench-new.json > $ST/bench-new.log 2>&1
echo "$(date +%T) new done"
[ -n "${NEW_ONLY:-}" ] || $B --drafter auto --json $ST/bench-shipped.json > $ST/bench-shipped.log 2>&1
echo "$(date +%T) shipped done"; touch $ST/bench.done
