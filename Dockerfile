# SABRE service image: Python 3.11, uv-managed dependencies, bubblewrap for the sandbox.
#
# The bwrap sandbox (SABRE_SANDBOX=auto picks it when it works) needs user namespaces, which
# Docker's default seccomp and AppArmor profiles refuse: run the container with
#   --security-opt seccomp=unconfined --security-opt apparmor=unconfined
# (or a seccomp profile that allows unshare, clone with namespace flags, mount, umount2 and
# pivot_root). Otherwise the service falls back to the process sandbox and logs a warning;
# SABRE_SANDBOX=bwrap makes that a start-up error instead.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir uv

ENV UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SABRE_HOST=0.0.0.0 \
    SABRE_PORT=8011 \
    SABRE_DATA_DIR=/data

WORKDIR /srv/sabre
# Dependencies first, so code changes do not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --no-install-project
COPY app ./app
COPY migrations ./migrations
COPY alembic.ini ./
COPY personas ./personas
COPY openapi ./openapi
RUN uv sync --locked --no-dev

RUN useradd --system --create-home --home-dir /home/sabre sabre \
    && mkdir -p /data && chown sabre /data
USER sabre
VOLUME ["/data"]
EXPOSE 8011

HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8011/healthz').status != 200)"
# Upgrade the schema, then serve (sabre migrate is a no-op when it is current).
CMD ["sh", "-c", "sabre migrate && exec sabre serve"]
