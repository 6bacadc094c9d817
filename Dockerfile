# syntax=docker/dockerfile:1
# Images of the control plane and the host agent (R-I5), one build, two targets:
#
#   sha=$(git rev-parse HEAD)
#   docker build --build-arg SANDBOXFLEET_BUILD_SHA=$sha --target control-plane -t REGISTRY/sandbox-fleet/control-plane:$sha .
#   docker build --build-arg SANDBOXFLEET_BUILD_SHA=$sha --target host-agent    -t REGISTRY/sandbox-fleet/host-agent:$sha .
#
# SANDBOXFLEET_BUILD_SHA is REQUIRED and must be the full git SHA of the sources being built: it is
# baked into the image as an env variable (what both processes report, R-H1/R-H7; the agent's is
# what attestation.allowedAgentShas in the Helm chart must list) and as the OCI label
# org.opencontainers.image.revision (readable with `docker inspect` before deploying). The build
# context has no .git (.dockerignore), so the image never guesses; a process started without a
# known SHA refuses to start (src/config/build-sha.ts).
#
# This Dockerfile is the release path. It is not built by the test suite: this repository's CI
# machine reaches no registry, so the node base image cannot be pulled there. Instead the cluster
# test (test/integration/cluster) assembles the same two images without a base image
# (test/support/cluster-images.ts): the same files from the checkout (this file's COPY lines, the
# .dockerignore list), the same `npm ci --omit=dev --ignore-scripts`, the same entrypoints, env
# (NODE_ENV=production, SANDBOXFLEET_BUILD_SHA) and revision label, the same users; only the base
# differs (that machine's node binary and the libraries it links, plus GNU tar and rm for the agent,
# instead of node:20-bookworm-slim). A change here must be mirrored there, and the reverse.
# The processes run from TypeScript through tsx (a runtime dependency), exactly as the tests run them.
ARG NODE_IMAGE=node:20-bookworm-slim

FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# Production dependencies only; no install scripts run.
RUN npm ci --omit=dev --ignore-scripts && npm cache clean --force

FROM ${NODE_IMAGE} AS runtime
ARG SANDBOXFLEET_BUILD_SHA
# Fail the build, not the deployment, when the SHA is missing or not a full git SHA.
RUN case "${SANDBOXFLEET_BUILD_SHA}" in \
      *[!0-9a-f]*|"") echo "--build-arg SANDBOXFLEET_BUILD_SHA=<40 or 64 lowercase hex git SHA> is required" >&2; exit 1 ;; \
    esac; \
    len=$(printf '%s' "${SANDBOXFLEET_BUILD_SHA}" | wc -c); \
    if [ "$len" -ne 40 ] && [ "$len" -ne 64 ]; then echo "SANDBOXFLEET_BUILD_SHA must be 40 or 64 hex characters, got $len" >&2; exit 1; fi
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY package.json tsconfig.json ./
COPY cmd ./cmd
COPY src ./src
# gRPC reflection serves the protocol from the .proto files (src/api/runner-server.ts).
COPY proto ./proto
ENV NODE_ENV=production \
    SANDBOXFLEET_BUILD_SHA=${SANDBOXFLEET_BUILD_SHA}
LABEL org.opencontainers.image.title="sandbox-fleet" \
      org.opencontainers.image.revision="${SANDBOXFLEET_BUILD_SHA}"

FROM runtime AS control-plane
# The chart runs it as 65532 with a read-only root filesystem; /tmp and the state dir are volumes.
USER 65532:65532
EXPOSE 7443 9464
ENTRYPOINT ["node", "--import", "tsx", "cmd/control-plane/main.ts"]

FROM runtime AS host-agent
# GNU tar captures and restores writable layers (ARCHITECTURE.md "Checkpoint data path"); the
# Debian base ships it. Runs as root, privileged (see the chart's DaemonSet for why).
RUN tar --version | head -1 | grep -q 'GNU tar'
ENTRYPOINT ["node", "--import", "tsx", "cmd/host-agent/main.ts"]
