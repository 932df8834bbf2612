# syntax=docker/dockerfile:1
# toposdns image: `docker build -t ghcr.io/toposdns/toposdns:0.1.0 .` (docs/operations.md, "The image").
#
# Two stages, both Debian 12 with its Python 3.11, each pinned by digest (refresh them together,
# e.g. `docker buildx imagetools inspect debian:12-slim`):
# - builder: a virtual environment in /opt/venv with every dependency from requirements.lock,
#   each checked against its hashes (pip-compile --generate-hashes; the command is in its header),
#   then toposdns built from this tree and installed from its wheel, compiled to bytecode, with
#   its C extension (the batched UDP frontend; the build fails without it);
# - runtime: distroless Python (no shell, no pip, no apt) with that venv copied in, nothing else.
#
# Port 53 as a non-root user, as CoreDNS's image does it: the venv's interpreter python3.11 (a
# copy, not a link to the base's) carries the file capability cap_net_bind_service=+ep. It is the
# ENTRYPOINT, so a Deployment that adds NET_BIND_SERVICE (kubeadm's CoreDNS one, with only the
# image swapped) or Docker's defaults bind :53 with no sysctl. Like any +ep binary it cannot be
# started where that capability is not even in the bounding set (`drop: [ALL]` alone): manifests/
# runs the venv's other interpreter, python3, which has no capability, and lets the pod bind 53
# with the sysctl net.ipv4.ip_unprivileged_port_start instead.

FROM debian:12-slim@sha256:ccb33c3ac5b02588fc1d9e4fc09b952e433d0c54d8618d0ee1afadf1f3cf2455 AS builder
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv libcap2-bin gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.lock pyproject.toml setup.py README.md ./
COPY toposdns ./toposdns
# The lock holds the build's own tools too (setuptools, wheel): nothing unhashed is installed,
# and pip builds toposdns's wheel with them, offline. Then pip and those tools leave the venv.
RUN python3 -m venv --copies /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps --only-binary :all: -r requirements.lock \
 && /opt/venv/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps --no-index --find-links /wheels --compile toposdns \
 && /opt/venv/bin/python3 -c 'import toposdns.serve.datagrams' \
 && /opt/venv/bin/pip uninstall --yes pip setuptools wheel \
 && setcap cap_net_bind_service=+ep /opt/venv/bin/python3.11

FROM gcr.io/distroless/python3-debian12:nonroot@sha256:17b27c84c985a53d0cd2adef4f196ca327fa9b6755369be605cf45533b4e700b AS runtime
# The git commit built (`--build-arg REVISION=$(git rev-parse HEAD)`): coredns_build_info's
# revision label, and the image's.
ARG REVISION=""
LABEL org.opencontainers.image.title="toposdns" \
      org.opencontainers.image.description="Kubernetes cluster DNS with topology-aware headless services" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# COPY keeps the file capability (BuildKit copies extended attributes).
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/bin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOPOSDNS_REVISION=${REVISION}
# Numeric, so that Kubernetes can verify runAsNonRoot (it cannot for a user name).
USER 65532:65532
EXPOSE 53 53/udp 8080 8181 9153
ENTRYPOINT ["/opt/venv/bin/python3.11", "-m", "toposdns"]
CMD ["--help"]
