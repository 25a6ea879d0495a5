# syntax=docker/dockerfile:1
# The ibe-pubsub image: the `ibe-pubsub` command as entry point. By default it serves the key
# server over HTTPS from the volume /data, with the TLS certificate and key expected in
# /data/tls. Init, TLS, the admin token, PostgreSQL (compose.yaml): docs/operations.md.
#
#   docker build -t ibe-pubsub .                     # every command but `bulk`
#   docker build --target bulk -t ibe-pubsub:bulk .  # every command: adds Spark, pyarrow, a JRE
#
# Two targets because `bulk` needs pyspark, pyarrow, pandas and a Java runtime, which add
# about 1 GB to an image of about 0.45 GB otherwise; the key server and the peers need none
# of them. Needs BuildKit (the default builder since Docker 23).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- wheels: the package and its dependencies ---------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheels
# pymcl, the pairing library, publishes wheels for x86_64 only, and there is no compiler here.
ARG TARGETARCH
RUN arch="${TARGETARCH:-$(uname -m)}"; case "$arch" in amd64|x86_64) ;; *) \
        echo "error: ibe-pubsub images build for linux/amd64 only: pymcl has no wheel for" \
             "$arch. Build with --platform linux/amd64 (emulated on other machines)." >&2; \
        exit 1;; esac
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY bridges bridges
COPY cli cli
COPY client client
COPY credentials credentials
COPY evaluation evaluation
COPY keyserver keyserver
COPY migrations migrations
COPY overlay overlay
COPY peer peer
COPY pipelines pipelines
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[postgres]'

FROM wheels AS bulk-wheels
RUN pip wheel --no-cache-dir --find-links /wheels --wheel-dir /wheels '.[postgres,spark]'

# -- what both images share ---------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
# The home is not /data: a peer or publish run in the container writes its ~/.config and
# ~/.local/state there, never into the key server's volume (which `serve` wants private).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/ibe \
        --shell /usr/sbin/nologin ibe \
    && mkdir -p /data && chown ibe:ibe /data && chmod 0700 /data
# `keyserver serve` (and init, rotate-admin-token) read their options from IBE_PUBSUB_*
# variables; so does the HEALTHCHECK, so change the server's address, port or TLS here
# (docker run -e, compose `environment`), not with flags. Behind a TLS-terminating proxy:
# IBE_PUBSUB_TLS_CERT= IBE_PUBSUB_TLS_KEY= IBE_PUBSUB_INSECURE=1.
ENV IBE_PUBSUB_DATA=/data \
    IBE_PUBSUB_HOST=0.0.0.0 \
    IBE_PUBSUB_PORT=8700 \
    IBE_PUBSUB_TLS_CERT=/data/tls/cert.pem \
    IBE_PUBSUB_TLS_KEY=/data/tls/key.pem \
    PYTHONUNBUFFERED=1
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8700
# GET /healthz of the key server in this container; containers running another command
# (a peer, a bulk job) have nothing to probe and count as healthy.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "-I", "-m", "ibe_pubsub.keyserver.healthcheck"]
ENTRYPOINT ["ibe-pubsub"]
CMD ["keyserver", "serve"]

# -- docker build --target bulk: everything, `bulk decompose --engine spark` included ------------
FROM base AS bulk
# Slim images lack the man page directory the JRE's package scripts link into.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=bulk-wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels 'ibe-pubsub[postgres,spark]'
USER ibe

# -- the default target: key server, identities, peers, publishing ------------------------------
FROM base AS default
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels 'ibe-pubsub[postgres]'
USER ibe
