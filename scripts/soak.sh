#!/usr/bin/env bash
# Soak: runs the CPU backend continuously for DURATION and samples, every minute, the
# resident memory, threads, open files and pinned bytes of the long-running processes;
# then writes a ready-to-paste Markdown table and a verdict (flat after warm-up, or not).
#
#   scripts/soak.sh 60m          # the 60-minute soak (also: 3600, 3600s, 1h)
#   scripts/soak.sh 5m           # a short validation
#   scripts/soak.sh serve 30m    # the server alone, under its mixed load
#
# What runs, all at once, until DURATION is up:
#   lora  `stagehand run --steps 0 --lora ADAPTER` on a 16 MiB demo model streamed
#         under 40 % of its size (LoRA attached for the whole run), metrics served;
#   moe   `stagehand run --workload moe --steps 0` (experts through the expert cache),
#         metrics served;
#   cycle a loop of short runs, each attaching an adapter, streaming 20 steps and
#         detaching it on the way out (every one must exit 0);
#   serve `stagehand serve` with a tiny BERT embedder, a tiny Llama decoder and the
#         tiny Flux pipeline, under steady mixed load, one client each, back to back:
#         /v1/embeddings (in turn on `bert` and on its adapter, `bert:style`: a LoRA
#         switch every request), /v1/completions, /v1/chat/completions,
#         /v1/images/generations (a 64x64 image, 2 steps: one image job after
#         another), and an admin cycle (load a second decoder with
#         POST /admin/models, complete on it, unload it with DELETE, which must say
#         0 B of either budget is left);
#   curl  the metrics endpoints scraped every second (every scrape must succeed).
# Every request is counted by its answer: 2xx, 4xx, 5xx (none of the last two may
# happen) or no answer. At the end both long runs get SIGINT and must exit 130 with
# every budget released; the server gets SIGTERM and must drain, exit 0 and say each
# model holds 0 B. `serve` first runs the server, its clients and its scrape only.
#
# Environment (not STAGEHAND_*: those are settings): SOAK_BIN (default: build
# target/release/stagehand),
# SOAK_SAMPLE_SECONDS (default 60), SOAK_DIR (default target/soak/<time>),
# SOAK_PORT (first of three ports, default 19464), SOAK_CLIENTS (the server's clients,
# default "embeddings completions chat images admin").
#
# The verdict: after warm-up (the first fifth of the samples, at least one), a
# process is flat when its RSS grew by at most max(2 MiB, 2 %) from its lowest to its
# last sample (the server: its lowest in the second half against the first half's, as
# a sample may fall inside an image job), its thread count never changed, its open files varied by at most 2 (a
# scrape's connection may be open at the instant of a sample), and its pinned bytes
# never exceeded the first post-warm-up sample by more than a block.
set -euo pipefail

usage() {
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

serve_only=no
if [ "${1:-}" = serve ]; then
  serve_only=yes
  shift
fi
duration="${1:-}"
[ -n "$duration" ] || usage
case "$duration" in
  *h) seconds=$(( ${duration%h} * 3600 )) ;;
  *m) seconds=$(( ${duration%m} * 60 )) ;;
  *s) seconds=${duration%s} ;;
  *[!0-9]*) usage ;;
  *) seconds=$duration ;;
esac
[ "$seconds" -gt 0 ] 2>/dev/null || usage

root="$(cd "$(dirname "$0")/.." && pwd)"
sample_seconds="${SOAK_SAMPLE_SECONDS:-60}"
port="${SOAK_PORT:-19464}"
moe_port=$((port + 1))
serve_port=$((port + 2))
dir="${SOAK_DIR:-$root/target/soak/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$dir"
bin="${SOAK_BIN:-}"
if [ -z "$bin" ]; then
  (cd "$root" && cargo build --release --quiet)
  bin="$root/target/release/stagehand"
fi
command -v curl >/dev/null || { echo "soak: curl is needed to scrape the metrics" >&2; exit 2; }

models="$dir/models"
"$bin" demo-model --out "$models" --blocks 8 --layers-per-block 2 --dim 512 \
  --lora-out "$models/adapter.safetensors" --lora-rank 8 >"$dir/demo-model.log" 2>&1
