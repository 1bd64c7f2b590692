#!/usr/bin/env bash
# Installs kvlm's build dependencies (Debian 12 packages) and builds it into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libfmt-dev libspdlog-dev libcli11-dev nlohmann-json3-dev
          libpcre2-dev libutf8proc-dev libxxhash-dev libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev
          python3-matplotlib python3-jinja2
          clang libclang-rt-14-dev)  # clang: the ASan + libFuzzer tree (build-asan, scripts/fuzz.sh)
# Node.js runs the official OpenAI client test; install Debian's only where no node is present
# (the machines' nodesource build bundles npm and conflicts with Debian's npm package).
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test data and the official OpenAI client (tests/node/package.json, pinned; the lock file records
# no download addresses, and a warm npm cache makes this work offline).
if command -v npm >/dev/null 2>&1 && [ ! -d tests/node/node_modules/openai ]; then
  (cd tests/node && npm ci --no-audit --no-fund --prefer-offline --loglevel=error)
fi

cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
