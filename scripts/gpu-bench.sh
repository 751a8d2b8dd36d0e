#!/usr/bin/env bash
# The GPU checks and benchmarks BENCHMARKS.md reports, in parts, for a machine set up as
# scripts/gpu-env.sh describes (carried wheels, no network). Parts run one after another, each alone
# on the card, each under its own time limit; each writes its JSON, PNG and log into DIR and a line
# "PART RC SECONDS" to DIR/parts.tsv (RC 124: stopped at its limit; "skipped": no time was left
# before the deadline), and a part that fails does not stop the next. What a part leaves running is
# stopped before the next begins. At the end benchmarks.targets says which of the performance
# targets the results meet (DIR/targets.json). docs/gpu-runbook.md has the commands of a session.
#
#   bash scripts/gpu-bench.sh [OPTIONS] PART...              here, in the foreground
#   bash scripts/gpu-bench.sh start --deadline S [OPTIONS] PART...
#   bash scripts/gpu-bench.sh collect [--out DIR] [--wait S] --archive FILE
#
# start: the same run as one detached job (its own session, so it outlives the command that
# started it), on a copy of this checkout in DIR/.tree, and returns at once; it stops itself S
# seconds after it was started. collect: waits until that run is done or S seconds (default 0)
# have passed, prints how far it got, and packs DIR as it is (results, logs, parts.tsv, progress.log)
# into FILE, a .tar.gz; run it again for a later state.
#
# Parts, always run in this order, that of their value (Llama-3-8B shape, random bf16 weights,
# unless named):
#   tests       every `gpu` test under tests/runtime (gpu-tests.xml, tests.log), first and alone
#   decode      batch-1 latency against the roofline, transformers beside it
#   batch       decode tok/s against batch size 1 to 256, transformers beside it
#   quant       batch-1 decode of none, int8, fp8 and int4 weights in one run
#   profile     kernel vs wall time per decode step at batch 1, 32 and 256 (streaming text), and at
#               256 again without async scheduling
#   kernels     the projections at 1-64 rows on every path (the routing table's timings, and the
#               table they give: DIR/dispatch_table.json) and the paged-attention kernel alone
#   spec-lora   speculative decoding (n-gram, and a Llama-3.2-1B-shaped draft model) at batch 1 to 32,
#               and the whole decode step at batch 32 with 4 LoRA adapters of rank 16 against the
#               base model alone
#   priority    interactive TTFT under a saturating batch load against `serve --load-format dummy`,
#               idle and loaded, with --scheduling-policy priority and then fcfs
#   moe-lora    the fused MoE layer (Qwen3-30B-A3B, Mixtral-8x7B, GPT-OSS-20B; bf16, int8, fp8, int4 experts) and
#               batched LoRA on Llama-3-8B's projections (decode and prefill), each checked first
#   offline     nano-vllm's workload (256 requests, 100-1024 in and out); transformers on its first
#               64 requests in one static batch (about 1,000 steps), the ratio per output token
#   serve       Poisson rate sweep up to saturation against `serve --load-format dummy`
#   stretch     fp8 weights and fp8 KV cache, 1k in / 1k out
#   offline-1b  the offline part on the Llama-3.2-1B shape
#   all         every part above, in that order
#
# --out: the results folder (default out/gpu-bench; for start and collect /tmp/pagoda-gpu-bench, a
# folder start makes and refuses to reuse); --wheels, --site: as for scripts/gpu-env.sh (the site is
# made once and reused by every part); --deadline S: be done S seconds from now (parts end 25 s
# before, for the targets table; none starts with under 30 s); --budget PART=S: that part's limit
# in seconds (the defaults, sized for an H100 or H200, end this help); --part-timeout S: every
# part's limit; --smoke: tiny shapes and counts, so that every part's command line is checked in
# seconds, on a CPU too. Exit status 0 only when every part passed.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A budget=(
    [tests]=240 [decode]=120 [batch]=180 [quant]=150 [profile]=150 [kernels]=120
    [moe-lora]=120 [spec-lora]=150 [priority]=180 [offline]=200 [serve]=200 [stretch]=120 [offline-1b]=150
)
order=(tests decode batch quant profile kernels spec-lora priority moe-lora offline serve stretch offline-1b)
# Seconds kept before the deadline for stopping the last part (KILL_AFTER beyond its TERM, then its
# leftovers) and the targets table; a part with less than MIN_PART seconds is not started.
KILL_AFTER=10
RESERVE=25
MIN_PART=30

