#!/bin/sh
# render.sh lints the chart (helm lint --strict) and renders the plain
# manifests from it into manifests/ (or the directory given): emberbox.yaml
# for an external PostgreSQL, emberbox-cnpg.yaml with a CloudNativePG
# cluster. Both name Secrets the operator makes (docs/cluster.md): a
# rendered file must hold no credentials, and a CA generated into a
# committed file would be everyone's CA.
#
# Helm: $HELM or $EMBERBOX_HELM, else helm on PATH, else the one
# scripts/test.sh builds into ~/.cache/emberbox-tools:
#   GOBIN=~/.cache/emberbox-tools go install helm.sh/helm/v3/cmd/helm@v3.22.0
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/manifests}
chart=$here/chart/emberbox

helm=${HELM:-${EMBERBOX_HELM:-}}
if [ -z "$helm" ]; then
	if command -v helm >/dev/null 2>&1; then
		helm=helm
	else
		helm=${XDG_CACHE_HOME:-$HOME/.cache}/emberbox-tools/helm
	fi
fi
command -v "$helm" >/dev/null 2>&1 || {
	echo "render.sh: helm not found (set HELM, or: GOBIN=\$HOME/.cache/emberbox-tools go install helm.sh/helm/v3/cmd/helm@v3.22.0)" >&2
	exit 1
}

# The values of each rendered file, as helm flags.
common="--set cluster.ca.existingSecret=emberbox-cluster-ca"
external="$common"
cnpg="$common --set postgres.cnpg.enabled=true"

# The chart's defaults, then each rendering's values; quiet unless it fails.
for flags in "" "$external" "$cnpg"; do
	# shellcheck disable=SC2086 # the flags are meant to split
	if ! lint=$("$helm" lint --strict "$chart" $flags 2>&1); then
		printf 'render.sh: helm lint --strict %s\n%s\n' "$flags" "$lint" >&2
		exit 1
	fi
done

mkdir -p "$out"
render() { # render FILE FLAGS...
	file=$1
	shift
	{
		echo "# Rendered from deploy/kubernetes/chart/emberbox by deploy/kubernetes/render.sh"
		echo "# (helm template emberbox $*); do not edit: change the chart and re-render."
		"$helm" template emberbox "$chart" "$@"
	} >"$out/$file.tmp"
	mv "$out/$file.tmp" "$out/$file"
}
# shellcheck disable=SC2086
render emberbox.yaml $external
# shellcheck disable=SC2086
render emberbox-cnpg.yaml $cnpg
