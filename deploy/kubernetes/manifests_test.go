package kubernetes

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Where a node keeps its files, inside the pod and on the host.
const (
	dataDir  = "/var/lib/emberbox"
	cacheDir = "/var/cache/emberbox"
	apiPort  = 8080
)

// nodeFlags are the `emberbox serve` flags of cluster mode with the values
// every rendering must give them. The store URL is not among them: serve
// reads $EMBERBOX_STORE itself, so the password stays out of the process
// list.
var nodeFlags = map[string]string{
	"--node-id":           "$(NODE_NAME)",
	"--listen":            "0.0.0.0:8080",
	"--cluster-listen":    "0.0.0.0:7443",
	"--cluster-advertise": "$(POD_IP):7443",
	"--data-dir":          dataDir,
	"--cache-dir":         cacheDir,
	"--metrics-listen":    "0.0.0.0:9464",
}

// TestManifests decodes every committed manifest strictly and checks what
// a node needs from it.
func TestManifests(t *testing.T) {
	for _, tc := range []struct {
		file               string
		storeName, storeKy string // the Secret EMBERBOX_STORE is read from
		cnpg               bool   // the file holds a CloudNativePG Cluster
	}{
		{file: "emberbox.yaml", storeName: "emberbox-postgres", storeKy: "url"},
		{file: "emberbox-cnpg.yaml", storeName: "emberbox-pg-app", storeKy: "uri", cnpg: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			objs := readManifest(t, filepath.Join("manifests", tc.file))
			w := checkRelease(t, objs)
			if w.store.Name != tc.storeName || w.store.Key != tc.storeKy {
				t.Errorf("EMBERBOX_STORE from Secret %q key %q, want %q key %q", w.store.Name, w.store.Key, tc.storeName, tc.storeKy)
			}
			if w.caSecret != "emberbox-cluster-ca" {
				t.Errorf("cluster CA from Secret %q, want emberbox-cluster-ca (made by the operator)", w.caSecret)
			}
			// A committed file is applied by many: it must carry no
			// credentials and no CA of its own.
			for _, o := range objs {
				if _, ok := o.value.(*corev1.Secret); ok {
					t.Errorf("document %d: Secret %q in a committed manifest", o.index, o.name)
				}
			}
			c, err := only[*cnpgCluster](objs)
			switch {
			case tc.cnpg && err != nil:
				t.Error(err)
			case tc.cnpg:
				checkCNPG(t, c, w)
			case err == nil:
				t.Errorf("a CloudNativePG Cluster %q in %s", c.Name, tc.file)
			}
		})
	}
	// Every rendered file has a row above.
	files, err := filepath.Glob("manifests/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		files[i] = filepath.Base(files[i])
	}
	if want := []string{"emberbox-cnpg.yaml", "emberbox.yaml"}; !slices.Equal(files, want) {
		t.Errorf("manifests/ holds %v, want %v", files, want)
	}
}

