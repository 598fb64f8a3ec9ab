#!/usr/bin/env bash
# Train a DFlash drafter for any GGUF target with tfm-train, then answer one prompt with it:
# prompts (ShareGPT user turns through the target's chat template) -> data (the target's own
# answers) -> fit (the drafter) -> export (GGUF) -> tfm-chat. docs/training.md has the full recipe.
#
#   examples/train_drafter.sh TARGET [WORKDIR]
#
#   TARGET   the target: a GGUF path or a built-in name (any GGUF llama.cpp runs)
#   WORKDIR  where prompts.npz, corpus/, run/ and export/ go (default: ./drafter-run)
#
# Environment (all optional):
#   SIZE     tiny (default): 8 short prompts, 32-token answers, 6 fit steps of a 1-layer drafter
#                on the CPU: every stage runs (about 5 minutes for a 1.5B target on 2 CPU cores,
#                seconds for a tiny one), but the drafter learns next to nothing
#            small: 1,000 prompts, 256-token answers, 1,000 steps of a 3-layer drafter (GPU advised)
#            full: every ShareGPT prompt, the project's recipe (5 layers, 6 epochs); hours even on a
#                GPU: docs/training.md gives the GPU commands (data --backend torch)
#   OUTTYPE  GGUF type of the exported drafter (default q8_0)
#   PROMPT   the message answered with the trained drafter
#   MAX_TOKENS  tokens of that answer (default 64)
#
# Each stage resumes where it stopped when run again with the same WORKDIR (fit: same options).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
TARGET=$1
WORK=${2:-drafter-run}
SIZE=${SIZE:-tiny}
OUTTYPE=${OUTTYPE:-q8_0}
PROMPT=${PROMPT:-Write a Python function that reverses a string.}
MAX_TOKENS=${MAX_TOKENS:-64}

case $SIZE in
    tiny)
        PROMPT_ARGS=(-n 8 --scan-limit 300 --max-chars 200 --max-prompt-tokens 256)
        DATA_ARGS=(-n 8 --max-new-tokens 32 --shard-size 8 --cpu)
        FIT_ARGS=(--layers 1 --max-steps 6 --epochs 1000 --lr 3e-3 --batch-tokens 512 --anchors 2
                  --max-len 512 --log-every 2 --save-every 6 --device cpu) ;;
    small)
        PROMPT_ARGS=(-n 1000 --max-prompt-tokens 1024)
        DATA_ARGS=(-n 1000 --max-new-tokens 256)
        FIT_ARGS=(--layers 3 --max-steps 1000 --epochs 1000 --batch-tokens 8192 --save-every 250) ;;
    full)
        PROMPT_ARGS=()
        DATA_ARGS=()
        FIT_ARGS=() ;;
    *)
        echo "SIZE must be tiny, small or full, not '$SIZE'" >&2
        exit 2 ;;
esac

mkdir -p "$WORK"

# 1. Prompts: ShareGPT user turns, deduplicated, shuffled, tokenized with the target's chat template.
[[ -f "$WORK/prompts.npz" ]] || tfm-train prompts --target "$TARGET" --out "$WORK/prompts.npz" ${PROMPT_ARGS[@]+"${PROMPT_ARGS[@]}"}

# 2. Data: the target's own greedy answer to each prompt (resumable: a second run continues).
tfm-train data --target "$TARGET" --prompts "$WORK/prompts.npz" --out "$WORK/corpus" ${DATA_ARGS[@]+"${DATA_ARGS[@]}"}

# 3. Fit: train the drafter on the corpus (resumable: run/checkpoint.pt).
tfm-train fit --corpus "$WORK/corpus" --target "$TARGET" --out "$WORK/run" --no-export ${FIT_ARGS[@]+"${FIT_ARGS[@]}"}

# 4. Export: the z-lab layout (export/hf/) and the GGUF llama.cpp loads.
tfm-train export --checkpoint "$WORK/run/checkpoint.pt" --target "$TARGET" --out "$WORK/export" \
    --outtype "$OUTTYPE"
DRAFTER=$WORK/export/drafter-$OUTTYPE.gguf
echo "drafter: $DRAFTER" >&2

# 5. Decode with the trained drafter: the answer on stdout, the stats line (tau, tokens/s) on stderr.
tfm-chat --target "$TARGET" --drafter "$DRAFTER" --prompt "$PROMPT" --max-tokens "$MAX_TOKENS"
