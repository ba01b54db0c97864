#!/bin/sh
# serve.sh installs what the host needs, builds Emberbox and runs
# `emberbox serve` with the default guest image (built on first start,
# cached in ~/.cache/emberbox). Extra arguments go to `emberbox serve`.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
make build
exec ./bin/emberbox serve "$@"
