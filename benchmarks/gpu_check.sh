#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine with CUDA, without touching its torch.
#
# 1. On a machine with network, from the repository root: wheels for what the GPU machine lacks
#    (there: Python 3.12 and torch 2.11 CUDA preinstalled, numpy, numba, scipy, typer, rich; no pymetis,
#    no network). pymetis' cp312 wheel is manylinux_2_28, hence the platforms listed:
#      pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#          --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d wheels pymetis pytest hypothesis
#    (wheels/ is git-ignored, about 3 MB; copy it beside the repository, or carry it to the machine.)
# 2. On the GPU machine, from the repository root:
#      bash benchmarks/gpu_check.sh [--out DIR] [gpu_check.py options]
#    which installs the wheels and postplace with --no-deps (pip never resolves torch, so the CUDA build
#    stays), runs the check (under 8 minutes on one modern GPU), then the tests that need CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -d wheels ]; then
    "$PY" -m pip install -q --no-index --find-links wheels pymetis pytest hypothesis
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
status=0
"$PY" benchmarks/gpu_check.py "$@" || status=$?
if "$PY" -c "import pytest" 2>/dev/null; then
    # the tests that need CUDA, then (CUDA hidden) the ones that skip where a GPU is present
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_runtime_evaluator.py tests/test_runtime_calibrate.py \
        || status=$?
    CUDA_VISIBLE_DEVICES="" "$PY" -m pytest -q -p no:cacheprovider tests/test_runtime_evaluator.py \
        tests/test_runtime_calibrate.py -k "cpu_only_machine or missing_gpus" || status=$?
fi
exit $status