model="$models/linear-stack.safetensors"
adapter="$models/adapter.safetensors"
"$bin" demo-model --arch bert --out "$models/bert" --lora-out "$models/bert-adapter" \
  --lora-rank 4 >>"$dir/demo-model.log" 2>&1
"$bin" demo-model --arch llama --out "$models/llama" >>"$dir/demo-model.log" 2>&1
cp -r "$root/tests/fixtures/pipeline/flux-tiny" "$models/flux"
cat >"$dir/serve.toml" <<TOML
bind = "127.0.0.1:$serve_port"

[admin]
key = "soak-admin-key"
model_roots = ["$models"]

[[models]]
name = "bert"
folder = "$models/bert"
adapters = { style = "$models/bert-adapter/adapter_model.safetensors" }

[[models]]
name = "llama"
folder = "$models/llama"

[[models]]
name = "flux"
folder = "$models/flux"
TOML
served_models=3

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# The long runs (not in `serve` mode): each serves its metrics.
long_runs=()
lora_pid="" moe_pid=""
if [ "$serve_only" = no ]; then
  "$bin" run --device cpu --quiet --steps 0 --model "$model" --lora "$adapter" \
    --pin-ceiling 8MiB --metrics-addr "127.0.0.1:$port" >"$dir/lora.out" 2>"$dir/lora.err" &
  lora_pid=$!
  "$bin" run --device cpu --quiet --steps 0 --workload moe --cache-dir "$dir/cache" \
    --metrics-addr "127.0.0.1:$moe_port" >"$dir/moe.out" 2>"$dir/moe.err" &
  moe_pid=$!
  pids+=("$lora_pid" "$moe_pid")
  long_runs=(lora moe)
fi
"$bin" serve --config "$dir/serve.toml" >"$dir/serve.out" 2>"$dir/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
processes=("${long_runs[@]}" serve)
metrics_ports=("$serve_port")
[ "$serve_only" = yes ] || metrics_ports+=("$port" "$moe_port")

# The clock starts once the runs serve metrics (they have prepared and started) and
# the server has loaded its models.
for _ in $(seq 1 240); do
  up=yes
  for p in "${metrics_ports[@]}"; do
    curl -sf --max-time 2 "http://127.0.0.1:$p/metrics" -o /dev/null || up=no
  done
  if [ "$up" = yes ] && curl -sf --max-time 2 "http://127.0.0.1:$serve_port/ready" -o /dev/null; then
    break
  fi
  sleep 0.5
done

# One request to the server: METHOD PATH [BODY] [AUTH]; prints its HTTP status
# (000: no answer).
request() {
  local args=(-s --max-time 120 -o /dev/null -w '%{http_code}' -X "$1")
  [ -n "${3:-}" ] && args+=(-H 'Content-Type: application/json' -d "$3")
  [ -n "${4:-}" ] && args+=(-H "Authorization: Bearer $4")
  curl "${args[@]}" "http://127.0.0.1:$serve_port$2" 2>>"$dir/requests.err" || true
}

# Counts an answer of client NAME: ok, 4xx, 5xx, none; `$dir/NAME.count` holds them.
declare -A tally
count() { # name status wanted
  case "$2" in
    "$3") tally[ok]=$((tally[ok] + 1)) ;;
    4??) tally[c4]=$((tally[c4] + 1)); echo "$(date +%T) $1: $2" >>"$dir/requests.err" ;;
    5??) tally[c5]=$((tally[c5] + 1)); echo "$(date +%T) $1: $2" >>"$dir/requests.err" ;;
    *) tally[none]=$((tally[none] + 1)); echo "$(date +%T) $1: $2" >>"$dir/requests.err" ;;
  esac
  echo "${tally[ok]} ${tally[c4]} ${tally[c5]} ${tally[none]}" >"$dir/$1.count"
}

