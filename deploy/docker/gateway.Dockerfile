# syntax=docker/dockerfile:1
# The maskgate gateway image: Python slim, the base install only (no torch, no Triton), non-root.
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t maskgate-gateway:0.1.0 .
# Pin the base by digest in production (tag@sha256:...); the tag is pinned to a minor version here.

FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# The one `maskgate` package, installed without the worker extra: its base dependencies are the
# gateway's, so torch, triton and transformers never enter this image. The worker and kernels
# modules are present as source but nothing the gateway runs imports them.
COPY pyproject.toml README.md ./
COPY maskgate ./maskgate
RUN python -m venv /opt/maskgate \
    && /opt/maskgate/bin/pip install --no-compile /src

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="maskgate-gateway" \
      org.opencontainers.image.description="Reverse proxy that routes sampling-mask requests to a dedicated pool" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 maskgate \
    && useradd --system --uid 10001 --gid maskgate --no-create-home --shell /usr/sbin/nologin maskgate
COPY --from=build /opt/maskgate /opt/maskgate
# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only in Kubernetes.
# HEALTHCHECK_URL is deliberately not MASKGATE_-prefixed: every MASKGATE_* variable is a config field.
ENV PATH=/opt/maskgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
USER 10001:10001
EXPOSE 8080 9090
# Liveness for plain `docker run` / compose; Kubernetes ignores this and uses its own probes.
# slim has no curl, so the check is a one-line urllib call with a 2 s timeout.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=2)"]
ENTRYPOINT ["python", "-m", "maskgate.gateway"]
CMD ["--config", "/etc/maskgate/gateway.yaml"]
