# syntax=docker/dockerfile:1
# kakehi: multi-stage build. Stage 1 compiles the release binary; stage 2 is a
# slim Debian with the binary, curl (for the healthcheck) and a non-root user.
#
#   docker build -t kakehi .
#   docker run --rm -v kakehi-data:/data -p 3002:3002 kakehi \
#       --network regtest run --http 0.0.0.0:3002 --connect bitcoind:18444

# 1.89 at least (std::fs::File::try_lock, the datadir lock); 1.95 is the
# toolchain the repository is developed and tested with.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not rebuild them: a dummy
# crate with the real manifest and lock file.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && for b in $(awk '/^\[\[bench\]\]/{b=1;next} b&&/^name/{gsub(/"/,"",$3);print $3;b=0}' Cargo.toml); do \
         echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin kakehi

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 kakehi \
    && useradd --system --uid 10001 --gid kakehi --home-dir /data --shell /usr/sbin/nologin kakehi \
    && mkdir -p /data && chown kakehi:kakehi /data
COPY --from=build /src/target/release/kakehi /usr/local/bin/kakehi
COPY config /etc/kakehi
USER kakehi:kakehi
VOLUME ["/data"]
ENV KAKEHI_DATADIR=/data
# HTTP API (regtest default port; set --http to change).
EXPOSE 3002
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${HEALTH_PORT:-3002}/health" || exit 1
# Logs to stderr as one JSON object per line (docker logs, Loki, journald).
ENV KAKEHI_LOG_FORMAT=json
ENTRYPOINT ["kakehi"]
CMD ["--network", "regtest", "run", "--http", "0.0.0.0:3002"]