# One client per kind of request, each back to back.
# SOAK_CLIENTS: a subset, to find which kind of request a growth comes from.
read -r -a clients <<<"${SOAK_CLIENTS:-embeddings completions chat images admin}"
for kind in "${clients[@]}"; do
  (
    tally=([ok]=0 [c4]=0 [c5]=0 [none]=0)
    turn=0
    while :; do
      case "$kind" in
        embeddings)
          # The embedder alternates between the base and its adapter (a LoRA switch
          # every request).
          name=bert
          if [ $((turn % 2)) = 1 ]; then name=bert:style; fi
          count "$kind" "$(request POST /v1/embeddings \
            '{"model": "'$name'", "input": ["a soak of the server", "steady load, all day"]}')" 200 ;;
        completions)
          count "$kind" "$(request POST /v1/completions \
            '{"model": "llama", "prompt": "The soak", "max_tokens": 8}')" 200 ;;
        chat)
          count "$kind" "$(request POST /v1/chat/completions \
            '{"model": "llama", "messages": [{"role": "user", "content": "How long is a soak?"}], "max_tokens": 8}')" 200 ;;
        images)
          count "$kind" "$(request POST /v1/images/generations \
            '{"model": "flux", "prompt": "a red fox in the snow", "size": "64x64", "num_inference_steps": 2, "max_sequence_length": 32, "seed": '$turn'}')" 200 ;;
        admin)
          # A whole cycle counts as one answer: loaded (201), used (200), unloaded
          # (200) with nothing of either budget left.
          status=$(request POST /admin/models \
            '{"name": "llama2", "folder": "'"$models/llama"'"}' soak-admin-key)
          if [ "$status" = 201 ]; then
            status=$(request POST /v1/completions \
              '{"model": "llama2", "prompt": "Loaded", "max_tokens": 4}')
            unloaded=$(curl -s --max-time 120 -X DELETE -H "Authorization: Bearer soak-admin-key" \
              "http://127.0.0.1:$serve_port/admin/models/llama2" 2>>"$dir/requests.err" || true)
            if [ "$status" = 200 ]; then
              case "$unloaded" in
                *'"vram_bytes_after":0'*'"pinned_bytes_after":0'* | \
                  *'"pinned_bytes_after":0'*'"vram_bytes_after":0'*) status=200 ;;
                *) status="unload: $unloaded" ;;
              esac
            fi
          fi
          count "$kind" "$status" 200 ;;
      esac
      turn=$((turn + 1))
    done
  ) &
  pids+=("$!")
done

# Short runs that attach and detach an adapter, back to back (not in `serve` mode).
if [ "$serve_only" = no ]; then
  (
    runs=0 failures=0
    while :; do
      if "$bin" run --device cpu --quiet --steps 20 --model "$model" --lora "$adapter:0.5" \
        --pin-ceiling 8MiB >/dev/null 2>>"$dir/cycle.err"; then
        runs=$((runs + 1))
      else
        failures=$((failures + 1))
      fi
      echo "$runs $failures" >"$dir/cycle.count"
    done
  ) &
  pids+=("$!")
fi

# Scrapes every second; counts successes and failures.
(
  ok=0 failed=0
  while :; do
    for p in "${metrics_ports[@]}"; do
      if curl -sf --max-time 5 "http://127.0.0.1:$p/metrics" -o /dev/null; then
        ok=$((ok + 1))
      else
        failed=$((failed + 1))
      fi
    done
    echo "$ok $failed" >"$dir/scrape.count"
    sleep 1
  done
) &
pids+=("$!")

