#!/usr/bin/env bash
# Install everything (see setup.sh) and run ringml's main job on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
ringml demo "$@"
