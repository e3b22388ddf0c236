# syntax=docker/dockerfile:1
# planner-operator image, the one charts/planner-operator runs: a release binary (TLS by rustls
# and ring, no OpenSSL; glibc only) on distroless cc, as the distroless nonroot user 65532, which
# the chart's securityContext also asks for.
#
# Without a container runtime (and how this repository builds and checks it): `make image`
# (tools/image.sh) builds the same release binary and writes an equivalent image (the binary,
# the libraries it links, the loader, nonroot 65532, the same entrypoint, command, user and
# ports) to target/image/planner-operator-<version>.tar, then runs its entrypoint from the
# extracted image; `docker load -i` that file, or push it with `crane push`. With Docker:
#
#   docker build -t ghcr.io/planner-operator/planner-operator:0.1.0 .
#
# The Helm chart runs it with `run ...` as arguments (see templates/deployment.yaml); on its own it
# starts the operator with JSON logs.

# The toolchain rust-toolchain.toml pins, so the build needs no other download.
FROM rust:1.95.0-bookworm AS build
# rust-toolchain.toml also asks for rustfmt and clippy, which a build does not need.
ENV RUSTUP_TOOLCHAIN=1.95.0 CARGO_INCREMENTAL=0
WORKDIR /src
# Every workspace member is needed for Cargo.lock to resolve; config/ holds the built-in profiles
# the binary embeds.
COPY rust-toolchain.toml Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY operator ./operator
COPY crd-gen ./crd-gen
COPY e2e ./e2e
COPY config ./config
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p planner-operator --bin planner-operator \
    && cp target/release/planner-operator /planner-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /planner-operator /usr/local/bin/planner-operator
USER 65532:65532
# 8080: /healthz, /readyz, /metrics; 9443: the admission webhook (HTTPS).
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/planner-operator"]
CMD ["run", "--log-format", "json"]