func readManifest(t *testing.T, path string) []object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifest(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

// wiring is where a rendering's node reads its Secrets from.
type wiring struct {
	store    corev1.SecretKeySelector // EMBERBOX_STORE
	caSecret string                   // ca.crt and ca.key
}

// checkRelease checks the node's DaemonSet and the Service of a rendering
// with the chart's default node values, and returns the node's wiring.
func checkRelease(t *testing.T, objs []object) wiring {
	t.Helper()
	checkNames(t, objs)
	ds, err := only[*appsv1.DaemonSet](objs)
	if err != nil {
		t.Fatal(err)
	}
	spec := &ds.Spec.Template.Spec
	podLabels := labels.Set(ds.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("DaemonSet selector %v (%v) does not select its pods' labels %v", ds.Spec.Selector, err, podLabels)
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil || *u.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
		t.Errorf("update strategy %+v, want RollingUpdate with maxUnavailable 1", u)
	}
	if v := spec.NodeSelector["emberbox.dev/node"]; v != "true" {
		t.Errorf("nodeSelector %v, want emberbox.dev/node=true", spec.NodeSelector)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("service links enabled: Kubernetes would add EMBERBOX_* variables of the Service to the node's environment")
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("terminationGracePeriodSeconds %v, want at least 30", g)
	}
	if spec.ServiceAccountName == "" {
		t.Error("no serviceAccountName")
	} else if _, ok := find[*corev1.ServiceAccount](objs, spec.ServiceAccountName); !ok {
		t.Errorf("ServiceAccount %q is not in the manifest", spec.ServiceAccountName)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the node container is not privileged (VMs need /dev/kvm, cgroups and namespaces)")
	}
	if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
		t.Error("no memory request")
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		t.Error("a memory limit: it would cap every VM of the node, which run in the pod's cgroup")
	}

	// The command line: the flags of cluster mode, with every $(VAR) it
	// names defined (Kubernetes leaves an undefined one as it is).
	if !slices.Equal(c.Command, []string{"emberbox"}) || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("command %q args %q, want emberbox serve …", c.Command, c.Args)
	}
	flags := map[string]string{}
	for i := 1; i < len(c.Args); i += 2 {
		if !strings.HasPrefix(c.Args[i], "--") || i+1 == len(c.Args) {
			t.Fatalf("args %q: %q is not a flag with a value", c.Args, c.Args[i])
		}
		if _, dup := flags[c.Args[i]]; dup {
			t.Errorf("flag %s given twice", c.Args[i])
		}
		flags[c.Args[i]] = c.Args[i+1]
	}
	for f, want := range nodeFlags {
		if got, ok := flags[f]; !ok || got != want {
			t.Errorf("flag %s = %q (given: %v), want %q", f, got, ok, want)
		}
	}
	if v, ok := flags["--store"]; ok {
		t.Errorf("--store %q on the command line puts the database password in the process list; serve reads $EMBERBOX_STORE", v)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(strings.Join(c.Args, " "), -1) {
		if _, ok := env[m[1]]; !ok {
			t.Errorf("args name $(%s), which the container's env does not define", m[1])
		}
	}
	for name, path := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP"} {
		if e := env[name]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("env %s = %+v, want it from the downward API's %s", name, e, path)
		}
	}
	var w wiring
	if e := env["EMBERBOX_STORE"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
		t.Errorf("env EMBERBOX_STORE = %+v, want it from a Secret", e)
	} else {
		w.store = *e.ValueFrom.SecretKeyRef
		if w.store.Optional != nil && *w.store.Optional {
			t.Error("EMBERBOX_STORE's Secret is optional: a node would start on SQLite")
		}
		if s, ok := find[*corev1.Secret](objs, w.store.Name); ok && !hasKey(s, w.store.Key) {
			t.Errorf("Secret %q has no key %q", s.Name, w.store.Key)
		}
	}

	// Volumes: /dev/kvm, the data dir and the image cache from the host,
	// the cluster CA from a Secret.
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.Volume{} // by mount path
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Errorf("volume mount %q names no volume", m.Name)
		}
		mounts[m.MountPath] = v
	}
	for _, h := range []struct {
		mount, host string
		typ         corev1.HostPathType
	}{
		{"/dev/kvm", "/dev/kvm", corev1.HostPathCharDev},
		{dataDir, dataDir, corev1.HostPathDirectoryOrCreate},
		{cacheDir, cacheDir, corev1.HostPathDirectoryOrCreate},
	} {
		v := mounts[h.mount].HostPath
		if v == nil || v.Path != h.host || v.Type == nil || *v.Type != h.typ {
			t.Errorf("%s: mounted from %+v, want hostPath %s of type %s", h.mount, v, h.host, h.typ)
		}
	}
	for _, f := range []string{"--cluster-ca-cert", "--cluster-ca-key"} {
		v := mounts[filepath.Dir(flags[f])].Secret
		if v == nil {
			t.Errorf("%s %q: no Secret is mounted at its directory", f, flags[f])
			continue
		}
		if w.caSecret != "" && w.caSecret != v.SecretName {
			t.Errorf("the CA certificate and key come from Secrets %q and %q", w.caSecret, v.SecretName)
		}
		w.caSecret = v.SecretName
	}
	if filepath.Base(flags["--cluster-ca-cert"]) != "ca.crt" || filepath.Base(flags["--cluster-ca-key"]) != "ca.key" {
		t.Errorf("CA files %q, %q, want the Secret's ca.crt and ca.key", flags["--cluster-ca-cert"], flags["--cluster-ca-key"])
	}
	if s, ok := find[*corev1.Secret](objs, w.caSecret); ok && (!hasKey(s, "ca.crt") || !hasKey(s, "ca.key")) {
		t.Errorf("Secret %q lacks ca.crt or ca.key", s.Name)
	}

	// Ports and probes.
	for name, port := range map[string]int32{"http": apiPort, "cluster": 7443, "metrics": 9464} {
		if got := containerPort(c, intstr.FromString(name)); got != port {
			t.Errorf("container port %q = %d, want %d", name, got, port)
		}
	}
	if a := ds.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9464" || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v, want Prometheus to scrape :9464/metrics", a)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || containerPort(c, p.HTTPGet.Port) != apiPort {
			t.Errorf("%s probe %+v, want GET /healthz on port %d", name, p, apiPort)
		}
	}

	// The Service in front of the API selects the node pods.
	svc, err := only[*corev1.Service](objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select the node pods %v", svc.Spec.Selector, podLabels)
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service type %q, want ClusterIP", svc.Spec.Type)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || containerPort(c, svc.Spec.Ports[0].TargetPort) != apiPort {
		t.Errorf("Service ports %+v, want 80 to the API's %d", svc.Spec.Ports, apiPort)
	}
	return w
}

