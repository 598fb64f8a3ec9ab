#!/usr/bin/env bash
# Join the carried pieces of the target into ~/w/model.gguf and check its sha256.
# usage: join.sh SHA256
set -euo pipefail
[ -e ~/xfer/m.00 ] || { echo "no pieces in ~/xfer (joined already?)"; exit 1; }
cat ~/xfer/m.* > ~/w/model.gguf.part
echo "$1  $HOME/w/model.gguf.part" | sha256sum -c - && mv ~/w/model.gguf.part ~/w/model.gguf && rm -f ~/xfer/m.*
