#!/usr/bin/env bash
# Soak: runs the CPU backend continuously for DURATION and samples, every minute, the
# resident memory, threads, open files and pinned bytes of the long-running processes;
# then writes a ready-to-paste Markdown table and a verdict (flat after warm-up, or not).
#
#   scripts/soak.sh 60m          # the 60-minute soak (also: 3600, 3600s, 1h)
#   scripts/soak.sh 5m           # a short validation
#
# What runs, all at once, until DURATION is up:
#   lora  `stagehand run --steps 0 --lora ADAPTER` on a 16 MiB demo model streamed
#         under 40 % of its size (LoRA attached for the whole run), metrics served;
#   moe   `stagehand run --workload moe --steps 0` (experts through the expert cache),
#         metrics served;
#   cycle a loop of short runs, each attaching an adapter, streaming 20 steps and
#         detaching it on the way out (every one must exit 0);
#   serve `stagehand serve` with a tiny BERT embedder and a tiny Llama decoder, under
#         steady load: two clients posting /v1/embeddings (in turn on `bert` and on
#         its adapter, `bert:style`: a LoRA switch every request) and
#         /v1/completions back to back (every request must answer 200);
#   curl  the three metrics endpoints scraped every second (every scrape must succeed).
# At the end both long runs get SIGINT and must exit 130 with every budget released;
# the server gets SIGTERM and must drain, exit 0 and say each model holds 0 B.
#
# Environment (not STAGEHAND_*: those are settings): SOAK_BIN (default: build
# target/release/stagehand),
# SOAK_SAMPLE_SECONDS (default 60), SOAK_DIR (default target/soak/<time>),
# SOAK_PORT (first of three ports, default 19464).
#
# The verdict: after warm-up (the first fifth of the samples, at least one), a
# process is flat when its RSS grew by at most max(2 MiB, 2 %) from its lowest to its
# last sample, its thread count never changed, its open files varied by at most 2 (a
# scrape's connection may be open at the instant of a sample), and its pinned bytes
# never exceeded the first post-warm-up sample by more than a block.
set -euo pipefail