// checkNames checks the names, labels and annotations the API server
// validates beyond decoding: object names, label keys and values,
// annotation keys, and the names of containers, ports, volumes and
// environment variables.
func checkNames(t *testing.T, objs []object) {
	t.Helper()
	check := func(what, v string, errs []string) {
		t.Helper()
		if len(errs) > 0 {
			t.Errorf("%s %q: %s", what, v, strings.Join(errs, "; "))
		}
	}
	meta := func(where string, m metav1.ObjectMeta) {
		t.Helper()
		for k, v := range m.Labels {
			check(where+" label key", k, validation.IsQualifiedName(k))
			check(where+" label value", v, validation.IsValidLabelValue(v))
		}
		for k := range m.Annotations {
			check(where+" annotation key", k, validation.IsQualifiedName(k))
		}
	}
	for _, o := range objs {
		where := fmt.Sprintf("document %d (%s)", o.index, o.kind)
		switch v := o.value.(type) {
		case *corev1.Service:
			// A Service's name is a DNS label that starts with a letter.
			check(where+" name", o.name, validation.IsDNS1035Label(o.name))
			meta(where, v.ObjectMeta)
			for _, p := range v.Spec.Ports {
				check(where+" port name", p.Name, validation.IsValidPortName(p.Name))
			}
		case *appsv1.DaemonSet:
			check(where+" name", o.name, validation.IsDNS1123Subdomain(o.name))
			meta(where, v.ObjectMeta)
			meta(where+" pod", v.Spec.Template.ObjectMeta)
			for _, vol := range v.Spec.Template.Spec.Volumes {
				check(where+" volume name", vol.Name, validation.IsDNS1123Label(vol.Name))
			}
			for _, c := range v.Spec.Template.Spec.Containers {
				check(where+" container name", c.Name, validation.IsDNS1123Label(c.Name))
				for _, p := range c.Ports {
					check(where+" port name", p.Name, validation.IsValidPortName(p.Name))
				}
				for _, e := range c.Env {
					check(where+" env name", e.Name, validation.IsEnvVarName(e.Name))
				}
			}
		case *corev1.Secret:
			check(where+" name", o.name, validation.IsDNS1123Subdomain(o.name))
			meta(where, v.ObjectMeta)
			for k := range v.Data {
				check(where+" key", k, validation.IsConfigMapKey(k))
			}
			for k := range v.StringData {
				check(where+" key", k, validation.IsConfigMapKey(k))
			}
		case *corev1.ServiceAccount:
			check(where+" name", o.name, validation.IsDNS1123Subdomain(o.name))
			meta(where, v.ObjectMeta)
		case *cnpgCluster:
			// The operator names pods and Services after the cluster.
			check(where+" name", o.name, validation.IsDNS1035Label(o.name))
			meta(where, v.ObjectMeta)
		default:
			t.Errorf("%s: no name checks for %T", where, v)
		}
	}
}

// checkCNPG checks the CloudNativePG Cluster and that the node reads the
// URL the operator writes for it.
func checkCNPG(t *testing.T, c *cnpgCluster, w wiring) {
	t.Helper()
	if c.Spec.Instances < 1 {
		t.Errorf("instances %d", c.Spec.Instances)
	}
	if c.Spec.Bootstrap.InitDB.Database == "" || c.Spec.Bootstrap.InitDB.Owner == "" {
		t.Errorf("bootstrap.initdb %+v: want a database and its owner", c.Spec.Bootstrap.InitDB)
	}
	if q, err := resource.ParseQuantity(c.Spec.Storage.Size); err != nil || q.Sign() <= 0 {
		t.Errorf("storage size %q: %v", c.Spec.Storage.Size, err)
	}
	// The operator writes the owner's connection URL to <cluster>-app.
	if want := (corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: c.Name + "-app"}, Key: "uri"}); w.store != want {
		t.Errorf("EMBERBOX_STORE from %+v, want the operator's %+v", w.store, want)
	}
}

// containerPort resolves a port by number or name, or returns 0.
func containerPort(c *corev1.Container, p intstr.IntOrString) int32 {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	return 0
}

func hasKey(s *corev1.Secret, key string) bool {
	_, a := s.Data[key]
	_, b := s.StringData[key]
	return a || b
}

// TestDecodeIsStrict checks that the decoding above refuses what the API
// server's strict field validation refuses.
func TestDecodeIsStrict(t *testing.T) {
	const ok = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\nspec:\n  type: ClusterIP\n"
	if _, err := decodeManifest([]byte(ok)); err != nil {
		t.Fatalf("a valid Service: %v", err)
	}
	for name, doc := range map[string]string{
		"unknown field":       strings.Replace(ok, "type:", "typo:", 1),
		"field of wrong case": strings.Replace(ok, "type:", "Type:", 1),
		"duplicate field":     ok + "  type: NodePort\n",
		"unknown kind":        strings.Replace(ok, "Service", "Servise", 1),
		"wrong value type":    strings.Replace(ok, "name: a", "name: [a]", 1),
		"unknown CNPG field":  "apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  instance: 3\n",
	} {
		if _, err := decodeManifest([]byte("---\n" + doc)); err == nil {
			t.Errorf("%s: decoded without error:\n%s", name, doc)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
