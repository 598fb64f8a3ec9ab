#!/usr/bin/env bash
# Convert a DFlash drafter in the z-lab Hugging Face layout (config.json + *.safetensors: a local
# folder or a hub id owner/name) to a GGUF for llama.cpp's dflash architecture, with only the
# target's GGUF at hand (it supplies the vocabulary), then answer one prompt with it.
#
#   examples/convert_drafter.sh CHECKPOINT TARGET [OUT.gguf]
#
#   CHECKPOINT  z-lab drafter: a folder, or a Hugging Face hub id (owner/name) trained for TARGET
#   TARGET      the target: a GGUF path or a built-in name (qwen2.5-coder-1.5b-instruct, ...)
#   OUT.gguf    the drafter GGUF to write (default: drafter-$OUTTYPE.gguf in the current folder)
#
# Environment (all optional):
#   OUTTYPE     tensor type of the drafter GGUF: f32 f16 bf16 q8_0 q5_0 q4_0 q4_k q5_k q6_k iq4_nl ...
#               (default q8_0; see tfm-convert --help)
#   PROMPT      the message answered with the new drafter
#   MAX_TOKENS  tokens of the answer (default 128)
#
# Example (a drafter trained for the target, downloaded from the hub):
#   OUTTYPE=q4_0 examples/convert_drafter.sh owner/name model-q4_k_m.gguf my-drafter.gguf
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
CHECKPOINT=$1
TARGET=$2
OUTTYPE=${OUTTYPE:-q8_0}
OUT=${3:-drafter-$OUTTYPE.gguf}
PROMPT=${PROMPT:-Write a Python function that reverses a string.}
MAX_TOKENS=${MAX_TOKENS:-128}

# 1. Convert: the checkpoint's shapes are checked against the target's (a drafter trained for
#    another target is refused), the target's tokenizer is copied into the GGUF.
tfm-convert "$CHECKPOINT" --target "$TARGET" --outtype "$OUTTYPE" -o "$OUT"

# 2. Decode with it: the answer goes to stdout, the stats line (tau, tokens/s) to stderr.
tfm-chat --target "$TARGET" --drafter "$OUT" --prompt "$PROMPT" --max-tokens "$MAX_TOKENS"
