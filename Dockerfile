# Dockerfile: the outboxd container image (build stage + slim runtime).
#
#   docker build -t outboxd .
#   docker run --env-file config/outboxd.env -p 9464:9464 outboxd
#   docker run --env-file config/outboxd.env outboxd status      # one-off slot report
#
# Flags go after the image name and replace CMD, e.g. `outboxd run --slot billing --log-format json`.
# On SIGTERM outboxd waits up to --shutdown-timeout (30s) for Kafka acks: stop it with
# `docker stop -t 45` (the default 10s grace period cuts that short; nothing is lost, but the
# events of the cut-off window are sent again on restart).
# tests/packaging.rs checks that every flag and OUTBOXD_* variable used here exists in the binary.

FROM rust:1-bookworm AS build
# librdkafka is built from source by rdkafka-sys (configure + make) against the system OpenSSL (TLS), Cyrus
# SASL (GSSAPI/Kerberos; PLAIN, SCRAM and OAUTHBEARER are built in), zlib and libcurl (OIDC).
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev libsasl2-dev \
       libcurl4-openssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
# The same build as CI's: locked dependencies, release profile.
RUN cargo build --release --locked --bin outboxd

FROM debian:bookworm-slim
# The shared libraries librdkafka links: libssl3 (TLS), libsasl2-2 (+ libsasl2-modules-gssapi-mit
# for Kerberos), libcurl4 (OIDC token requests), zlib1g; ca-certificates so managed brokers
# (Confluent Cloud, MSK, Aiven) verify with the system CAs; curl for the HEALTHCHECK.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl libssl3 libsasl2-2 \
       libsasl2-modules-gssapi-mit libcurl4 zlib1g \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 outboxd \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin outboxd
COPY --from=build /src/target/release/outboxd /usr/local/bin/outboxd

# /metrics, /healthz and /readyz on every interface of the container (outboxd's own default is
# 127.0.0.1:9464, unreachable from outside a container).
ENV OUTBOXD_METRICS_ADDR=0.0.0.0:9464 \
    RUST_LOG=info
EXPOSE 9464

# Numeric, so orchestrators can verify runAsNonRoot.
USER 10001:10001

# The port follows OUTBOXD_METRICS_ADDR (shell form: expanded when the check runs); with the
# endpoint turned `off` the check fails, so keep it on in containers.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${OUTBOXD_METRICS_ADDR##*:}/healthz" || exit 1

ENTRYPOINT ["/usr/local/bin/outboxd"]
CMD ["run"]
