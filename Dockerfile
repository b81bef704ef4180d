# syntax=docker/dockerfile:1
#
# docker build -t tollgate:0.1.0 .
#
# The paths in CMD are the ones deploy/base/deployment.yaml mounts and passes
# (tests/deploy.rs checks that they agree).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target dir between builds; the binary is copied
# out in the same step because the target dir is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tollgate \
    && cp target/release/tollgate /tollgate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /tollgate /tollgate
# The binary carries the shipped policy built in (`serve` without --policy runs it); the
# file is here so that the CMD can name the path deploy/base mounts its ConfigMap at, and
# the two stay one (tests/deploy.rs).
COPY policies/default.yaml /etc/tollgate/policy/default.yaml
# No environment of its own: the binary sets its allocator's options itself (src/main.rs),
# so that the image, the chart and a binary run by hand hold the same memory.
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/tollgate"]
CMD ["serve", "--policy", "/etc/tollgate/policy/default.yaml", "--tls-cert", "/etc/tollgate/tls/tls.crt", "--tls-key", "/etc/tollgate/tls/tls.key"]
