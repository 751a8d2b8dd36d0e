# The operator: kopf and the Kubernetes client only, no machine-learning stack; non-root.
# Build from the repository root: docker build -f images/operator.Dockerfile -t pagoda-operator .
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
RUN pip install --no-cache-dir -c constraints.txt ".[operator]" && rm -rf /src

RUN useradd --uid 10001 --create-home pagoda
USER 10001
ENTRYPOINT ["pagoda-operator"]
