#!/usr/bin/env bash
# What bench/gpu_check.py needs on a GPU machine without network, carried in gpu_wheels/ (git-ignored, ~4 MB).
# That machine has Python 3.12 with torch, transformers, accelerate, peft, pyarrow, pandas, pytest, tensorboard
# and matplotlib; it lacks TRL, datasets and their small pure-Python dependencies, and SmolLM2's tokenizer.
#
#   bash bench/gpu_wheels.sh             # here (PyPI reachable): download the wheels, save the tokenizer
#   bash bench/gpu_wheels.sh install     # there: install the wheels and the project (--no-deps, offline)
#
# GPU_PYTHON_VERSION (default 3.12) picks the wheels' Python; GPU_SITE=DIR installs into DIR instead of the
# running environment (no editable install: put DIR and the repository on PYTHONPATH; the wheels must suit
# this Python).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=gpu_wheels
PY=${PYTHON:-python3}
WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0
        latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 "setuptools>=77")

if [ "${1:-download}" = install ]; then
  if [ -n "${GPU_SITE:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$GPU_SITE" "$DIR"/*.whl
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile "$DIR"/*.whl
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  fi
  exit
fi

mkdir -p "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp --platform manylinux2014_x86_64 \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" -d "$DIR" "${WHEELS[@]}"
HF_HUB_OFFLINE=1 PYTHONPATH=. "$PY" -c "
from rlhfkit.models import load_tokenizer, materialize_smollm2
load_tokenizer(materialize_smollm2()).save_pretrained('$DIR/smollm2-tokenizer')"
du -sh "$DIR"
