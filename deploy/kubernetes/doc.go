// Package kubernetes holds no code, only tests of the Kubernetes deployment
// beside it: the Helm chart in chart/emberbox and the plain manifests render.sh
// makes from it in manifests/. The tests decode every rendered object strictly
// into its Kubernetes API type, check the facts a node depends on (flags,
// devices, host paths, probes, Secrets), and, where Helm is installed, lint the
// chart and check the committed manifests are what the chart renders now.
//
// # What is here
//
// How to install: docs/cluster.md. What is there:
//
//   - `chart/emberbox` (Helm, apiVersion v2): a DaemonSet, one node per host
//     labelled `emberbox.dev/node=true` (`node.nodeSelector`,
//     `node.tolerations`), running `emberbox serve` with the cluster flags:
//     `--store $(EMBERBOX_STORE)` from a Secret, `--node-id $(NODE_NAME)`
//     (spec.nodeName) and `--cluster-advertise $(POD_IP):7443` (status.podIP)
//     from the downward API, `--cluster-ca-cert/--cluster-ca-key` from the
//     mounted CA Secret, the API on 0.0.0.0:8080, metrics on 9464
//     (`prometheus.io/*` pod annotations). Privileged (the VMs' `/dev/kvm`,
//     cgroups, namespaces, uids); hostPaths `/dev/kvm` (CharDevice,
//     `node.kvm`), `/var/lib/emberbox` and `/var/cache/emberbox`
//     (DirectoryOrCreate); startup, liveness and readiness probes on `GET
//     /healthz` (the startup probe allows 15 minutes, for the first guest image
//     build); no memory limit, since the VMs live in the pod's cgroup;
//     RollingUpdate, maxUnavailable 1. A ClusterIP Service (port 80 → 8080) in
//     front of the API; a ServiceAccount without a token. `values.schema.json`
//     refuses unknown and mistyped values.
//   - PostgreSQL: `postgres.cnpg.enabled` renders a CloudNativePG `Cluster` and
//     reads the operator's Secret `<cluster>-app`, key `uri`; else
//     `postgres.external.url` becomes a chart Secret; else
//     `postgres.existingSecret` (key `url`) is read.
//   - Cluster CA: `cluster.ca.existingSecret`, or a Secret the chart generates
//     once (`genCAWithKey`, ECDSA P-256, 10 years), read back with `lookup` on
//     upgrades and kept on uninstall.
//   - `manifests/`: `render.sh` (`make manifests`) lints the chart with `helm
//     lint --strict` and renders `emberbox.yaml` (external PostgreSQL) and
//     `emberbox-cnpg.yaml`, both naming Secrets the operator makes (no
//     credentials or CA in a committed file).
//   - `Dockerfile`: the node image, Debian bookworm with QEMU, qemu-utils,
//     mmdebstrap, e2fsprogs, cpio and the two binaries; apt lists are kept,
//     since the server resolves the guest kernel with apt.
//   - Tests (`package kubernetes`, test-only): every rendered document is
//     decoded strictly (sigs.k8s.io/yaml, then sigs.k8s.io/json with unknown
//     and duplicate fields refused, case-sensitive) into its `k8s.io/api` type,
//     or a local struct for CNPG's Cluster; then the facts a node needs are
//     checked (flags and that every `$(VAR)` is defined, privileged, host
//     paths, probes, ports, the Service selecting the pods, the Secret wiring,
//     names as the API server validates them, and docs/cluster.md's copy of the
//     command line). With Helm (`$EMBERBOX_HELM`, PATH or
//     `~/.cache/emberbox-tools/helm`, which `scripts/test.sh` builds from the
//     Go module proxy; skipped without it except under `$CI`) they run
//     `render.sh` and require the committed files to equal a fresh render, and
//     check other values (generated CA, external URL, no store, no KVM, values
//     the schema refuses).
package kubernetes
