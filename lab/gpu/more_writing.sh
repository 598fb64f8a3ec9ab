#!/usr/bin/env bash
# More sampled responses to the writing and role-play prompts only (an emphasis file's ranks), one seed per
# GPU, then pipeline.sh with the caller's environment (put the new folders in its CORPORA_EXTRA):
#   (WSEEDS="3 4" ... setsid nohup bash ~/repo/lab/gpu/more_writing.sh > ~/st/pipeline.log 2>&1 < /dev/null &)
# Seed number g of WSEEDS (default "3 4") samples on GPU g modulo the GPU count (one GPU runs them all at
# once) into ~/w/w<seed>; EMPHASIS is the ranks file (default ~/repo/.whl/emphasis-writing.npz), PROMPTS the
# prompt file.
set -uo pipefail
. ~/env.sh
cd ~/repo
mkdir -p ${ST:-~/st}
g=0 ng=$(nvidia-smi -L | wc -l)
for seed in ${WSEEDS:-3 4}; do
  CUDA_VISIBLE_DEVICES=$((g % ng)) python3 -m tfm_local.cli.train data --target ~/w/model.gguf --prompts "$PROMPTS" \
    --only "${EMPHASIS:-$HOME/repo/.whl/emphasis-writing.npz}" --out ~/w/w$seed --temperature 0.8 \
    --sample-seed $seed --backend torch --batch-size 512 --max-new-tokens "${MAXNEW:-256}" \
    > ${ST:-~/st}/genw$seed.log 2>&1 || touch ${ST:-~/st}/genw$seed.failed &
  g=$((g + 1))
done
wait
echo "$(date +%T) writing responses done: $(ls -d ~/w/w* | tr '\n' ' ')"
keep=""  # a failed generation leaves its folder out of the fit
for c in ${CORPORA_EXTRA:-}; do [ -e "$c/manifest.json" ] && keep="$keep $c" || echo "left out: $c"; done
export CORPORA_EXTRA="$keep"
exec bash ~/repo/lab/gpu/pipeline.sh