mode=run
if [[ ${1:-} == start || ${1:-} == collect ]]; then
    mode=$1
    shift
fi
out=
wheels=()
site=
deadline=
stop_at=
wait_s=0
archive=
smoke=false
budget_args=()
parts=()
whole() {
    [[ $2 =~ ^[0-9]+$ ]] || { echo "gpu-bench: $1 takes whole seconds, not $2" >&2; exit 2; }
}
while (($#)); do
    case $1 in
        --deadline | --stop-at | --part-timeout | --wait) whole "$1" "${2-}" ;;&
        --out) out=$2; shift 2 ;;
        --wheels) wheels+=("$2"); shift 2 ;;
        --site) site=$2; shift 2 ;;
        --deadline) deadline=$2; stop_at=$(($(date +%s) + $2)); shift 2 ;;
        # start hands its job the deadline as the second it falls on.
        --stop-at) stop_at=$2; shift 2 ;;
        --budget)
            [[ $2 =~ ^([a-z0-9-]+)=([0-9]+)$ && -v budget[${BASH_REMATCH[1]}] ]] ||
                { echo "gpu-bench: --budget takes PART=SECONDS with a part of --help, not $2" >&2; exit 2; }
            budget[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
            budget_args+=(--budget "$2")
            shift 2 ;;
        --part-timeout)
            for p in "${order[@]}"; do budget[$p]=$2; budget_args+=(--budget "$p=$2"); done
            shift 2 ;;
        --wait) wait_s=$2; shift 2 ;;
        --archive) archive=$2; shift 2 ;;
        --smoke) smoke=true; shift ;;
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            limits=()
            for p in "${order[@]}"; do limits+=("$p ${budget[$p]}"); done
            (IFS=,; echo "Default limits in seconds: ${limits[*]}" | sed 's/,/, /g')
            exit 0 ;;
        all) parts+=("${order[@]}"); shift ;;
        *)
            [[ $mode != collect && -v budget[$1] ]] ||
                { echo "gpu-bench: unknown part or option $1; see --help" >&2; exit 2; }
            parts+=("$1")
            shift ;;
    esac
done

