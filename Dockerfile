# memest-server in a container.
#
#   docker build -t memest .
#   docker run --rm -p 50051:50051 memest
#   docker run --rm --entrypoint memest memest presets --local
#
# Two stages: the build stage installs the build dependencies with the same script the README
# uses (scripts/install-deps.sh, so the package list lives in one place) and builds the
# binaries; the runtime stage holds only the shared libraries they link and the binaries.
#
# Debian's image has no CUDA toolkit, so this build has none: it estimates, and its Validate
# answers UNAVAILABLE ("built without CUDA"). A validating server is built where nvcc and the
# CUDA libraries are (scripts/build.sh finds them) and started with --device.

# ---- build ---------------------------------------------------------------------------------
FROM debian:12 AS build

# Dependencies first, in their own layer: it is rebuilt only when the package list changes.
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN bash /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*

COPY . /src
WORKDIR /src
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMEMEST_BUILD_TESTS=OFF -DMEMEST_BUILD_BENCHMARKS=OFF \
 && ninja -C build memest-server memest-validate-worker memest memest-webhook \
 && strip build/bin/memest-server build/bin/memest-validate-worker build/bin/memest \
          build/bin/memest-webhook

# ---- runtime -------------------------------------------------------------------------------
FROM debian:12-slim

# The runtime halves of the -dev packages in scripts/install-deps.sh that the binaries link:
# gRPC (+ reflection, which ships in libgrpc++1.51), protobuf, spdlog (pulls libfmt9), OpenSSL
# (the server checks its TLS files with it), prometheus-cpp (its /metrics), tcmalloc (gperftools'
# malloc, which the server and the CLI link: CMakeLists.txt, MEMEST_TCMALLOC).
# CLI11 and nlohmann-json are header-only.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libspdlog1.10 libssl3 libprometheus-cpp-pull1.0 \
      libprometheus-cpp-core1.0 libtcmalloc-minimal4 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin memest

COPY --from=build /src/build/bin/memest-server /usr/local/bin/memest-server
COPY --from=build /src/build/bin/memest-validate-worker /usr/local/bin/memest-validate-worker
COPY --from=build /src/build/bin/memest /usr/local/bin/memest
# The admission webhook (deploy/kubernetes/webhook.yaml runs it from this image).
COPY --from=build /src/build/bin/memest-webhook /usr/local/bin/memest-webhook

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001
EXPOSE 50051
# gRPC health checking (grpc.health.v1) is served on the same port; see
# deploy/kubernetes/memest.yaml for probes. SIGTERM (docker stop) drains and exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/memest-server", "--address", "0.0.0.0:50051"]
