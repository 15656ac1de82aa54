#!/usr/bin/env bash
# Install everything (see setup.sh) and run the whole test suite; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
python -m pytest "$@"
