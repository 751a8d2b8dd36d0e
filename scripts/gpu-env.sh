#!/usr/bin/env bash
# Runs a command on a GPU machine whose python3 holds torch, triton and transformers but not the
# rest (network or not): installs the carried wheels of the projects that python3 lacks into a
# folder put on PYTHONPATH (with runtime/ and, for benchmarks/, the checkout), then runs the
# command there, Triton kernels compiled. scripts/gpu-check.sh and scripts/gpu-bench.sh start with
# it; scripts/gpu-wheels.sh downloads the wheels where PyPI is reachable.
#
#   bash scripts/gpu-env.sh [--wheels DIR]... [--site DIR] [--log DIR] -- COMMAND [ARG]...
#
# --wheels: a folder of carried wheels, and of wheels split into NAME.whl.partIofK, its subfolders
# too (default .whl; repeat it for several); --site: the install folder (default: a new temporary
# one; an existing one is reused, so a second command on the same machine installs nothing);
# --log: where the list of installed wheels and pip's log go (default: the site folder). PYTHON
# names another interpreter than python3.
set -euo pipefail
cd "$(dirname "$0")/.."

wheels=()
site=
log=
while (($#)); do
    case $1 in
        --wheels) wheels+=("$2"); shift 2 ;;
        --site) site=$2; shift 2 ;;
        --log) log=$2; shift 2 ;;
        --) shift; break ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-env: unknown argument $1; put the command after --" >&2; exit 2 ;;
    esac
done
(($#)) || { echo "gpu-env: no command given; put it after --" >&2; exit 2; }
python=${PYTHON:-python3}
site=${site:-$(mktemp -d)}
log=${log:-$site}
mkdir -p "$site" "$log"
((${#wheels[@]})) || wheels=(.whl)

# Split wheels joined first, then only the wheels of projects this interpreter (with the site
# folder) does not hold: its own torch stack stays in charge.
PYTHONPATH="$site" "$python" - "$site" "${wheels[@]}" >"$log/wheels-to-install.txt" <<'PY'
import importlib.metadata
import re
import shutil
import sys
from pathlib import Path

site, folders = Path(sys.argv[1]), [Path(f) for f in sys.argv[2:]]
wheels = [w for f in folders for w in f.rglob("*.whl")]
parts: dict[str, dict[int, Path]] = {}
for part in (p for f in folders for p in f.rglob("*.whl.part*")):
    name, index, count = re.fullmatch(r"(.+\.whl)\.part(\d+)of(\d+)", part.name).groups()
    parts.setdefault(f"{name} {count}", {})[int(index)] = part
joined = site.parent / (site.name + "-joined")
for key, pieces in parts.items():
    name, count = key.split()
    if sorted(pieces) != list(range(1, int(count) + 1)):
        sys.exit(f"gpu-env: {name} arrived in parts {sorted(pieces)} of {count}; carry all of them")
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
mapfile -t missing <"$log/wheels-to-install.txt"
if ((${#missing[@]})); then
    echo "gpu-env: installing ${#missing[@]} wheels into $site" >&2
    "$python" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "${missing[@]}" 2>&1 | tee "$log/pip-install.log" >&2
else
    echo "gpu-env: nothing to install from ${wheels[*]}" >&2
fi
export PYTHONPATH="$site:$PWD/runtime:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The Triton kernels must compile here; pagoda_runtime.executor.triton_mode would overrule it anyway.
unset TRITON_INTERPRET
exec "$@"
