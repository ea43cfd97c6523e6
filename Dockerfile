# syntax=docker/dockerfile:1
# moerl's one image: the workers (`node dist/workers/main.js --role ...`, the entrypoint) and
# the trainer ranks (`node dist/workers/rank.js`, the command the kubernetes launcher gives each
# pod), with the native tools at native/build/bin where activities/native.ts looks for them.
#
#   docker buildx build --platform linux/amd64 -t <registry>/moerl:<version> --push .
#   docker buildx build --platform linux/amd64 --target pytorch -t <registry>/moerl:<version>-pytorch --push .
#
# The second is the same image with the PyTorch trainer (engines/pytorch) and its pinned torch:
# the trainer pods of a campaign with `engine.trainer: pytorch` (launcher.image) need it.
#
# Three stages: the native core and the TypeScript are built on the full Debian image, the
# runtime is the slim one plus the shared libraries the native tools load. The tests build this
# file as it is with buildah (scripts/build-image.sh), FROM a base made locally with the same
# Debian release and Node.js version (scripts/image/node-base.sh), and run the image on the
# test cluster's real node.

# Node LTS, exact version (a tag never moves under a pinned version; bump it deliberately).
# The build stages use the same release so that the native tools link against the runtime's
# Debian libraries (bookworm).
ARG NODE_IMAGE=node:24.19.0-bookworm

# ---- native: moe_train, moe_generate, moe_reward, moe_hf, ep_bench ----
FROM ${NODE_IMAGE} AS native
# scripts/setup.sh's DEBIAN_PACKAGES without OpenMPI (the benchmarks' MPI baselines are not
# shipped) and without GoogleTest and Python (MOERL_TESTS=OFF: the tools, not the tests).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      g++ cmake ninja-build pkg-config \
      libfabric-dev libopenblas-dev \
      nlohmann-json3-dev libssl-dev libcli11-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY native/ native/
# ep_bench is the operator's check that EP traffic flows between two nodes (docs/operations.md).
RUN cmake -S native -B native/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOERL_TESTS=OFF \
 && ninja -C native/build moe_train moe_generate moe_reward moe_hf ep_bench

# ---- ts: dist/ and the production node_modules ----
FROM ${NODE_IMAGE} AS ts
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY bin/ bin/
COPY workflows/ workflows/
COPY activities/ activities/
COPY workers/ workers/
COPY cli/ cli/
RUN npm run build \
 && npm prune --omit=dev --no-audit --no-fund

# ---- base: the slim image, the libraries the native tools load, the moerl user ----
FROM ${NODE_IMAGE}-slim AS base
# The libraries the native tools load (ldd of each):
# libfabric with its providers (efa through rdma-core's libefa), OpenBLAS, libcrypto.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libfabric1 libopenblas0-pthread libssl3 ca-certificates \
      bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 moerl \
 && useradd --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin moerl \
 && mkdir -p /var/cache/moerl && chown 65532:65532 /var/cache/moerl

# ---- runtime ----
FROM base AS runtime
# The reward functions' Python (the math verifier, users' Python reward functions, the sandboxed
# Python tool): scripts/reward-python/requirements.txt's hash-checked pins in a virtual
# environment, before the app's files so that a code change does not reinstall it.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/reward-python/requirements.txt /tmp/moerl-reward-requirements.txt
RUN python3 -m venv /opt/moerl-reward \
 && /opt/moerl-reward/bin/pip install --no-cache-dir --no-input --require-hashes -r /tmp/moerl-reward-requirements.txt \
 && rm /tmp/moerl-reward-requirements.txt
WORKDIR /app
COPY --from=ts /app/package.json ./
COPY --from=ts /app/node_modules/ node_modules/
COPY --from=ts /app/bin/ bin/
COPY --from=ts /app/dist/ dist/
# The sandboxed workers' Python (reward functions, tools), found beside dist/ by its sources' path.
COPY --from=ts /app/activities/rewards/python/ activities/rewards/python/
COPY --from=ts /app/activities/agents/python/ activities/agents/python/
COPY --from=native /src/native/build/bin/moe_train /src/native/build/bin/moe_generate /src/native/build/bin/moe_reward \
                   /src/native/build/bin/moe_hf /src/native/build/bin/ep_bench native/build/bin/
# The cache is an emptyDir in the k8s manifests; in the image it is writable for a plain run.
ENV NODE_ENV=production \
    MOERL_NATIVE_BIN=/app/native/build/bin/ \
    MOERL_CACHE_DIR=/var/cache/moerl \
    MOERL_REWARD_PYTHON=/opt/moerl-reward/bin/python
# Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["node", "dist/workers/main.js"]

# ---- pytorch: the runtime plus the PyTorch trainer, for engine.trainer pytorch ----
# A virtual environment of engines/pytorch with requirements.txt's pins; the rank program runs
# MOERL_PYTORCH_PYTHON -m moerl_pytorch (docs/engines.md). The environment (6 GB: PyPI's torch
# brings the CUDA libraries) is installed on the base, before the runtime's files, and the pins
# before the package: a change of the TypeScript, the native tools or the trainer's code rebuilds
# the layers above it, not torch. The runtime's last steps are repeated below for that reason.
FROM base AS pytorch
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY engines/pytorch/requirements.txt /tmp/moerl-pytorch-requirements.txt
RUN python3 -m venv /opt/moerl-pytorch \
 && /opt/moerl-pytorch/bin/pip install --no-cache-dir --no-input -r /tmp/moerl-pytorch-requirements.txt \
 && rm /tmp/moerl-pytorch-requirements.txt
COPY engines/pytorch/ /tmp/moerl-pytorch/
RUN /opt/moerl-pytorch/bin/pip install --no-cache-dir --no-input --no-deps /tmp/moerl-pytorch \
 && rm -rf /tmp/moerl-pytorch
WORKDIR /app
COPY --from=ts /app/package.json ./
COPY --from=ts /app/node_modules/ node_modules/
COPY --from=ts /app/bin/ bin/
COPY --from=ts /app/dist/ dist/
# The sandboxed workers' Python (reward functions, tools), found beside dist/ by its sources' path.
COPY --from=ts /app/activities/rewards/python/ activities/rewards/python/
COPY --from=ts /app/activities/agents/python/ activities/agents/python/
COPY --from=native /src/native/build/bin/moe_train /src/native/build/bin/moe_generate /src/native/build/bin/moe_reward \
                   /src/native/build/bin/moe_hf /src/native/build/bin/ep_bench native/build/bin/
ENV NODE_ENV=production \
    MOERL_NATIVE_BIN=/app/native/build/bin/ \
    MOERL_CACHE_DIR=/var/cache/moerl \
    MOERL_PYTORCH_PYTHON=/opt/moerl-pytorch/bin/python
USER 65532:65532
ENTRYPOINT ["node", "dist/workers/main.js"]

# The default target: the image without torch.
FROM runtime
