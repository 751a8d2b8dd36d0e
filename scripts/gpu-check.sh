#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU and a python3 that holds torch, triton and
# transformers, network or not. It installs what that python3 lacks from the wheels in .whl
# (scripts/gpu-wheels.sh downloads them where PyPI is reachable) into a folder put on PYTHONPATH,
# then runs scripts/gpu_check.py: every `gpu` test and the kernel tests with the Triton kernels
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
python=${PYTHON:-python3}
mkdir -p "$out"
site=${site:-$(mktemp -d)}

((${#wheels[@]})) || wheels=(.whl)

# Split wheels joined first, then only the wheels of projects this interpreter does not hold: its
# own torch stack stays in charge.
"$python" - "$site" "${wheels[@]}" >"$out/wheels-to-install.txt" <<'PY'
import importlib.metadata
import re
import shutil
import sys
from pathlib import Path

site, folders = Path(sys.argv[1]), [Path(f) for f in sys.argv[2:]]
wheels = [w for f in folders for w in f.glob("*.whl")]
parts: dict[str, dict[int, Path]] = {}
for part in (p for f in folders for p in f.glob("*.whl.part*")):
    name, index, count = re.fullmatch(r"(.+\.whl)\.part(\d+)of(\d+)", part.name).groups()
    parts.setdefault(f"{name} {count}", {})[int(index)] = part
joined = site.parent / (site.name + "-joined")
for key, pieces in parts.items():
    name, count = key.split()
    if sorted(pieces) != list(range(1, int(count) + 1)):
        sys.exit(f"gpu-check: {name} arrived in parts {sorted(pieces)} of {count}; carry all of them")
    joined.mkdir(parents=True, exist_ok=True)
    with (joined / name).open("wb") as out:
        for i in sorted(pieces):
            with pieces[i].open("rb") as piece:
                shutil.copyfileobj(piece, out)
    wheels.append(joined / name)
for wheel in sorted(wheels):
    try:
        importlib.metadata.distribution(wheel.name.split("-")[0])
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
PY
mapfile -t missing <"$out/wheels-to-install.txt"
if ((${#missing[@]})); then
    echo "gpu-check: installing ${#missing[@]} wheels into $site" >&2
    "$python" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "${missing[@]}" 2>&1 | tee "$out/pip-install.log" >&2
else
    echo "gpu-check: no wheels to install in ${wheels[*]}; using what $python already holds" >&2
fi
export PYTHONPATH="$site:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
# The Triton kernels must compile here; pagoda_runtime.triton_mode would overrule it anyway.
unset TRITON_INTERPRET
exec "$python" scripts/gpu_check.py --out "$out" "${rest[@]}"