# collect: wait for the detached run, say where it is, pack what it wrote so far.
if [[ $mode == collect ]]; then
    out=${out:-/tmp/pagoda-gpu-bench}
    [[ -n $archive ]] || { echo "gpu-bench: collect needs --archive FILE (a .tar.gz)" >&2; exit 2; }
    [[ -f $out/pid ]] || { echo "gpu-bench: no run was started in $out; see --help for start" >&2; exit 2; }
    until_s=$(($(date +%s) + wait_s))
    while [[ ! -f $out/done ]] && (($(date +%s) < until_s)); do sleep 2; done
    if [[ -f $out/done ]]; then
        echo "gpu-bench: the run is done, exit status $(cat "$out/done")"
    elif kill -0 "$(cat "$out/pid")" 2>/dev/null; then
        echo "gpu-bench: still running: $(cat "$out/progress" 2>/dev/null || echo starting)"
    else
        echo "gpu-bench: the run ended without finishing (killed?); its last words:"
        tail -n 5 "$out/run.log" 2>/dev/null || true
    fi
    cat "$out/parts.tsv" 2>/dev/null || true
    # The archive leaves out the checkout copy and the installed wheels; a file over 4 MiB goes in as
    # its last MiB (NAME.tail), so that the archive stays small enough to carry back.
    tails=$(mktemp -d)
    trap 'rm -rf "$tails"' EXIT
    exclude=(--exclude=./.tree --exclude=./.site --exclude=./.site-joined)
    while IFS= read -r -d '' big; do
        rel=${big#"$out"/}
        mkdir -p "$tails/$(dirname "$rel")"
        tail -c 1M "$big" >"$tails/$rel.tail"
        exclude+=("--exclude=./$rel")
    done < <(find "$out" \( -path "$out/.tree" -o -path "$out/.site" -o -path "$out/.site-joined" \) -prune -o -type f -size +4M -print0)
    mkdir -p "$(dirname "$archive")"
    # Status 1: a file changed while it was read, which a run that is still going does.
    rc=0
    tar -czf "$archive" --warning=no-file-changed --warning=no-file-removed "${exclude[@]}" \
        -C "$out" . -C "$tails" . || rc=$?
    ((rc <= 1)) || exit "$rc"
    echo "gpu-bench: packed $out into $archive ($(du -h "$archive" | cut -f1))"
    exit 0
fi

((${#parts[@]})) || { echo "gpu-bench: name at least one part (or all); see --help" >&2; exit 2; }
# The parts run in the order of their value, whatever order they were named in, each once.
named=" ${parts[*]} "
parts=()
for p in "${order[@]}"; do [[ $named != *" $p "* ]] || parts+=("$p"); done

# start: the run below as a job of its own on a copy of the checkout, which a later command may
# replace under it.
if [[ $mode == start ]]; then
    [[ -n $deadline ]] || { echo "gpu-bench: start needs --deadline SECONDS; see --help" >&2; exit 2; }
    out=$(realpath -m "${out:-/tmp/pagoda-gpu-bench}")
    if [[ -e $out ]] && [[ -n $(ls -A "$out") ]]; then
        echo "gpu-bench: $out already holds a run; collect it, or give start a new --out" >&2
        exit 2
    fi
    mkdir -p "$out/.tree"
    tar -cf - --exclude=__pycache__ runtime benchmarks scripts tests pyproject.toml | tar -xf - -C "$out/.tree"
    site=$(realpath -m "${site:-$out/.site}")
    ((${#wheels[@]})) || wheels=(.whl)
    wheel_args=()
    for w in "${wheels[@]}"; do wheel_args+=(--wheels "$(realpath -m "$w")"); done
    # The wheels go in now, so that a missing one stops the start, not every part.
    bash scripts/gpu-env.sh --site "$site" --log "$out" "${wheel_args[@]}" -- true
    job=(--out "$out" --site "$site" --stop-at "$stop_at" "${wheel_args[@]}" "${budget_args[@]}")
    $smoke && job+=(--smoke)
    setsid nohup bash "$out/.tree/scripts/gpu-bench.sh" "${job[@]}" "${parts[@]}" \
        </dev/null >"$out/run.log" 2>&1 &
    echo $! >"$out/pid"
    echo "gpu-bench: started ${parts[*]} (pid $!), done by $(date -d "@$stop_at" +%T); results in $out"
    echo "gpu-bench: collect with: bash scripts/gpu-bench.sh collect --out $out --wait S --archive FILE"
    exit 0
fi

out=${out:-out/gpu-bench}
mkdir -p "$out"
# A part stopped at its limit keeps what it printed.
export PYTHONUNBUFFERED=1
site=${site:-$(mktemp -d)}
env_args=(--site "$site" --log "$out")
for w in "${wheels[@]}"; do env_args+=(--wheels "$w"); done

if $smoke; then
    shape=tiny-llama small_shape=tiny-llama
    tests=(tests/runtime/engine/test_gpu_engine.py)
    latency=(--input-len 8 --output-len 8)
    quantizations=none,int8
    batch=(--batch-sizes 1,2 --input-len 8 --output-len 8)
    offline=(--num-prompts 4 --min-len 4 --max-len 12 --hf-num-prompts 2 --hf-batch-size 2)
    rate=(--rates inf --num-prompts 4 --input-len 8 --output-len 8 --random-vocab-size 500)
    profile=(--batch-sizes 1,2 --steps 2 --input-len 8)
    profile_in_order=(--batch-sizes 2 --steps 2 --input-len 8)
    stretch=(--num-prompts 4 --min-len 8 --max-len 8)
    moe_lora=(--smoke)
    kernels=(--smoke)
    spec=(--shape tiny-llama --draft-model tiny-llama --batches 1 2 --max-tokens 16 --repeats 1)
    lora_decode=(--smoke)
    priority=(--device cpu --kv-cache-memory 8388608 --vocab-size 500 --max-num-seqs 2 --batch-clients 4
        --batch-prompt 16 --batch-tokens 16 --interactive-prompt 8 --probes 2 --fcfs-probes 1 --pause 0.1)
else
    shape=llama-3-8b small_shape=llama-3.2-1b
    tests=(tests/runtime)
    latency=(--input-len 128 --output-len 256)
    quantizations=none,int8,fp8,int4
    batch=(--batch-sizes 1,2,4,8,16,32,64,128,256)
    offline=(--hf-num-prompts 64 --hf-batch-size 64)
    rate=(--rates 4,8,16,32,64,inf --num-prompts 400)
    profile=(--batch-sizes 1,32,256)
    profile_in_order=(--batch-sizes 256)
    stretch=(--min-len 1024 --max-len 1024)
    moe_lora=()
    kernels=()
    spec=(--shape "$shape" --draft-model "$small_shape" --batches 1 4 16 32 --max-tokens 64)
    lora_decode=(--shape "$shape")
    # 8 GiB of KV: the batch load's 16 x 192 tokens and the probes' fit many times over.
    priority=(--device cuda --kv-cache-memory 8589934592 --vocab-size 128256 --fcfs-probes 6)
fi

# One command of a part, in the environment gpu-env.sh makes, within what is left of the part's time.
# --foreground keeps it in the part's process group, which is stopped as a whole when the part ends.
run() {
    local left=$((part_end - $(date +%s)))
    ((left > 0)) || return 124
    timeout --foreground --kill-after="$KILL_AFTER" "$left" bash scripts/gpu-env.sh "${env_args[@]}" -- \
        "${PYTHON:-python3}" "$@"
}

run_part() {
    case $1 in
        tests) run -m pytest "${tests[@]}" -m gpu -q -rfE -p no:cacheprovider --timeout 150 \
            --junitxml "$out/gpu-tests.xml" ;;
        decode) run -m pagoda_runtime.cli bench latency --shape "$shape" --batch-size 1 "${latency[@]}" --hf \
            --result-json "$out/latency_b1.json" ;;
        quant) run -m benchmarks.sweeps quant --shape "$shape" --quantizations "$quantizations" \
            --batch-size 1 "${latency[@]}" --out "$out" ;;
        batch) run -m benchmarks.sweeps batch --shape "$shape" "${batch[@]}" --hf --out "$out" ;;
        offline) run -m pagoda_runtime.cli bench throughput --shape "$shape" "${offline[@]}" --hf \
            --result-json "$out/throughput_$shape.json" ;;
        offline-1b) run -m pagoda_runtime.cli bench throughput --shape "$small_shape" "${offline[@]}" --hf \
            --result-json "$out/throughput_$small_shape.json" ;;
        serve) run -m benchmarks.sweeps rate --serve "--model $shape --load-format dummy" "${rate[@]}" \
            --out "$out" ;;
        # Served requests stream text; the second run is the same step without async scheduling.
        profile) run -m benchmarks.step_profile --shape "$shape" "${profile[@]}" --detokenize --out "$out" &&
            run -m benchmarks.step_profile --shape "$shape" "${profile_in_order[@]}" --detokenize \
                --no-async-scheduling --name "in_order_profile_$shape" --out "$out" ;;
        stretch) run -m pagoda_runtime.cli bench throughput --shape "$shape" --quantization fp8 --kv-cache-dtype fp8 \
            "${stretch[@]}" --result-json "$out/throughput_${shape}_fp8_fp8kv.json" ;;
        # A path that fails its check is left out of the table and fails the part, after attention ran.
        kernels) local rc=0
            run -m benchmarks.quant_kernels --check "${kernels[@]}" \
                --result-json "$out/quant_kernels.json" --write-table "$out/dispatch_table.json" || rc=$?
            run -m benchmarks.attention_kernels "${kernels[@]}" --result-json "$out/attention_kernels.json" &&
                return "$rc" ;;
        spec-lora) run -m benchmarks.spec_decode "${spec[@]}" --result-json "$out/spec_decode_$shape.json" &&
            run -m benchmarks.lora_decode "${lora_decode[@]}" --result-json "$out/lora_decode_step.json" ;;
        priority) run -m benchmarks.priority_ttft --model "$shape" --load-format dummy "${priority[@]}" \
            --policies priority fcfs --out "$out/priority_ttft_$shape.json" ;;
        moe-lora) run -m benchmarks.moe_kernels --check --kinds bf16,int8,fp8,int4 "${moe_lora[@]}" \
                --result-json "$out/moe_kernels.json" &&
            run -m benchmarks.lora_kernels --check "${moe_lora[@]}" --result-json "$out/lora_decode.json" &&
            run -m benchmarks.lora_kernels --check --prefill "${moe_lora[@]}" \
                --result-json "$out/lora_prefill.json" ;;
    esac
}