usage() {
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

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
cat >"$dir/serve.toml" <<TOML
bind = "127.0.0.1:$serve_port"

[[models]]
name = "bert"
folder = "$models/bert"
adapters = { style = "$models/bert-adapter/adapter_model.safetensors" }

[[models]]
name = "llama"
folder = "$models/llama"
TOML

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$bin" run --device cpu --quiet --steps 0 --model "$model" --lora "$adapter" \
  --pin-ceiling 8MiB --metrics-addr "127.0.0.1:$port" >"$dir/lora.out" 2>"$dir/lora.err" &
lora_pid=$!
pids+=("$lora_pid")
"$bin" run --device cpu --quiet --steps 0 --workload moe --cache-dir "$dir/cache" \
  --metrics-addr "127.0.0.1:$moe_port" >"$dir/moe.out" 2>"$dir/moe.err" &
moe_pid=$!
pids+=("$moe_pid")
"$bin" serve --config "$dir/serve.toml" >"$dir/serve.out" 2>"$dir/serve.err" &
serve_pid=$!
pids+=("$serve_pid")

# The clock starts once both runs serve metrics (they have prepared and started) and
# the server has loaded its models.
for _ in $(seq 1 240); do
  if curl -sf --max-time 2 "http://127.0.0.1:$port/metrics" -o /dev/null &&
    curl -sf --max-time 2 "http://127.0.0.1:$moe_port/metrics" -o /dev/null &&
    curl -sf --max-time 2 "http://127.0.0.1:$serve_port/ready" -o /dev/null; then
    break
  fi
  sleep 0.5
done

# Two clients of the server, back to back: embeddings and completions.
for kind in embeddings completions; do
  (
    ok=0 failed=0
    turn=0
    while :; do
      # The embedder's requests alternate between the base and its adapter (a
      # LoRA switch every request).
      if [ "$kind" = embeddings ]; then
        model=bert
        if [ $((turn % 2)) = 1 ]; then model=bert:style; fi
        body='{"model": "'$model'", "input": ["a soak of the server", "steady load, all day"]}'
      else
        body='{"model": "llama", "prompt": "The soak", "max_tokens": 8}'
      fi
      turn=$((turn + 1))
      if curl -sf --max-time 60 -H 'Content-Type: application/json' -d "$body" \
        "http://127.0.0.1:$serve_port/v1/$kind" -o /dev/null 2>>"$dir/requests.err"; then
        ok=$((ok + 1))
      else
        failed=$((failed + 1))
      fi
      echo "$ok $failed" >"$dir/$kind.count"
    done
  ) &
  pids+=("$!")
done

# Short runs that attach and detach an adapter, back to back.
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

# Scrapes every second; counts successes and failures per endpoint.
(
  ok=0 failed=0
  while :; do
    for p in "$port" "$moe_port" "$serve_port"; do
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

echo "elapsed_seconds,process,rss_kib,threads,open_files,pinned_bytes,steps" >"$dir/samples.csv"
echo "soak: $seconds s, sampling every $sample_seconds s into $dir/samples.csv"
started=$(date +%s)
next=$started
ended_early=no
while :; do
  now=$(date +%s)
  elapsed=$((now - started))
  if [ "$now" -ge "$next" ]; then
    sample lora "$lora_pid" "$port" "$elapsed"
    sample moe "$moe_pid" "$moe_port" "$elapsed"
    sample serve "$serve_pid" "$serve_port" "$elapsed"
    next=$((next + sample_seconds))
  fi
  [ "$elapsed" -ge "$seconds" ] && break
  for pid in "$lora_pid" "$moe_pid" "$serve_pid"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "soak: a long run ended early (see $dir)" >&2
      ended_early=yes
      break 2
    fi
  done
  sleep 1
done

# Stop the helpers, then the long runs with SIGINT: each must exit 130, released;
# then the server with SIGTERM: it drains, exits 0, and each model holds nothing.
for pid in "${pids[@]:3}"; do kill "$pid" 2>/dev/null || true; done
endings=""
endings_ok=yes
for name in lora moe; do
  pid_var="${name}_pid"
  pid=${!pid_var}
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
released=$(grep -c "vram 0 B and pinned 0 B still held" "$dir/serve.out" || true)
{ [ "$status" -eq 0 ] && [ "$released" -eq 2 ]; } || endings_ok=no
endings+="| serve | $status (0 expected) | $([ "$released" -eq 2 ] && echo "yes (both models)" || echo NO) |"$'\n'
trap - EXIT

read -r cycle_runs cycle_failures <"$dir/cycle.count" 2>/dev/null || { cycle_runs=0; cycle_failures=0; }
read -r scrapes_ok scrapes_failed <"$dir/scrape.count" 2>/dev/null || { scrapes_ok=0; scrapes_failed=0; }
read -r embeddings_ok embeddings_failed <"$dir/embeddings.count" 2>/dev/null || { embeddings_ok=0; embeddings_failed=0; }
read -r completions_ok completions_failed <"$dir/completions.count" 2>/dev/null || { completions_ok=0; completions_failed=0; }
requests_failed=$((embeddings_failed + completions_failed))

report="$dir/report.md"
{
  echo "### Soak: $seconds s on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Samples every $sample_seconds s (RSS and pinned in MiB); CSV: \`$dir/samples.csv\`."
  echo
  awk -F, 'NR > 1 {
      key = $1
      if (!(key in seen)) { order[++n] = key; seen[key] = 1 }
      row[key] = row[key] sprintf("| %s | %s | %.1f | %s | %s | %s | %s |\n", $1, $2, $3 / 1024, $4, $5,
        ($6 == "" ? "–" : sprintf("%.1f", $6 / 1048576)), ($7 == "" ? "–" : $7))
    }
    END {
      print "| elapsed s | process | RSS MiB | threads | open files | pinned MiB | steps |"
      print "|---|---|---|---|---|---|---|"
      for (i = 1; i <= n; i++) printf "%s", row[order[i]]
    }' "$dir/samples.csv"
  echo
  echo "Short attach/detach runs: $cycle_runs passed, $cycle_failures failed. Metrics scrapes: $scrapes_ok answered, $scrapes_failed failed. Server requests: $embeddings_ok embeddings and $completions_ok completions answered 200, $requests_failed failed."
  echo
  echo "| long run | exit status | budgets released |"
  echo "|---|---|---|"
  printf "%s" "$endings"
  echo
  awk -F, -v runs_failed="$((cycle_failures + requests_failed))" -v scrapes_failed="$scrapes_failed" \
    -v endings_ok="$endings_ok" -v ended_early="$ended_early" '
    NR > 1 && $3 != "" { n[$2]++; rss[$2, n[$2]] = $3; thr[$2, n[$2]] = $4; fd[$2, n[$2]] = $5; pin[$2, n[$2]] = $6 }
    END {
      verdict = "FLAT"
      for (p in n) {
        warm = int(n[p] / 5); if (warm < 1) warm = 1
        if (n[p] <= warm) { printf "- %s: too few samples (%d) for a verdict\n", p, n[p]; verdict = "UNDECIDED"; continue }
        low = rss[p, warm + 1]; tmin = thr[p, warm + 1]; tmax = tmin; fmin = fd[p, warm + 1]; fmax = fmin
        pfirst = pin[p, warm + 1]; pmax = pfirst
        for (i = warm + 1; i <= n[p]; i++) {
          if (rss[p, i] < low) low = rss[p, i]
          if (thr[p, i] < tmin) tmin = thr[p, i]; if (thr[p, i] > tmax) tmax = thr[p, i]
          if (fd[p, i] < fmin) fmin = fd[p, i]; if (fd[p, i] > fmax) fmax = fd[p, i]
          if (pin[p, i] != "" && pin[p, i] > pmax) pmax = pin[p, i]
        }
        growth = rss[p, n[p]] - low
        allowed = low * 0.02; if (allowed < 2048) allowed = 2048
        flat = (growth <= allowed) && (tmax == tmin) && (fmax - fmin <= 2)
        printf "- %s: RSS %+d KiB after warm-up (allowed %d), threads %d..%d, open files %d..%d, pinned peak %.1f MiB (first %.1f): %s\n",
          p, growth, allowed, tmin, tmax, fmin, fmax, pmax / 1048576, pfirst / 1048576, flat ? "flat" : "NOT FLAT"
        if (!flat) verdict = "NOT FLAT"
      }
      if (ended_early == "yes") verdict = "FAILED: a long run ended before the soak did"
      else if (endings_ok != "yes") verdict = verdict ", but a long run or the server did not stop cleanly"
      if (runs_failed > 0 || scrapes_failed > 0) verdict = verdict " (with failed runs, requests or scrapes)"
      printf "\n**Verdict: %s.**\n", verdict
    }' "$dir/samples.csv"
} >"$report"
cat "$report"
