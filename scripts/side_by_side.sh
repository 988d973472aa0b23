#!/usr/bin/env bash
# Moved to benchmarks/side_by_side.sh (benchmarks/README.md); kept so older commands still work.
exec bash benchmarks/side_by_side.sh "$@"
