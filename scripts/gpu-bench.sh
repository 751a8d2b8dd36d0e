#!/usr/bin/env bash
# The GPU benchmarks BENCHMARKS.md reports, in parts that each fit one short session on the card,
# for a machine set up as scripts/gpu-env.sh describes (carried wheels, no network). Each part runs
# under its own time limit, writes its JSON, PNG and log into DIR and a line "PART RC SECONDS" to
# DIR/parts.tsv, and a part that fails does not stop the next one.
#
#   bash scripts/gpu-bench.sh [--out DIR] [--wheels DIR]... [--site DIR] [--part-timeout S] [--smoke] PART...
#
# Parts (Llama-3-8B shape, random bf16 weights, unless named):
#   decode      batch-1 latency against the roofline, transformers beside it
#   quant       batch-1 decode of none, int8, fp8 and int4 weights in one run
#   batch       decode tok/s against batch size 1 to 256, transformers beside it
#   offline     nano-vllm's workload (256 requests, 100-1024 in and out), all 256 through transformers
#   offline-1b  the same on the Llama-3.2-1B shape
#   serve       Poisson rate sweep up to saturation against `serve --load-format dummy`
#   profile     kernel vs wall time per decode step at batch 1, 32 and 256 (streaming text), and at
#               256 again without async scheduling
#   stretch     fp8 weights and fp8 KV cache, 1k in / 1k out
#   kernels     the GEMV and paged-attention kernels alone (CUDA only)
#   all         every part above, in that order
#
# --out: the results folder (default out/gpu-bench); --wheels, --site: as for scripts/gpu-env.sh
# (the site is made once and reused by every part); --part-timeout: seconds per part (default 540,
# under a 10-minute command limit); --smoke: tiny shapes and counts, so that every part's command
# line is checked in seconds, on a CPU too. At the end, pagoda_runtime.bench.targets says which of
# the performance targets the results meet (DIR/targets.json). Exit status 0 only when every part
# passed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=out/gpu-bench
wheels=()
site=
part_timeout=540
smoke=false
parts=()
while (($#)); do
    case $1 in
        --out) out=$2; shift 2 ;;
        --wheels) wheels+=("$2"); shift 2 ;;
        --site) site=$2; shift 2 ;;
        --part-timeout) part_timeout=$2; shift 2 ;;
        --smoke) smoke=true; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        all) parts+=(decode quant batch offline offline-1b serve profile stretch kernels); shift ;;
        decode | quant | batch | offline | offline-1b | serve | profile | stretch | kernels) parts+=("$1"); shift ;;
        *) echo "gpu-bench: unknown part or option $1; see --help" >&2; exit 2 ;;
    esac
done
((${#parts[@]})) || { echo "gpu-bench: name at least one part (or all); see --help" >&2; exit 2; }
mkdir -p "$out"
site=${site:-$(mktemp -d)}
env_args=(--site "$site" --log "$out")
for w in "${wheels[@]}"; do env_args+=(--wheels "$w"); done

if $smoke; then
    shape=tiny-llama small_shape=tiny-llama
    latency=(--input-len 8 --output-len 8)
    quantizations=none,int8
    batch=(--batch-sizes 1,2 --input-len 8 --output-len 8)
    offline=(--num-prompts 4 --min-len 4 --max-len 12 --hf-num-prompts 4 --hf-batch-size 4)
    rate=(--rates inf --num-prompts 4 --input-len 8 --output-len 8 --random-vocab-size 500)
    profile=(--batch-sizes 1,2 --steps 2 --input-len 8)
    profile_in_order=(--batch-sizes 2 --steps 2 --input-len 8)
    stretch=(--num-prompts 4 --min-len 8 --max-len 8)
else
    shape=llama-3-8b small_shape=llama-3.2-1b
    latency=(--input-len 128 --output-len 256)
    quantizations=none,int8,fp8,int4
    batch=(--batch-sizes 1,2,4,8,16,32,64,128,256)
    offline=(--hf-num-prompts 256)
    rate=(--rates 4,8,16,32,64,inf --num-prompts 400)
    profile=(--batch-sizes 1,32,256)
    profile_in_order=(--batch-sizes 256)
    stretch=(--min-len 1024 --max-len 1024)
fi

# One command of a part, in the environment gpu-env.sh makes, within what is left of the part's time.
run() {
    local left=$((deadline - SECONDS))
    ((left > 0)) || return 124
    timeout --kill-after=20 "$left" bash scripts/gpu-env.sh "${env_args[@]}" -- "${PYTHON:-python3}" "$@"
}

run_part() {
    case $1 in
        decode) run -m pagoda_runtime.cli bench latency --shape "$shape" --batch-size 1 "${latency[@]}" --hf \
            --result-json "$out/latency_b1.json" ;;
        quant) run -m pagoda_runtime.bench.sweeps quant --shape "$shape" --quantizations "$quantizations" \
            --batch-size 1 "${latency[@]}" --out "$out" ;;
        batch) run -m pagoda_runtime.bench.sweeps batch --shape "$shape" "${batch[@]}" --hf --out "$out" ;;
        offline) run -m pagoda_runtime.cli bench throughput --shape "$shape" "${offline[@]}" --hf \
            --result-json "$out/throughput_$shape.json" ;;
        offline-1b) run -m pagoda_runtime.cli bench throughput --shape "$small_shape" "${offline[@]}" --hf \
            --result-json "$out/throughput_$small_shape.json" ;;
        serve) run -m pagoda_runtime.bench.sweeps rate --serve "--model $shape --load-format dummy" "${rate[@]}" \
            --out "$out" ;;
        # Served requests stream text; the second run is the same step without async scheduling.
        profile) run -m pagoda_runtime.bench.step_profile --shape "$shape" "${profile[@]}" --detokenize --out "$out" &&
            run -m pagoda_runtime.bench.step_profile --shape "$shape" "${profile_in_order[@]}" --detokenize \
                --no-async-scheduling --name "in_order_profile_$shape" --out "$out" ;;
        stretch) run -m pagoda_runtime.cli bench throughput --shape "$shape" --quantization fp8 --kv-cache-dtype fp8 \
            "${stretch[@]}" --result-json "$out/throughput_${shape}_fp8_fp8kv.json" ;;
        kernels) run -m pagoda_runtime.bench.quant_kernels --check && run -m pagoda_runtime.bench.quant_kernels --rows 4 &&
            run -m pagoda_runtime.bench.attention_kernels ;;
    esac
}

failed=0
for part in "${parts[@]}"; do
    echo "gpu-bench: $part (at most ${part_timeout}s)" >&2
    start=$SECONDS
    deadline=$((SECONDS + part_timeout))
    rc=0
    run_part "$part" >"$out/$part.log" 2>&1 || rc=$?
    printf '%s\t%s\t%s\n' "$part" "$rc" "$((SECONDS - start))" | tee -a "$out/parts.tsv" >&2
    ((rc == 0)) || failed=1
done
# Which of the project's targets these results meet (DIR/targets.json).
bash scripts/gpu-env.sh "${env_args[@]}" -- "${PYTHON:-python3}" -m pagoda_runtime.bench.targets "$out" ||
    failed=1
exit "$failed"
