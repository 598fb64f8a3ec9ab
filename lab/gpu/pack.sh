#!/usr/bin/env bash
# pack.sh RUN OUT: a fit's GGUFs without vocabulary, its log, split into 16 MiB pieces in OUT; the types
# are PACK_TYPES (default "q4_0 q8_0", each one the fit exported).
set -uo pipefail
. ~/env.sh
mkdir -p "$2"
cp "$1/log.jsonl" "$2/"
for q in ${PACK_TYPES:-q4_0 q8_0}; do
  python3 -c "from tfm_convert.vocab import strip_vocab; strip_vocab('$1/export/drafter-$q.gguf', '$1/$q.gguf')" &&
    (cd "$1" && sha256sum $q.gguf > "$2/$q.sha256" && split -b 16M -d -a 2 $q.gguf "$2/$q.gguf.part-")
done
touch "$2/done"
