#!/usr/bin/env bash
# Development only: on the GPU machine (device tool, one H200), build the CUDA wheel of
# ggml_ops/patches + ggml_ops/src through build.py, then run the CUDA op tests and the other GPU tests.
# Run from the repository root with .xfer carried, holding:
#   .xfer/sdist-trim.tar.xz  the pinned sdist without its .git pack and llama.cpp's models/, docs/, media/,
#                            benches/, tools/ui and mtmd test media (6.9 MB instead of 77 MB: one call
#                            carries 64 MiB); build.py reads it in place of the sdist. Made from the unpacked
#                            sdist: R=llama_cpp_python-0.3.36 V=$R/vendor/llama.cpp; tar --exclude=$R/.git
#                            --exclude=$V/.git --exclude=$V/models --exclude=$V/docs --exclude=$V/media
#                            --exclude=$V/benches --exclude=$V/tools/ui --exclude="$V/tools/mtmd/test-*"
#                            -cf - $R | xz -3 > .xfer/sdist-trim.tar.xz (vendor/miniaudio must stay: CMake
#                            adds it whatever the options)
#   .xfer/*.whl              packages that image lacks: cffi, pycparser, diskcache, gguf
# Re-entrant: the build runs in its own session, so a second call (within the machine's 30 s warm
# time) waits for the same build and then runs the test stages not done yet. Logs to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
ST=/tmp/cuda-check
mkdir -p "$O" "$ST"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .xfer/*.whl || exit 1
ln -sfn "$PWD/convert" /tmp/site/tfm_convert  # the converter package, as an install would name it
export PYTHONPATH=/tmp/llama:/tmp/site:$PWD TFM_CACHE=/tmp/tfm-cache

if [ ! -e "$ST/build.pid" ]; then
  date -u +%FT%TZ > "$ST/build.t0"
  # the system g++ (the image's /opt/gcc links libstdc++ statically into each library: crash at load)
  CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ TFM_CUDA=1 TFM_CUDA_ARCHS=90 TFM_BUILD_JOBS=16 \
    setsid nohup python3 -c "
import sys, time
from pathlib import Path
sys.path.insert(0, 'ggml_ops')
import build
build.fetch_sdist = lambda: Path('.xfer/sdist-trim.tar.xz').resolve()
t0 = time.time()
wheel = build.build_wheel(build.build_key())
print(f'[cuda-check] key {build.build_key()} wheel {wheel} in {time.time() - t0:.0f} s', flush=True)
Path(sys.argv[1]).write_text(str(wheel))
" "$ST/wheel.path" > "$ST/build.log" 2>&1 < /dev/null &
  echo $! > "$ST/build.pid"
fi
while [ ! -s "$ST/wheel.path" ] && kill -0 "$(cat "$ST/build.pid")" 2> /dev/null; do sleep 5; done
cp "$ST/build.log" "$O/build.log"
[ -s "$ST/wheel.path" ] || { echo "CUDA build failed"; tail -40 "$ST/build.log"; exit 1; }
grep -E "^\[(tfm-build|cuda-check)\]" "$ST/build.log"

if [ ! -e "$ST/installed" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/llama "$(cat "$ST/wheel.path")" || exit 1
  python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" && touch "$ST/installed"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

P="python3 -m pytest -p no:jaxtyping -p no:cacheprovider -q -ra"
stage() { # name, test arguments: run once, log to $OUT/tests-<name>.log
  local name=$1; shift
  [ -e "$ST/$name.done" ] && return
  echo "== $name: $* ($(date -u +%T))"
  $P "$@" > "$O/tests-$name.log" 2>&1
  echo "rc $?" >> "$O/tests-$name.log"
  tail -4 "$O/tests-$name.log"
  touch "$ST/$name.done"
}
# the op tests (every device: CPU and CUDA cases, the gpu-marked ones included), then the gpu-marked alone
stage ops tests/test_tree_gdn_ops.py tests/test_top_k_op.py
stage gpu-marked -m gpu tests/test_tree_gdn_ops.py tests/test_top_k_op.py
# the rest of the CUDA test set (tiny synthetic models; no network on that machine)
stage models tests/test_greedy_argmax.py tests/test_drafter_topk.py tests/test_tree_verify.py \
  tests/test_tree_gdn_model.py tests/test_drafter_graphs.py
echo "done $(date -u +%FT%TZ)"