note() {
    printf '%s %s\n' "$(date +%T)" "$*" | tee -a "$out/progress.log" >&2
}

# Whatever a part started that is still running (a server, a test's subprocess) goes with it.
stop_group() {
    kill -0 -- "-$1" 2>/dev/null || return 0
    note "$2 left processes running; stopping them"
    kill -TERM -- "-$1" 2>/dev/null || true
    for _ in 1 2 3 4 5; do
        sleep 1
        kill -0 -- "-$1" 2>/dev/null || return 0
    done
    kill -KILL -- "-$1" 2>/dev/null || true
}

# A part has the card to itself: anything else computing on it is named in the progress log.
others_on_gpu() {
    command -v nvidia-smi >/dev/null || return 0
    local apps
    apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
    [[ -z $apps ]] || note "before $1, on the GPU already: ${apps//$'\n'/; }"
}

# Each part in a process group of its own (job control), so that stop_group reaches all it started.
set -m
{
    ! command -v nvidia-smi >/dev/null || nvidia-smi
    timeout 120 bash scripts/gpu-env.sh "${env_args[@]}" -- "${PYTHON:-python3}" -c \
        'import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")'
} >"$out/environment.txt" 2>&1 || note "the environment could not be read; see environment.txt"
"${PYTHON:-python3}" -m pip list --format=freeze >"$out/pip-freeze.txt" 2>/dev/null || true
failed=0
for part in "${parts[@]}"; do
    now=$(date +%s)
    limit=${budget[$part]}
    if [[ -n $stop_at ]]; then
        left=$((stop_at - RESERVE - now))
        if ((left < MIN_PART)); then
            note "$part skipped: ${left}s left before the deadline"
            printf '%s\tskipped\t0\n' "$part" >>"$out/parts.tsv"
            failed=1
            continue
        fi
        ((left >= limit)) || limit=$left
    fi
    others_on_gpu "$part"
    part_end=$((now + limit))
    echo "$part since $(date +%T), at most ${limit}s" >"$out/progress"
    note "$part started, at most ${limit}s"
    run_part "$part" </dev/null >"$out/$part.log" 2>&1 &
    pid=$!
    rc=0
    wait "$pid" || rc=$?
    stop_group "$pid" "$part"
    note "$part ended: status $rc after $(($(date +%s) - now))s"
    printf '%s\t%s\t%s\n' "$part" "$rc" "$(($(date +%s) - now))" >>"$out/parts.tsv"
    ((rc == 0)) || failed=1
done
echo "targets since $(date +%T)" >"$out/progress"
limit=60
[[ -z $stop_at ]] || limit=$((stop_at - $(date +%s)))
((limit > 5)) || limit=5
# Which of the project's targets these results meet (DIR/targets.json).
timeout "$limit" bash scripts/gpu-env.sh "${env_args[@]}" -- "${PYTHON:-python3}" -m benchmarks.targets "$out" ||
    failed=1
echo "done" >"$out/progress"
echo "$failed" >"$out/done"
exit "$failed"
