#!/usr/bin/env bash
# One line on the disk, for CI's log: what is free where the checkout lives, and how
# much a build folder holds. A CI run that dies of a full disk then says so, and how
# full it was before we started. Never fails the run it reports on.
#     scripts/disk-report.sh WHEN [FOLDER]
when=$1
folder=${2:-}
free=$(df -h --output=avail,size . 2>/dev/null | awk 'NR == 2 { print $1 " free of " $2 }')
line="disk $when: ${free:-unknown}"
if [ -n "$folder" ] && [ -d "$folder" ]; then
    line="$line; $folder holds $(du -sh "$folder" 2>/dev/null | cut -f1)"
fi
echo "$line"
