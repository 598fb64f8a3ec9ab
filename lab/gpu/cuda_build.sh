#!/usr/bin/env bash
# Join the carried sdist pieces (~/xfer/x.*) into build.py's cache and build and
# install the CUDA wheel of the patched llama-cpp-python (sm_90), niced so that a
# fit running beside it keeps its CPU. Run in the background; ${ST:-~/st}/build.done at the end.
set -uo pipefail
. ~/env.sh
mkdir -p ~/.cache/tfm-local/sdist
[ -e ~/xfer/x.00 ] && cat ~/xfer/x.* > ~/.cache/tfm-local/sdist/llama_cpp_python-0.3.36.tar.gz && rm -f ~/xfer/x.*
mkdir -p ~/site && tar xzf ~/xfer/pkgs.tgz -C ~/site 2>/dev/null
cd ~/repo
# the system g++ (a toolchain linking libstdc++ statically into each shared library crashes at load)
CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ TFM_CUDA=1 TFM_CUDA_ARCHS=90 TFM_BUILD_JOBS=${JOBS:-20} \
  nice -n 19 python3 -c "import sys; sys.path.insert(0, 'ggml_ops'); import build; \
    open(sys.argv[1], 'w').write(str(build.build_wheel(build.build_key())))" ${ST:-~/st}/wheel.path \
  > ${ST:-~/st}/build.log 2>&1 || { touch ${ST:-~/st}/build.failed; exit 1; }
whl=$(cat ${ST:-~/st}/wheel.path)
python3 -m pip install -q --no-index --no-deps --target ~/llama "$whl" >> ${ST:-~/st}/build.log 2>&1 &&
  python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info())" >> ${ST:-~/st}/build.log 2>&1 &&
  touch ${ST:-~/st}/build.done
