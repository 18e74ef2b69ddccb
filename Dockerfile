# Build: docker build -t outboxd .   Run: docker run --env-file config/outboxd.env outboxd run
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
RUN cargo build --release --locked --bin outboxd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/outboxd /usr/local/bin/outboxd
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/outboxd"]
CMD ["run"]
