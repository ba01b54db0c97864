// Package egress is the host side of a sandbox's network: the policy that says
// where a sandbox may connect, the addresses no sandbox may ever reach, and the
// proxy and DNS resolver that the guest's relay forwards to. Names are resolved
// on the host and every connection goes to an address the host resolved and
// checked itself, so a guest cannot rebind a name it was allowed to another
// address.
//
// `Policy`/`Compile` (domain, `*.domain`, IP, CIDR; deny wins), `Operator`
// (always-refused ranges, operator-opened ranges, name overrides, closed host
// services such as the API itself, the dialer, interception), `Gate` per
// sandbox (`Resolve`, `Dial`, `ServeProxy`, `ServeTCP`, `AnswerDNS`,
// `SetPolicy` cutting refused open connections, `SetSwapper`, counters,
// `OnRefuse`), `CA` (the egress-secrets certificate authority).
//
//   - Guest relay (`internal/agent/egress.go`, started by PID 1): an HTTP proxy
//     port `127.0.0.1:10800` (`HTTP(S)_PROXY`, `http(s)_proxy`,
//     `NO_PROXY=localhost,127.0.0.1,::1` in every command's env), each
//     connection a guest-opened `egress.proxy` stream; a DNS resolver on
//     `127.0.0.1:53` (UDP, TCP; `/etc/resolv.conf` points to it), each query an
//     `egress.dns` stream; capture of programs that ignore the proxy: a dummy
//     interface `emberbox0` (198.18.0.1/32) carries a default route, and
//     nftables (table `ip emberbox`) redirects every outbound TCP connection
//     not for 127/8 to `127.0.0.1:10801` (the relay reads `SO_ORIGINAL_DST`,
//     opens `egress.tcp`) and UDP 53 to the resolver, and drops every other
//     packet (EPERM at once). If capture cannot be set up, the route is removed
//     so raw connections fail with ENETUNREACH. The relay only carries bytes:
//     root undoing it gains nothing, as there is no network card.
//   - Host gate (`internal/egress`, one per live sandbox, built from the stored
//     policy at create and at `Recover`): the HTTP/CONNECT proxy, `ServeTCP`
//     and `AnswerDNS`. Names are checked, resolved on the host (operator
//     overrides first), every address checked, and the connection goes to an
//     address it checked. DNS answers carry per-sandbox stand-in addresses from
//     198.19.0.0/16, which the gate maps back to the name when a captured or
//     proxied connection arrives; the guest never learns real addresses.
//   - Always refused (unless `--egress-open`): 0/8, 10/8, 100.64/10, 127/8,
//     169.254/16, 172.16/12, 192.0.0/24, 192.168/16, 198.18/15, 224/4, 240/4,
//     ::/96, 64:ff9b::/96, 64:ff9b:1::/48, 2002::/16, 2001::/32, fc00::/7,
//     fe80::/10, fec0::/10, ff00::/8, 100::/64, the host's interface addresses,
//     v4-mapped forms; ports 25/465/587; the server's own `--listen` address
//     even where opened. Never opened, whatever `--egress-open` says: the cloud
//     host agent 168.63.129.16, the metadata and credential addresses
//     169.254.169.254, 169.254.170.2, 169.254.170.23, 100.100.100.200,
//     fd00:ec2::254 and fd00:ec2::23 (also as the IPv4 an IPv6 address carries:
//     mapped, NAT64, 6to4, Teredo), and the ranges of `--egress-deny-cidr`.
//   - Refusals: a 403 with `X-Emberbox-Egress: internet-off | rule-not-allowed
//     | address-forbidden | port-forbidden` from the proxy; a reset for
//     captured TCP; NXDOMAIN (REFUSED with internet off) from DNS. Each is
//     counted and recorded as an `egress_refused` event (the first 100, then
//     every 100th).
//   - Policy changes (`PUT /v1/sandboxes/{id}/network`): stored with version
//     +1, applied to the gate at once; open connections the new policy refuses
//     are closed. `GET` reports `version`, `enforced`, `enforcedVersion` and
//     the byte counters (`egress.bytesIn/bytesOut`, for metering).
//   - Ceiling: `--egress-max` (rules; `!rule` denies, `off` for none) is
//     `Operator.Max`. `Compiled.Intersect` makes the policy both admit: denies
//     united, allow lists intersected rule by rule (names, `*.suffix` and CIDRs
//     either nest or do not meet, so each pairwise intersection is one of the
//     two rules); two allow lists with nothing in common give internet off. The
//     gate applies `Operator.Limit(pol)` in `NewGate` and `SetPolicy`, so no
//     path can skip it; the store keeps the policy asked for, and `GET
//     …/network` reports the one that applies (`limitedByOperator`).
//   - Stand-ins: at most `MaxStandIns` (4096) names per sandbox, least recently
//     used first out, and only once idle for 60 s (twice the TTL): until then a
//     new name gets SERVFAIL rather than another name's address.
//   - Egress secrets (`Operator.Intercept`, `Gate.SetSwapper`): a connection
//     the policy admitted, by CONNECT or captured to a name's stand-in (never
//     to a raw address), whose host the sandbox's `Swapper` names has its TLS
//     terminated at the gate with a leaf of the server's `CA` (P-256, 7 days,
//     cached; guests trust the CA). Its HTTP/1.1 or HTTP/2 requests are sent
//     on to that host:port only, over TLS the gate verifies itself against
//     `Interception.Roots` (a host it cannot verify gets a 502 and nothing
//     is sent), further connections going through `Dial` and so the policy.
//     The swapper puts real values in for placeholders on requests whose
//     Host names the host; everything else (path, query, body, other
//     headers, upgrades, streamed bodies) passes as sent, hop-by-hop headers
//     aside, and every other connection is piped as before.
//   - Server flags: `--egress-default internet|off`, `--egress-open CIDR`,
//     `--egress-max RULES`, `--egress-deny-cidr CIDR`, `--egress-resolve
//     name=ip[,ip]`, `--extra-ca-file` (default: the host's
//     `/etc/ssl/certs/ca-certificates.crt`), sent at `configure`, appended to
//     the guest's bundle; `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `PIP_CERT`,
//     `CURL_CA_BUNDLE` and `NODE_EXTRA_CA_CERTS` are set for commands.
package egress
