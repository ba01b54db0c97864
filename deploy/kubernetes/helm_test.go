package kubernetes

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// helmVersion is the Helm scripts/test.sh installs, and the hint given
// where none is found.
const helmVersion = "v3.22.0"

// findHelm returns the helm binary to run: $EMBERBOX_HELM, else helm on
// PATH, else the one scripts/test.sh builds into the user's cache. Without
// one the test is skipped, except in CI, which installs it.
func findHelm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("EMBERBOX_HELM"); h != "" {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	var dirs []string
	if d, err := os.UserCacheDir(); err == nil {
		dirs = append(dirs, d)
	}
	for _, d := range append(dirs, "/root/.cache") {
		h := filepath.Join(d, "emberbox-tools", "helm")
		if fi, err := os.Stat(h); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return h
		}
	}
	msg := "helm not found ($EMBERBOX_HELM, PATH, ~/.cache/emberbox-tools/helm); install it with: " +
		"GOBIN=$HOME/.cache/emberbox-tools go install helm.sh/helm/v3/cmd/helm@" + helmVersion
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// run runs a command in the test's directory and returns its stdout.
func run(t *testing.T, env []string, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, &cmdError{cmd: strings.Join(append([]string{name}, args...), " "), err: err, stderr: stderr.String()}
	}
	return out, nil
}

type cmdError struct {
	cmd, stderr string
	err         error
}

func (e *cmdError) Error() string { return e.cmd + ": " + e.err.Error() + "\n" + e.stderr }

// template renders the chart with helm template and decodes it strictly.
func template(t *testing.T, helm string, args ...string) []object {
	t.Helper()
	out, err := run(t, nil, helm, append([]string{"template", "emberbox", "chart/emberbox"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifest(out)
	if err != nil {
		t.Fatalf("helm template %s: %v", strings.Join(args, " "), err)
	}
	return objs
}

// TestHelm lints the chart, checks the committed manifests are what it
// renders now, and checks the renderings the committed files do not show.
func TestHelm(t *testing.T) {
	helm := findHelm(t)
	t.Logf("helm: %s", helm)

	t.Run("manifests are rendered", func(t *testing.T) {
		// render.sh lints first (--strict), with each set of values.
		dir := t.TempDir()
		if _, err := run(t, []string{"HELM=" + helm}, "./render.sh", dir); err != nil {
			t.Fatal(err)
		}
		fresh, _ := filepath.Glob(filepath.Join(dir, "*"))
		committed, _ := filepath.Glob("manifests/*")
		base := func(paths []string) []string {
			for i := range paths {
				paths[i] = filepath.Base(paths[i])
			}
			return paths
		}
		if f, c := base(fresh), base(committed); !slices.Equal(f, c) {
			t.Fatalf("render.sh writes %v, manifests/ holds %v; run deploy/kubernetes/render.sh", f, c)
		}
		for _, name := range fresh {
			want, err1 := os.ReadFile(filepath.Join(dir, name))
			got, err2 := os.ReadFile(filepath.Join("manifests", name))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("manifests/%s differs from what the chart renders; run deploy/kubernetes/render.sh", name)
			}
		}
	})

	t.Run("generated CA", func(t *testing.T) {
		// The chart's defaults: the CA is generated (helm template cannot
		// look up an existing one, so a fresh one each time).
		objs := template(t, helm)
		w := checkRelease(t, objs)
		s, ok := find[*corev1.Secret](objs, w.caSecret)
		if !ok {
			t.Fatalf("no Secret %q in the rendering", w.caSecret)
		}
		if s.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Error("the generated CA's Secret is not kept on uninstall")
		}
		if _, err := tls.X509KeyPair(s.Data["ca.crt"], s.Data["ca.key"]); err != nil {
			t.Fatalf("ca.crt and ca.key: %v", err)
		}
		b, _ := pem.Decode(s.Data["ca.crt"])
		if b == nil {
			t.Fatal("ca.crt is not PEM")
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Errorf("ca.crt is no CA: IsCA %v, key usage %v", cert.IsCA, cert.KeyUsage)
		}
		if _, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok {
			t.Errorf("CA key %T, want ECDSA as the nodes make", cert.PublicKey)
		}
		if left := time.Until(cert.NotAfter); left < 5*365*24*time.Hour {
			t.Errorf("the CA expires in %v", left)
		}
		if w.store.Name != "emberbox-postgres" || w.store.Key != "url" {
			t.Errorf("EMBERBOX_STORE from %+v, want the default existing Secret emberbox-postgres", w.store)
		}
	})

	t.Run("external URL", func(t *testing.T) {
		const url = "postgres://emberbox:secret@db.example.com:5432/emberbox?sslmode=verify-full"
		objs := template(t, helm, "--set", "postgres.external.url="+url)
		w := checkRelease(t, objs)
		s, ok := find[*corev1.Secret](objs, w.store.Name)
		if !ok || s.StringData[w.store.Key] != url {
			t.Errorf("EMBERBOX_STORE from %+v; that Secret (%v) has %q, want the URL", w.store, ok, s.StringData[w.store.Key])
		}
	})

	t.Run("no store", func(t *testing.T) {
		_, err := run(t, nil, helm, "template", "emberbox", "chart/emberbox", "--set", "postgres.existingSecret=")
		if err == nil || !strings.Contains(err.Error(), "postgres.existingSecret") {
			t.Errorf("a rendering without a store: %v, want it refused naming the values", err)
		}
	})

	t.Run("values are checked", func(t *testing.T) {
		// values.schema.json refuses a misspelt or mistyped value rather
		// than let it fall back to a default.
		for _, set := range []string{
			"postgres.existingsecret=mine", // a typo: the default Secret would be read
			"node.kvm=no",                  // a string, which templates take as true
			"service.type=Headless",
			"postgres.external.url=mysql://db/emberbox",
			"node.dataDir=var/lib/emberbox",
		} {
			_, err := run(t, nil, helm, "template", "emberbox", "chart/emberbox", "--set", set)
			if err == nil || !strings.Contains(err.Error(), "schema") {
				t.Errorf("--set %s: %v, want it refused by the values schema", set, err)
			}
		}
	})

	t.Run("without KVM and metrics", func(t *testing.T) {
		objs := template(t, helm, "--set", "node.kvm=false,metrics.enabled=false,node.timeout=30s,node.extraArgs={--log-level,debug}")
		ds, err := only[*appsv1.DaemonSet](objs)
		if err != nil {
			t.Fatal(err)
		}
		c := ds.Spec.Template.Spec.Containers[0]
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/dev/kvm" {
				t.Error("/dev/kvm mounted with node.kvm=false")
			}
		}
		args := strings.Join(c.Args, " ")
		if strings.Contains(args, "--metrics-listen") || containerPort(&c, intstr.FromString("metrics")) != 0 {
			t.Errorf("metrics served with metrics.enabled=false: %s", args)
		}
		if !strings.Contains(args, "--node-timeout 30s") || !strings.HasSuffix(args, "--log-level debug") {
			t.Errorf("args %q, want --node-timeout 30s and the extra args last", args)
		}
	})
}
