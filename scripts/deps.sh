#!/bin/sh
# deps.sh installs what an emberbox host needs (Debian/Ubuntu, as root):
# QEMU, qemu-img, mmdebstrap, mkfs.ext4, cpio, CA certificates, Chromium (for
# the web console's browser test, run headless; nothing downloads a browser
# build), PostgreSQL (the store's tests run a throwaway server from its
# binaries; internal/pgtest), and Go if it is missing. On a machine that already has everything it only checks, and
# never touches the network.
set -eu

die() { echo "deps.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages with apt-get)"
command -v apt-get >/dev/null 2>&1 || die "needs a Debian or Ubuntu host (apt-get not found)"

# package:command-or-path pairs; a package counts as present if dpkg knows it
# or its command is on PATH.
need="
qemu-system-x86:qemu-system-x86_64
qemu-utils:qemu-img
mmdebstrap:mmdebstrap
e2fsprogs:mkfs.ext4
cpio:cpio
ca-certificates:/etc/ssl/certs/ca-certificates.crt
chromium:chromium
postgresql:/usr/lib/postgresql
"

missing=""
for pair in $need; do
	pkg=${pair%%:*}
	probe=${pair#*:}
	if dpkg -s "$pkg" >/dev/null 2>&1; then
		continue
	fi
	case $probe in
	/*) [ -e "$probe" ] && continue ;;
	*) command -v "$probe" >/dev/null 2>&1 && continue ;;
	esac
	missing="$missing $pkg"
done

# The Go version go.mod asks for, e.g. 1.26.8.
here=$(cd "$(dirname "$0")/.." && pwd)
want_go=$(awk '$1 == "go" { print $2; exit }' "$here/go.mod" 2>/dev/null || true)
[ -n "$want_go" ] || die "cannot read the go version from $here/go.mod"

# version_ge A B: is A >= B (dotted numbers)?
version_ge() {
	[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

need_go=0
if ! command -v go >/dev/null 2>&1; then
	need_go=1
else
	have_go=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
	if [ -n "$have_go" ] && ! version_ge "$have_go" "$want_go"; then
		echo "deps.sh: warning: go $have_go is older than go.mod's $want_go" >&2
	fi
fi

if [ -z "$missing" ] && [ "$need_go" -eq 0 ]; then
	echo "deps.sh: all host dependencies present"
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
echo "deps.sh: updating package lists"
apt-get update -qq

if [ "$need_go" -eq 1 ]; then
	# Debian's golang-go is usually older than go.mod wants; only use it
	# when it is new enough. "2:1.19~1" -> "1.19".
	deb_go=$(apt-cache policy golang-go 2>/dev/null | awk '/Candidate:/ { print $2 }' |
		sed -e 's/^[0-9]*://' -e 's/[~+-].*//')
	if [ -n "$deb_go" ] && [ "$deb_go" != "(none)" ] && version_ge "$deb_go" "$want_go"; then
		missing="$missing golang-go"
	else
		echo "deps.sh: Go $want_go or newer is required, but go is not installed and" >&2
		echo "deps.sh: the distribution offers only golang-go ${deb_go:-(none)}." >&2
		echo "deps.sh: install Go from https://go.dev/dl/ (e.g. into /usr/local/go) and add it to PATH." >&2
		need_go=2
	fi
fi

if [ -n "$missing" ]; then
	echo "deps.sh: installing$missing"
	# shellcheck disable=SC2086 # word splitting is intended
	apt-get install -y -qq --no-install-recommends $missing
fi

[ "$need_go" -eq 2 ] && exit 1
echo "deps.sh: done"