metric_sum() { # endpoint metric-name label-filter → the sum of matching samples, or ""
  { curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" 2>/dev/null || true; } |
    awk -v name="$2" -v filter="$3" '
      $1 ~ "^"name"({|$)" && index($1, filter) { sum += $2; seen = 1 }
      END { if (seen) printf "%.0f", sum; else printf "" }'
}

sample() { # name pid port elapsed
  local status=/proc/$2/status
  [ -r "$status" ] || { echo "$4,$1,,,,,," >>"$dir/samples.csv"; return; }
  local rss threads fds pinned steps
  rss=$(awk '/^VmRSS:/ { print $2 }' "$status")
  threads=$(awk '/^Threads:/ { print $2 }' "$status")
  fds=$(ls "/proc/$2/fd" 2>/dev/null | wc -l)
  pinned=$(metric_sum "$3" stagehand_tier_used_bytes 'tier="pinned"')
  steps=$(metric_sum "$3" stagehand_compute_step_duration_seconds_count '')
  echo "$4,$1,$rss,$threads,$fds,${pinned:-},${steps:-}" >>"$dir/samples.csv"
}

port_of() { case "$1" in lora) echo "$port" ;; moe) echo "$moe_port" ;; serve) echo "$serve_port" ;; esac; }
pid_of() { case "$1" in lora) echo "$lora_pid" ;; moe) echo "$moe_pid" ;; serve) echo "$serve_pid" ;; esac; }

echo "elapsed_seconds,process,rss_kib,threads,open_files,pinned_bytes,steps" >"$dir/samples.csv"
echo "soak: $seconds s, sampling every $sample_seconds s into $dir/samples.csv"
started=$(date +%s)
next=$started
ended_early=no
while :; do
  now=$(date +%s)
  elapsed=$((now - started))
  if [ "$now" -ge "$next" ]; then
    for name in "${processes[@]}"; do
      sample "$name" "$(pid_of "$name")" "$(port_of "$name")" "$elapsed"
    done
    next=$((next + sample_seconds))
  fi
  [ "$elapsed" -ge "$seconds" ] && break
  for name in "${processes[@]}"; do
    if ! kill -0 "$(pid_of "$name")" 2>/dev/null; then
      echo "soak: $name ended early (see $dir)" >&2
      ended_early=yes
      break 2
    fi
  done
  sleep 1
done

# Stop the clients, then the long runs with SIGINT: each must exit 130, released;
# then the server with SIGTERM: it drains, exits 0, and each model holds nothing.
for pid in "${pids[@]}"; do
  case " $lora_pid $moe_pid $serve_pid " in *" $pid "*) ;; *) kill "$pid" 2>/dev/null || true ;; esac
done
endings=""
endings_ok=yes
for name in "${long_runs[@]}"; do
  pid=$(pid_of "$name")
  kill -INT "$pid" 2>/dev/null || true
  status=0
  wait "$pid" || status=$?
  released=$(grep -c "vram 0 B pinned 0 B held" "$dir/$name.out" || true)
  { [ "$status" -eq 130 ] && [ "$released" -gt 0 ]; } || endings_ok=no
  endings+="| $name | $status (130 expected) | $([ "$released" -gt 0 ] && echo yes || echo NO) |"$'\n'
done
kill -TERM "$serve_pid" 2>/dev/null || true
status=0
wait "$serve_pid" || status=$?
# Every model stopped says what it still held: the served ones, and an admin load
# that was in flight at the signal.
stopped=$(grep -c " stopped; vram " "$dir/serve.out" || true)
released=$(grep -c " stopped; vram 0 B and pinned 0 B still held" "$dir/serve.out" || true)
{ [ "$status" -eq 0 ] && [ "$released" -ge "$served_models" ] && [ "$released" -eq "$stopped" ]; } ||
  endings_ok=no
endings+="| serve | $status (0 expected) | $([ "$released" -eq "$stopped" ] && echo "yes" || echo "NO"): $released of $stopped models stopped at 0 B |"$'\n'
trap - EXIT

counts() { # file → its line, or zeros
  if [ -s "$1" ]; then cat "$1"; else echo "0 0 0 0"; fi
}
read -r cycle_runs cycle_failures _ <<<"$(counts "$dir/cycle.count")"
read -r scrapes_ok scrapes_failed _ <<<"$(counts "$dir/scrape.count")"
requests_line="" requests_failed=0
for kind in "${clients[@]}"; do
  read -r ok c4 c5 none <<<"$(counts "$dir/$kind.count")"
  requests_failed=$((requests_failed + c4 + c5 + none))
  requests_line+="| $kind | $ok | $c4 | $c5 | $none |"$'\n'
done

. "$root/scripts/soak-report.sh"
