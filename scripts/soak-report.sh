# The soak's report (sourced by scripts/soak.sh, whose variables it reads): the
# samples as a table, the counts, how each process stopped, and the verdict.
#
# Flat after warm-up (the first fifth of the samples, at least one): RSS grew by at
# most max(2 MiB, 2 %) from its lowest to its last sample; open files varied by at
# most 2 (a scrape's connection may be open at the instant of a sample); pinned never
# above the first post-warm-up sample by more than a block; threads never changed —
# except in the server, which starts a session's actor thread and opens the files of
# each stage of a job while it runs: a sample may fall inside a job, so there threads
# and open files must not grow (the second half's most no more than the first half's;
# open files, as everywhere, give or take the 2 a scrape may hold),
# and its RSS is judged by its floor — the second half's lowest sample at most
# max(2 MiB, 2 %) above the first half's lowest — since a sample taken during an image
# job holds that job's buffers (a leak raises the floor; a job in flight raises one
# sample).
report="$dir/report.md"
{
  echo "### Soak$([ "$serve_only" = yes ] && echo " of the server"): $seconds s on $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
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
  echo "| server client | answered as asked | 4xx | 5xx | no answer or other |"
  echo "|---|---|---|---|---|"
  printf "%s" "$requests_line"
  echo
  if [ "$serve_only" = no ]; then
    echo "Short attach/detach runs: $cycle_runs passed, $cycle_failures failed."
  fi
  echo "Metrics scrapes: $scrapes_ok answered, $scrapes_failed failed."
  echo
  echo "| process | exit status | budgets released |"
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
        if (n[p] <= warm + 1) { printf "- %s: too few samples (%d) for a verdict\n", p, n[p]; verdict = "UNDECIDED"; continue }
        low = rss[p, warm + 1]; tmin = thr[p, warm + 1]; tmax = tmin; fmin = fd[p, warm + 1]; fmax = fmin
        pfirst = pin[p, warm + 1]; pmax = pfirst
        half = warm + int((n[p] - warm) / 2); first_half = 0; second_half = 0; ffirst = 0; fsecond = 0
        low_first = rss[p, warm + 1]; low_second = rss[p, n[p]]
        for (i = warm + 1; i <= n[p]; i++) {
          if (rss[p, i] < low) low = rss[p, i]
          if (i <= half && rss[p, i] < low_first) low_first = rss[p, i]
          if (i > half && rss[p, i] < low_second) low_second = rss[p, i]
          if (thr[p, i] < tmin) tmin = thr[p, i]; if (thr[p, i] > tmax) tmax = thr[p, i]
          if (i <= half && thr[p, i] > first_half) first_half = thr[p, i]
          if (i > half && thr[p, i] > second_half) second_half = thr[p, i]
          if (fd[p, i] < fmin) fmin = fd[p, i]; if (fd[p, i] > fmax) fmax = fd[p, i]
          if (i <= half && fd[p, i] > ffirst) ffirst = fd[p, i]
          if (i > half && fd[p, i] > fsecond) fsecond = fd[p, i]
          if (pin[p, i] != "" && pin[p, i] > pmax) pmax = pin[p, i]
        }
        growth = (p == "serve") ? low_second - low_first : rss[p, n[p]] - low
        allowed = low * 0.02; if (allowed < 2048) allowed = 2048
        threads_ok = (p == "serve") ? (second_half <= first_half) : (tmax == tmin)
        files_ok = (p == "serve") ? (fsecond <= ffirst + 2) : (fmax - fmin <= 2)
        flat = (growth <= allowed) && threads_ok && files_ok
        printf "- %s: RSS %+d KiB after warm-up%s (allowed %d), threads %d..%d (most: %d then %d), open files %d..%d (most: %d then %d), pinned peak %.1f MiB (first %.1f): %s\n",
          p, growth, (p == "serve") ? ", lowest of the second half against the first half" : "", allowed, tmin, tmax, first_half, second_half, fmin, fmax, ffirst, fsecond, pmax / 1048576, pfirst / 1048576, flat ? "flat" : "NOT FLAT"
        if (!flat) verdict = "NOT FLAT"
      }
      if (ended_early == "yes") verdict = "FAILED: a process ended before the soak did"
      else if (endings_ok != "yes") verdict = verdict ", but a long run or the server did not stop cleanly"
      if (runs_failed > 0 || scrapes_failed > 0) verdict = verdict " (with failed runs, requests or scrapes)"
      printf "\n**Verdict: %s.**\n", verdict
    }' "$dir/samples.csv"
} >"$report"
cat "$report"
