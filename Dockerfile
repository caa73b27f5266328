# syntax=docker/dockerfile:1
#
# The example service (`service`) and its load generator (`load`) from the
# otel-profiling-examples package, for the `demo` profile of docker-compose.yml:
#
#   docker compose --profile demo up -d --build
#
# Only the workspace's sources are copied into the image, never a host target/ directory.

FROM rust:1.95.0-bookworm AS builder
WORKDIR /src
# Every workspace member must be present for cargo to load the workspace.
COPY Cargo.toml Cargo.lock ./
COPY bridge bridge
COPY cli cli
COPY examples examples
COPY integration-tests integration-tests
COPY pprof-proto pprof-proto
COPY query query
# File and line numbers in the flame graphs (README, "Profiling a service"); stacks are
# complete without it, and no frame pointers or other RUSTFLAGS are needed.
ENV CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p otel-profiling-examples \
    && mkdir -p /out \
    && cp target/release/service target/release/load /out/

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /app app
COPY --from=builder /out/ /usr/local/bin/
USER app
WORKDIR /app
ENV BIND_ADDR=0.0.0.0:8080
EXPOSE 8080
# The service shuts down (last profile uploaded, spans flushed) on Ctrl-C.
STOPSIGNAL SIGINT
CMD ["service"]
