package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"
)

// TestSandboxCheckpointCommands runs checkpoint, checkpoints, rollback,
// branch and checkpoint-rm against an httptest server that speaks the
// checkpoints contract.
func TestSandboxCheckpointCommands(t *testing.T) {
	created := time.Now().UTC().Add(-2 * time.Hour).Format(time.RFC3339)
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error":{"code":"unauthorized","status":401,"message":"no"}}`)
			return
		}
		var body map[string]any
		if r.Method == http.MethodPost {
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				w.WriteHeader(400)
				fmt.Fprint(w, `{"error":{"code":"invalid","status":400,"message":"not JSON"}}`)
				return
			}
			b, _ := json.Marshal(body)
			bodies = append(bodies, r.URL.Path+" "+string(b))
		}
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb_1/checkpoints":
			fmt.Fprintf(w, `{"id":"ckpt_1","kind":"checkpoint","sandboxId":"sb_1","label":"step-2","state":"ready",
				"sizeBytes":1048576,"createdAt":%q}`, created)
		case "GET /v1/sandboxes/sb_1/checkpoints":
			fmt.Fprintf(w, `{"checkpoints":[
				{"id":"ckpt_1","sandboxId":"sb_1","label":"step-2","state":"ready","sizeBytes":3145728,"createdAt":%q},
				{"id":"ckpt_2","sandboxId":"sb_1","label":null,"state":"failed","error":"disk full","sizeBytes":0,"createdAt":%q}]}`,
				created, created)
		case "GET /v1/sandboxes/sb_9/checkpoints":
			fmt.Fprint(w, `{"checkpoints":[]}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_1:restore":
			fmt.Fprint(w, `{"id":"sb_1","state":"running"}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_1:branch":
			fmt.Fprint(w, `{"sandboxes":[{"id":"sb_2","state":"running"},{"id":"sb_3","state":"running"}]}`)
		case "DELETE /v1/sandboxes/sb_1/checkpoints/ckpt_1", "DELETE /v1/sandboxes/sb_1/checkpoints/ckpt_2":
			fmt.Fprintf(w, `{"id":%q,"state":"deleted"}`, path.Base(r.URL.Path))
		default:
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"code":"checkpoint_not_found","status":404,"message":"no such checkpoint"}}`)
		}
	}))
	defer srv.Close()
	run := func(args ...string) (string, error) {
		root := newRootCommand()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"sb", "--server", srv.URL, "--key", "k1"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	lastBody := func() string {
		if len(bodies) == 0 {
			return ""
		}
		return bodies[len(bodies)-1]
	}

	if out, err := run("checkpoint", "sb_1", "--label", "step-2"); err != nil || out != "ckpt_1\n" {
		t.Errorf("checkpoint: %v %q", err, out)
	}
	if got := lastBody(); got != `/v1/sandboxes/sb_1/checkpoints {"label":"step-2"}` {
		t.Errorf("checkpoint sent %s", got)
	}
	if _, err := run("checkpoint", "sb_1"); err != nil || lastBody() != `/v1/sandboxes/sb_1/checkpoints {}` {
		t.Errorf("checkpoint without a label: %v, sent %s", err, lastBody())
	}

	out, err := run("checkpoints", "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID", "LABEL", "SIZE", "CREATED", "ckpt_1", "step-2", "3.0 MiB", created, "2h", "failed: disk full"} {
		if !strings.Contains(out, want) {
			t.Errorf("checkpoints lacks %q:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, "ckpt_1"), strings.Index(out, "ckpt_2"); i < 0 || j < i {
		t.Errorf("checkpoints are not oldest first:\n%s", out)
	}
	if out, err := run("checkpoints", "sb_1", "-o", "json"); err != nil || !strings.Contains(out, `"id": "ckpt_1"`) || !strings.Contains(out, `"label": null`) {
		t.Errorf("checkpoints -o json: %v\n%s", err, out)
	}
	if out, err := run("checkpoints", "sb_9", "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("no checkpoints as JSON: %v %q", err, out)
	}
	if _, err := run("checkpoints", "sb_1", "-o", "yaml"); err == nil {
		t.Error("-o yaml was taken")
	}

	if out, err := run("rollback", "sb_1", "ckpt_1"); err != nil || out != "sb_1\trunning\n" {
		t.Errorf("rollback: %v %q", err, out)
	}
	if got := lastBody(); got != `/v1/sandboxes/sb_1/checkpoints/ckpt_1:restore {"keep":false}` {
		t.Errorf("rollback sent %s", got)
	}
	if _, err := run("restore", "sb_1", "ckpt_1", "--keep"); err != nil || lastBody() != `/v1/sandboxes/sb_1/checkpoints/ckpt_1:restore {"keep":true}` {
		t.Errorf("restore --keep: %v, sent %s", err, lastBody())
	}
	if _, err := run("rollback", "sb_1", "ckpt_x"); err == nil || !strings.Contains(err.Error(), "checkpoint_not_found") {
		t.Errorf("rollback to a missing checkpoint: %v", err)
	}

	if out, err := run("branch", "sb_1", "ckpt_1", "--count", "2", "--name", "b", "-l", "k=v"); err != nil || out != "sb_2\nsb_3\n" {
		t.Errorf("branch: %v %q", err, out)
	}
	if got := lastBody(); got != `/v1/sandboxes/sb_1/checkpoints/ckpt_1:branch {"count":2,"labels":{"k":"v"},"name":"b"}` {
		t.Errorf("branch sent %s", got)
	}
	if _, err := run("branch", "sb_1", "ckpt_1"); err != nil || lastBody() != `/v1/sandboxes/sb_1/checkpoints/ckpt_1:branch {"count":1}` {
		t.Errorf("branch with defaults: %v, sent %s", err, lastBody())
	}
	n := len(bodies)
	for _, args := range [][]string{{"--count", "0"}, {"--count", "11"}, {"-l", "novalue"}} {
		if _, err := run(append([]string{"branch", "sb_1", "ckpt_1"}, args...)...); err == nil {
			t.Errorf("branch %v was taken", args)
		}
	}
	if len(bodies) != n {
		t.Errorf("a refused branch was sent: %q", bodies[n:])
	}

	if out, err := run("checkpoint-rm", "sb_1", "ckpt_1", "ckpt_2"); err != nil || out != "ckpt_1\tdeleted\nckpt_2\tdeleted\n" {
		t.Errorf("checkpoint-rm: %v %q", err, out)
	}
	if _, err := run("checkpoint-delete", "sb_1", "ckpt_7"); err == nil || !strings.Contains(err.Error(), "checkpoint-rm ckpt_7") {
		t.Errorf("checkpoint-delete of a missing checkpoint: %v", err)
	}
	if _, err := run("checkpoint-rm", "sb_1"); err == nil {
		t.Error("checkpoint-rm without a checkpoint id was taken")
	}
}
