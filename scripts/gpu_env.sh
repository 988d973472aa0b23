# Moved: the GPU benchmarks live in benchmarks/ (benchmarks/README.md). Kept so that older
# commands (docs/benchmarks_kv.md) still work: sources benchmarks/gpu_env.sh.
. benchmarks/gpu_env.sh
