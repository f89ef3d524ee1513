# litforge's image: installed from its lock by scripts/install.sh (as the README and CI install it),
# run as a non-root user; the default command trains (docs/container.md).
#   docker build -t litforge .                              # CPU
#   docker run --rm -v "$PWD/logs:/app/logs" litforge python train.py trainer.max_epochs=1
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 -t litforge:cuda .
#   docker run --rm --gpus all litforge:cuda python train.py trainer.accelerator=gpu
# PROFILE=dev adds the tests, linters and every extra (.devcontainer/ builds that).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG PROFILE=runtime
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# The CUDA images come without Python: Ubuntu's. The user (uid 1000; Ubuntu 24.04 images already
# have one) owns the project and a venv, so it may add packages.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && (id -u 1000 >/dev/null 2>&1 || useradd --create-home --uid 1000 litforge) \
    && mkdir /opt/venv /app \
    && chown 1000:1000 /opt/venv /app

USER 1000:1000
WORKDIR /app
COPY --chown=1000:1000 . .
RUN python3 -m venv /opt/venv \
    && PYTHON=python bash scripts/install.sh "$PROFILE"

CMD ["python", "train.py"]
