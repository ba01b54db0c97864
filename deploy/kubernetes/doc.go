// Package kubernetes holds no code, only tests of the Kubernetes deployment
// beside it: the Helm chart in chart/emberbox and the plain manifests
// render.sh makes from it in manifests/. The tests decode every rendered
// object strictly into its Kubernetes API type, check the facts a node
// depends on (flags, devices, host paths, probes, Secrets), and, where Helm
// is installed, lint the chart and check the committed manifests are what
// the chart renders now.
package kubernetes
