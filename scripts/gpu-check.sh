#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU and a python3 that holds torch, triton and
# transformers, network or not. Through scripts/gpu-env.sh it installs what that python3 lacks from
# the wheels in .whl (scripts/gpu-wheels.sh downloads them where PyPI is reachable), then runs
# scripts/gpu_check.py: every `gpu` test and the kernel tests with the Triton kernels
# compiled, the bundled model served on the GPU and driven with the openai client (chat,
# streaming, n > 1, a burst of concurrent requests). One results file: DIR/gpu-check.json.
#
#   bash scripts/gpu-check.sh [--out DIR] [--wheels DIR]... [--site DIR] [gpu_check.py options]
#
# --out: where the results and logs go (default $PAGODA_GPU_CHECK_OUT, else out/gpu-check);
# --wheels: a folder of carried wheels, and of wheels split into NAME.whl.partIofK (default .whl;
# repeat it for several); --site: the install folder (default: a new temporary one). PYTHON names
# another interpreter than python3. The rest goes to scripts/gpu_check.py (--skip tests|serve,
# --burst N, --pytest-args "..."). Exit status 0 only when every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${PAGODA_GPU_CHECK_OUT:-out/gpu-check}
wheels=()
site=
rest=()
while (($#)); do
    case $1 in
        --out) out=$2; shift 2 ;;
        --wheels) wheels+=("$2"); shift 2 ;;
        --site) site=$2; shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) rest+=("$1"); shift ;;
    esac
done
mkdir -p "$out"
env_args=(--log "$out")
for w in "${wheels[@]}"; do env_args+=(--wheels "$w"); done
[[ -z $site ]] || env_args+=(--site "$site")
exec bash scripts/gpu-env.sh "${env_args[@]}" -- "${PYTHON:-python3}" scripts/gpu_check.py --out "$out" "${rest[@]}"
