#!/bin/sh
# fuzz.sh runs every Go fuzz target (func FuzzX in a _test.go file) for a
# bounded time each: $1 seconds, default 5. A crash fails the script; go
# test writes the input to the package's testdata/fuzz/FuzzX/, where it then
# runs as a test case with every go test. FUZZ_PARALLEL sets the workers
# per target (default: one per CPU).
set -eu
cd "$(dirname "$0")/.."

secs=${1:-5}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
targets=$(grep -rE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' internal cmd |
	sed -E 's|^(.*)/[^/]*:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|' | sort)
start=$(date +%s)
echo "$targets" | while read -r dir name; do
	echo "== $dir $name (${secs}s)"
	tries=0
	until go test -run '^$' -fuzz "^$name\$" -fuzztime "${secs}s" ${FUZZ_PARALLEL:+-parallel "$FUZZ_PARALLEL"} "./$dir/" >"$log" 2>&1; do
		# A crash always leaves its input in testdata. go test can also
		# fail with a bare "context deadline exceeded" when -fuzztime ends
		# while a busy worker is still answering the coordinator: that is
		# no finding, so it is run again (at most twice).
		tries=$((tries + 1))
		if grep -q 'Failing input written' "$log" || ! grep -q 'context deadline exceeded' "$log" || [ "$tries" -gt 2 ]; then
			cat "$log"
			exit 1
		fi
		echo "   (fuzzing stopped late, no failing input; running it again)"
	done
	grep '^fuzz: elapsed' "$log" | tail -n 1
done
echo "== all fuzz targets ran in $(($(date +%s) - start))s"
