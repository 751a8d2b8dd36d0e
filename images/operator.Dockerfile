# syntax=docker/dockerfile:1
# The operator: kopf and the Kubernetes client only, no machine-learning stack; non-root.
# Build from the repository root: docker build -f images/operator.Dockerfile -t pagoda-operator .
# BASE: any image with python3 (>= 3.11) and its venv module; images/build.sh passes a Debian
# root filesystem made with debootstrap where no registry is reachable.
ARG BASE=python:3.12-slim
FROM ${BASE}

ENV VIRTUAL_ENV=/opt/pagoda PATH=/opt/pagoda/bin:$PATH PYTHONUNBUFFERED=1
RUN python3 -m venv $VIRTUAL_ENV

# Dependencies first, in their own layer: a source change does not reinstall them.
WORKDIR /src
COPY constraints.txt pyproject.toml ./
# The secret "ca": the CA bundle the build host trusts for PyPI (images/build.sh passes it).
# README.md (the package's long description) stays empty: editing it rebuilds nothing.
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && mkdir -p runtime operator && touch README.md \
 && pip install -c constraints.txt ".[operator]"
# Of the runtime, only its contract (no machine-learning stack): the one part the operator imports
# (tests/test_layers.py holds it to that).
COPY runtime/pagoda_runtime/__init__.py ./runtime/pagoda_runtime/__init__.py
COPY runtime/pagoda_runtime/contract ./runtime/pagoda_runtime/contract
COPY operator ./operator
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --no-deps --force-reinstall . && rm -rf /src

RUN useradd --uid 10001 --create-home pagoda
USER 10001
ENTRYPOINT ["pagoda-operator"]
