# syntax=docker/dockerfile:1
# toposdns image: `docker build -t ghcr.io/toposdns/toposdns:0.1.0 .`
# Two stages on the same Python base: the builder makes the wheels and a virtual environment in
# /opt/venv; the runtime stage gets that venv and nothing else (no wheels, no pip, no source
# tree). The venv's interpreter links to the base image's python3.11, which is why both
# stages use the same base. For reproducible builds, pin it by digest (python:3.11-slim@sha256:…).

FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY toposdns ./toposdns
# Wheels for toposdns and its dependencies, then an install from those wheels only, with every
# module compiled to bytecode now: the runtime root filesystem is read-only.
RUN pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheels --compile toposdns \
 && /opt/venv/bin/pip uninstall --yes pip

FROM python:3.11-slim AS runtime
LABEL org.opencontainers.image.title="toposdns" \
      org.opencontainers.image.description="Kubernetes cluster DNS with topology-aware headless services" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# The official image deletes the standard library's bytecode to save space; compile it once here
# so that start-up does not recompile it in memory on every container start.
RUN python -m compileall -q /usr/local/lib/python3.11
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so that Kubernetes can verify runAsNonRoot (it cannot for a user name).
USER 65532:65532
# Port 53 as this user: Kubernetes sets net.ipv4.ip_unprivileged_port_start=53 in the pod (see
# manifests/base/deployment.yaml); Docker's default for containers is already 0.
EXPOSE 53 53/udp 9153
ENTRYPOINT ["toposdns"]
CMD ["--help"]
