#!/usr/bin/env bash
# Runs every fuzz target for MINUTES minutes (default 10), one after the other, each
# as a single libFuzzer process (the equivalent of -jobs=1 without the log
# redirection), and writes a table of executions, coverage and findings to
# target/fuzz-report.md. Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`).
#
# Seeds: fuzz/seeds/TARGET (committed, small), and for the targets reading files the
# repository's fixtures (tests/fixtures: PNGs, tokenizer.json, pipeline folders' JSON)
# copied into fuzz/corpus/TARGET at the start. What libFuzzer adds goes to
# fuzz/corpus/TARGET (git-ignored), crashes to fuzz/artifacts/TARGET: turn each into a
# regression test (RELIABILITY.md says how), then delete it.
#
#   scripts/fuzz.sh            # 10 minutes per target
#   scripts/fuzz.sh 1          # a smoke run
#   TARGETS="lora_adapter" scripts/fuzz.sh 30
set -euo pipefail

minutes="${1:-10}"
root="$(cd "$(dirname "$0")/.." && pwd)"
targets=(${TARGETS:-safetensors_header sharded_index lora_adapter settings_layers serve_form serve_video_body serve_json_bodies png_input pipeline_folder tokenizer_file})
report="$root/target/fuzz-report.md"
logs="$root/target/fuzz-logs"
mkdir -p "$logs"

# The fixtures a target starts from, written into its (ignored) corpus folder.
fixture_seeds() {
  local target="$1" into="$2" fixtures="$root/tests/fixtures" file n=0
  case "$target" in
    png_input)
      cp "$fixtures"/wan_i2v_pipeline/*.png "$into"/ ;;
    tokenizer_file)
      for file in "$fixtures"/encoders/*/tokenizer.json "$fixtures"/pipeline/flux-tiny/tokenizer*/tokenizer.json \
        "$fixtures"/umt5/tokenizer/tokenizer.json; do
        n=$((n + 1)); cp "$file" "$into/fixture-$n.json"
      done ;;
    pipeline_folder)
      # model_index.json, NUL, the transformer's config.json, NUL, scheduler_config.json.
      for file in "$fixtures"/wan_pipeline "$fixtures"/wan_i2v_pipeline "$fixtures"/pipeline/flux-tiny; do
        n=$((n + 1))
        { cat "$file/model_index.json"; printf '\0'; cat "$file/transformer/config.json"; printf '\0'
          cat "$file/scheduler/scheduler_config.json"; } > "$into/fixture-$n.bin"
      done
      for file in "$fixtures"/unipc/*/scheduler_config.json; do
        n=$((n + 1))
        { cat "$fixtures/wan_pipeline/model_index.json"; printf '\0'
          cat "$fixtures/wan_pipeline/transformer/config.json"; printf '\0'; cat "$file"; } > "$into/fixture-$n.bin"
      done ;;
  esac
}

cd "$root/fuzz"
case "$minutes" in
  '' | *[!0-9]*) echo "MINUTES must be a whole number, got '$minutes'" >&2; exit 2 ;;
esac
cargo +nightly fuzz build

{
  echo "| target | minutes | executions | exec/s | coverage (edges) | features | corpus | crashes | result |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$report"

for target in "${targets[@]}"; do
  mkdir -p "corpus/$target" "seeds/$target"
  fixture_seeds "$target" "corpus/$target"
  log="$logs/$target.log"
  echo "fuzzing $target for $minutes min (log: $log)"
  set +e
  cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 >"$log" 2>&1
  status=$?
  set -e
  executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  per_second=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  coverage=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  features=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  crashes=$(find "artifacts/$target" -type f 2>/dev/null | wc -l)
  result=$([ "$status" -eq 0 ] && echo "clean" || echo "STOPPED (exit $status): see $log")
  echo "| $target | $minutes | ${executions:-?} | ${per_second:-?} | ${coverage:-?} | ${features:-?} | ${corpus:-?} | $crashes | $result |" >> "$report"
done

cat "$report"
