#!/usr/bin/env bash
# Plain-curl smoke test of the core Runtime API flow against an Emberbox server.
#   EMBERBOX_TEST_URL=http://127.0.0.1:8080 EMBERBOX_TEST_KEY=... tests/conformance/curl_smoke.sh
# (RUNTIME_API_URL / RUNTIME_API_KEY are used when the EMBERBOX_ ones are unset.)
# Exits non-zero on the first failure. Needs curl and python3 (for JSON).
set -euo pipefail

URL="${EMBERBOX_TEST_URL:-${RUNTIME_API_URL:-}}"
KEY="${EMBERBOX_TEST_KEY:-${RUNTIME_API_KEY:-}}"
[ -n "$URL" ] && [ -n "$KEY" ] || { echo "set EMBERBOX_TEST_URL and EMBERBOX_TEST_KEY" >&2; exit 2; }
URL="${URL%/}"
export NO_PROXY="${NO_PROXY:+$NO_PROXY,}127.0.0.1,localhost"
TMP="$(mktemp -d)"
SBX=""
cleanup() {
  if [ -n "$SBX" ]; then
    curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $KEY" -H "Idempotency-Key: $(uuid)" \
      "$URL/v1/sandboxes/$SBX" || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; [ -f "$TMP/body" ] && { echo "--- last body:" >&2; head -c 2000 "$TMP/body" >&2; echo >&2; }; exit 1; }
ok() { echo "ok: $*"; }
uuid() { python3 -c 'import uuid; print(uuid.uuid4())'; }
# json FIELD-EXPR < file : prints a Python expression evaluated on the parsed JSON `j`
json() { python3 -c 'import json,sys; j=json.load(sys.stdin); v=eval(sys.argv[1]); print(v if not isinstance(v,(dict,list,bool)) and v is not None else json.dumps(v))' "$1"; }

# call METHOD PATH [curl args...] -> sets $STATUS, body in $TMP/body
call() {
  local method="$1" path="$2"; shift 2
  local extra=()
  [ "$method" != GET ] && extra=(-H "Idempotency-Key: $(uuid)")
  STATUS="$(curl -sS -o "$TMP/body" -w '%{http_code}' -X "$method" --max-time 300 \
    -H "Authorization: Bearer $KEY" -H "X-Runtime-Client: curl-smoke" "${extra[@]}" "$@" "$URL$path")" \
    || fail "$method $path: curl error"
}
expect() { [ "$STATUS" = "$1" ] || fail "expected HTTP $1, got $STATUS ($2)"; }

# 1. create (every field optional) and wait for running
call POST /v1/sandboxes -H 'Content-Type: application/json' -H 'Accept: application/json' -H 'Prefer: wait=60' \
  --data '{"timeoutSeconds": 900, "onLeaseEnd": "stop"}'
case "$STATUS" in 200|201|202) ;; *) fail "create: HTTP $STATUS";; esac
SBX="$(json 'j["id"]' < "$TMP/body")"
STATE="$(json 'j.get("state")' < "$TMP/body")"
ok "created $SBX ($STATE)"
for _ in 1 2 3 4 5; do
  [ "$STATE" = running ] && break
  call GET "/v1/sandboxes/$SBX?waitFor=running&timeoutSeconds=60"
  expect 200 "waitFor=running"
  STATE="$(json 'j.get("state")' < "$TMP/body")"
done
[ "$STATE" = running ] || fail "sandbox $SBX is $STATE, not running"
ok "running"

# 2. exec id -un (non-streamed JSON)
call POST "/v1/sandboxes/$SBX:exec" -H 'Content-Type: application/json' --data '{"command": "id -un"}'
expect 200 "exec id -un"
[ "$(json 'j["exitCode"]' < "$TMP/body")" = 0 ] || fail "id -un exit code"
[ "$(json 'j["stdout"].strip()' < "$TMP/body")" = user ] || fail "id -un is not 'user'"
ok "exec id -un = user"

# 3. write then read a file
printf 'hello from curl\n' > "$TMP/up.txt"
call PUT "/v1/sandboxes/$SBX/files/content?path=%2Fworkspace%2Fsmoke%2Fhello.txt" \
  -H 'Content-Type: application/octet-stream' --data-binary "@$TMP/up.txt"
case "$STATUS" in 200|201|204) ;; *) fail "file PUT: HTTP $STATUS";; esac
STATUS="$(curl -sS -D "$TMP/headers" -o "$TMP/down.txt" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
  -H 'Accept: application/octet-stream' "$URL/v1/sandboxes/$SBX/files/content?path=%2Fworkspace%2Fsmoke%2Fhello.txt")"
expect 200 "file GET"
cmp -s "$TMP/up.txt" "$TMP/down.txt" || fail "file content differs"
LEN="$(grep -i '^x-content-length:' "$TMP/headers" | tr -d '\r' | awk '{print $2}')"
[ -z "$LEN" ] || [ "$LEN" = "$(wc -c < "$TMP/up.txt" | tr -d ' ')" ] || fail "x-content-length $LEN wrong"
ok "file round trip"

# 4. missing file -> 404 file_not_found
call GET "/v1/sandboxes/$SBX/files/content?path=%2Fworkspace%2Fno%2Fsuch%2Ffile.txt" -H 'Accept: application/octet-stream'
expect 404 "missing file"
[ "$(json 'j["error"]["code"]' < "$TMP/body")" = file_not_found ] || fail "missing file code is not file_not_found"
ok "missing file 404 file_not_found"

# 5. stop, then wait until stopped
call POST "/v1/sandboxes/$SBX:stop" -H 'Content-Type: application/json' -H 'Prefer: wait=60' --data '{}'
expect 200 "stop"
[ "$(json 'j["id"]' < "$TMP/body")" = "$SBX" ] || fail "stop answer lacks the sandbox id"
for _ in $(seq 1 60); do
  call GET "/v1/sandboxes/$SBX"
  expect 200 "get after stop"
  [ "$(json 'j.get("state")' < "$TMP/body")" = stopped ] && break
  sleep 2
done
[ "$(json 'j.get("state")' < "$TMP/body")" = stopped ] || fail "sandbox not stopped"
ok "stopped"

# 6. exec after stop -> 409 not_running | sandbox_stopped
call POST "/v1/sandboxes/$SBX:exec" -H 'Content-Type: application/json' --data '{"command": "true"}'
expect 409 "exec after stop"
CODE="$(json 'j["error"]["code"]' < "$TMP/body")"
case "$CODE" in not_running|sandbox_stopped) ;; *) fail "exec after stop code $CODE";; esac
ok "exec after stop 409 $CODE"

echo "curl smoke: all passed"
