# syntax=docker/dockerfile:1
# planner-operator image: a static-ish release binary on a distroless base, running as non-root.

FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY rust-toolchain.toml Cargo.toml Cargo.lock ./
COPY operator ./operator
COPY crd-gen ./crd-gen
COPY e2e ./e2e
COPY config ./config
RUN cargo build --release --locked -p planner-operator --bin planner-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/planner-operator /usr/local/bin/planner-operator
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/planner-operator"]
CMD ["run", "--log-format", "json"]
