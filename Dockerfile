# The ibe-pubsub image: the CLI as entry point; by default it serves the key server on /data.
#   docker build -t ibe-pubsub .
#   docker run --rm -e IBE_PUBSUB_PASSPHRASE=... -v ks:/data ibe-pubsub keyserver init --data /data
#   docker run -d -e IBE_PUBSUB_PASSPHRASE=... -v ks:/data -p 8700:8700 ibe-pubsub
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY credentials credentials
COPY keyserver keyserver
COPY migrations migrations
COPY overlay overlay
COPY peer peer
COPY pipelines pipelines
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[postgres]'

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin ibe \
    && mkdir -p /data && chown ibe:ibe /data && chmod 0700 /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'ibe-pubsub[postgres]' \
    && rm -rf /wheels
USER ibe
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8700
ENTRYPOINT ["ibe-pubsub"]
# Inside a container the server must listen beyond loopback; publish the port deliberately.
CMD ["keyserver", "serve", "--data", "/data", "--host", "0.0.0.0", "--port", "8700"]
