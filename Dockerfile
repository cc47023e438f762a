# syntax=docker/dockerfile:1
# LOTA's image: `docker build -t lota .` (docker-compose.yml builds it too).
# Python's minor version is pinned and its patch releases float for their security fixes;
# a release pipeline pins the digest (python:3.11-slim-bookworm@sha256:...) on top.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build: the pinned packages, then LOTA, into one virtualenv the runtime stage copies.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/lota
WORKDIR /src
COPY deploy/requirements.txt deploy/requirements.txt
# --no-deps everywhere, then `pip check`: a dependency missing from the pins fails the build.
RUN /opt/lota/bin/pip install --no-deps -r deploy/requirements.txt
COPY pyproject.toml README.md ./
COPY lota lota
RUN /opt/lota/bin/pip install --no-deps . && /opt/lota/bin/pip check

# Runtime: no compiler, no pip cache, no source tree; a non-root user; nothing written
# outside the volumes, so it runs with a read-only root file system.
FROM ${PYTHON_IMAGE}
COPY --from=build /opt/lota /opt/lota
# /var/lib/lota/cache belongs to the lota user, so a named volume mounted there does too.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin lota \
    && mkdir -p /etc/lota /var/lib/lota/cache \
    && chown -R 10001:10001 /var/lib/lota
ENV PATH=/opt/lota/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LOTA_LISTEN=0.0.0.0:9000
USER 10001:10001
WORKDIR /var/lib/lota
EXPOSE 9000
# The process answers (liveness); Kubernetes uses its own probes instead (deploy/kubernetes).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9000/_lota/healthz', timeout=2)"]
ENTRYPOINT ["lota", "serve"]
CMD ["--config", "/etc/lota/lota.toml"]
