#!/usr/bin/env bash
# First call on the GPU machine (from the repository root, `.whl` carried):
# install the carried wheels, copy this checkout to ~/repo (later calls carry
# other files and run from there) and report what the machine has. State goes to ~/st:
# the device tool empties $OUT (~/out there) at the start of every call.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target ~/site .whl/*.whl
mkdir -p ~/w ${ST:-~/st} ~/xfer
rm -rf ~/repo && mkdir ~/repo && cp -a . ~/repo/
ln -sfn ~/repo/convert ~/site/tfm_convert
cat > ~/env.sh <<EOT
export PYTHONPATH=$HOME/llama:$HOME/site:$HOME/repo
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EOT
. ~/env.sh
python3 -c 'import torch, gguf, tqdm, safetensors; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "gguf", gguf.__file__)'
nproc; free -g | head -2; df -h ~ | tail -1
