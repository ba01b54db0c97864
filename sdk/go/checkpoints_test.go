package emberbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
)

// TestCheckpoints takes, lists, reads, restores, branches from and
// deletes checkpoints against a fake of the contract, checking each call's
// method, path and body.
func TestCheckpoints(t *testing.T) {
	const ck = `{"id":"ckpt_0123456789abcdef0123","kind":"checkpoint","sandboxId":"sb_1","label":%s,
		"state":%q,"sizeBytes":4096,"createdAt":"2026-01-02T03:04:05Z","readyAt":null,"error":%s,
		"shape":{"vcpu":1,"memoryMiB":512,"diskMiB":2048}}`
	var keys []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method == http.MethodPost {
			if r.Header.Get("Content-Type") != "application/json" {
				answerError(w, 415, "unsupported_media_type", "")
				return
			}
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				answerError(w, 400, "invalid", "")
				return
			}
			keys = append(keys, r.Header.Get("Idempotency-Key"))
		}
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb_1/checkpoints":
			switch body["label"] {
			case "step-2":
				fmt.Fprintf(w, ck, `"step-2"`, "ready", "null")
			case nil:
				if _, sent := body["label"]; sent {
					answerError(w, 400, "invalid", "")
					return
				}
				fmt.Fprintf(w, ck, "null", "failed", `"disk full"`)
			default:
				answerError(w, 409, "quota_exceeded", "")
			}
		case "GET /v1/sandboxes/sb_1/checkpoints":
			fmt.Fprintf(w, `{"checkpoints":[`+ck+`,{"id":"ckpt_2","state":"ready","createdAt":"2026-01-02T03:05:00Z"}]}`,
				`"a"`, "ready", "null")
		case "GET /v1/sandboxes/sb_1/checkpoints/ckpt_2":
			fmt.Fprint(w, `{"id":"ckpt_2","sandboxId":"sb_1","state":"ready","sizeBytes":7,"createdAt":"2026-01-02T03:05:00Z","readyAt":"2026-01-02T03:05:01Z"}`)
		case "GET /v1/sandboxes/sb_1/checkpoints/ckpt_9":
			answerError(w, 404, "checkpoint_not_found", "")
		case "DELETE /v1/sandboxes/sb_1/checkpoints/ckpt_2":
			fmt.Fprint(w, `{"id":"ckpt_2","state":"deleted"}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_2:restore":
			if keep, ok := body["keep"].(bool); !ok || !keep {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprint(w, `{"id":"sb_1","state":"running","vcpu":1}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_3:restore":
			if keep, ok := body["keep"].(bool); !ok || keep {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprint(w, `{"id":"sb_1","state":"running","vcpu":1}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_2:branch":
			if body["count"] != 2.0 || body["name"] != "b" || fmt.Sprint(body["labels"]) != "map[k:v]" {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprint(w, `{"sandboxes":[{"id":"sb_2","state":"running"},{"id":"sb_3","state":"running"}]}`)
		case "POST /v1/sandboxes/sb_1/checkpoints/ckpt_3:branch":
			if body["count"] != 1.0 || len(body) != 1 {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprint(w, `{"sandboxes":[{"id":"sb_4","state":"running"}]}`)
		default:
			answerError(w, 404, "not_found", "")
		}
	}))
	ctx := context.Background()

	got, err := c.Checkpoint(ctx, "sb_1", "step-2")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "ckpt_0123456789abcdef0123" || got.Label == nil || *got.Label != "step-2" || got.State != "ready" ||
		got.SizeBytes != 4096 || got.CreatedAt.Minute() != 4 || got.ReadyAt != nil || got.Shape.MemoryMiB != 512 {
		t.Errorf("checkpoint %+v", got)
	}
	got, err = c.Checkpoint(ctx, "sb_1", "")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "checkpoint_failed" || got == nil || got.State != "failed" || got.Label != nil {
		t.Errorf("a failed capture: %+v, %v", got, err)
	}
	if _, err := c.Checkpoint(ctx, "sb_1", "big"); !errors.As(err, &ae) || ae.Code != "quota_exceeded" || ae.Status != 409 {
		t.Errorf("over quota: %v", err)
	}
	if len(keys) != 3 || keys[0] == "" || keys[0] == keys[1] {
		t.Errorf("idempotency keys %q: each call wants its own", keys)
	}

	list, err := c.Checkpoints(ctx, "sb_1")
	if err != nil || len(list) != 2 || *list[0].Label != "a" || list[1].ID != "ckpt_2" || list[1].Label != nil {
		t.Fatalf("Checkpoints: %v %+v", err, list)
	}
	one, err := c.GetCheckpoint(ctx, "sb_1", "ckpt_2")
	if err != nil || one.SizeBytes != 7 || one.ReadyAt == nil || one.ReadyAt.Second() != 1 {
		t.Errorf("GetCheckpoint: %+v %v", one, err)
	}
	if _, err := c.GetCheckpoint(ctx, "sb_1", "ckpt_9"); !IsNotFound(err) || !errors.As(err, &ae) || ae.Code != "checkpoint_not_found" {
		t.Errorf("a missing checkpoint: %v", err)
	}

	sb, err := c.RestoreCheckpoint(ctx, "sb_1", "ckpt_2", true)
	if err != nil || sb.ID != "sb_1" || sb.State != "running" {
		t.Errorf("RestoreCheckpoint keep: %+v %v", sb, err)
	}
	if _, err := c.RestoreCheckpoint(ctx, "sb_1", "ckpt_3", false); err != nil {
		t.Errorf("RestoreCheckpoint: %v", err)
	}

	branches, err := c.BranchCheckpoint(ctx, "sb_1", "ckpt_2", BranchOptions{Count: 2, Name: "b", Labels: map[string]string{"k": "v"}})
	if err != nil || len(branches) != 2 || branches[1].ID != "sb_3" {
		t.Errorf("BranchCheckpoint: %+v %v", branches, err)
	}
	if branches, err := c.BranchCheckpoint(ctx, "sb_1", "ckpt_3", BranchOptions{}); err != nil || len(branches) != 1 {
		t.Errorf("BranchCheckpoint with defaults: %+v %v", branches, err)
	}

	if err := c.DeleteCheckpoint(ctx, "sb_1", "ckpt_2"); err != nil {
		t.Errorf("DeleteCheckpoint: %v", err)
	}

	for name, err := range map[string]error{
		"Checkpoint":    func() error { _, err := c.Checkpoint(ctx, "", "x"); return err }(),
		"Checkpoints":   func() error { _, err := c.Checkpoints(ctx, ""); return err }(),
		"GetCheckpoint": func() error { _, err := c.GetCheckpoint(ctx, "sb_1", ""); return err }(),
		"Delete":        c.DeleteCheckpoint(ctx, "", "ckpt_2"),
		"Restore":       func() error { _, err := c.RestoreCheckpoint(ctx, "sb_1", "", false); return err }(),
		"Branch":        func() error { _, err := c.BranchCheckpoint(ctx, "", "ckpt_2", BranchOptions{}); return err }(),
	} {
		if err == nil || errors.As(err, &ae) {
			t.Errorf("%s without an id was sent: %v", name, err)
		}
	}
}

// TestCheckpointPathsAreEscaped: ids go into the path as one segment each.
func TestCheckpointPathsAreEscaped(t *testing.T) {
	if got := checkpointPath("sb 1", "a/b", ":restore"); got != "/v1/sandboxes/sb%201/checkpoints/a%2Fb:restore" {
		t.Errorf("checkpointPath: %s", got)
	}
	if got := checkpointPath("sb_1", "", ""); got != "/v1/sandboxes/sb_1/checkpoints" {
		t.Errorf("checkpointPath: %s", got)
	}
}

// TestCheckpointsUnavailableIsNotRetried: a server that keeps no
// checkpoints answers 503 checkpoints_unavailable, a deliberate refusal.
func TestCheckpointsUnavailableIsNotRetried(t *testing.T) {
	calls := 0
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		answerError(w, 503, "checkpoints_unavailable", "")
	}))
	_, err := c.Checkpoints(context.Background(), "sb_1")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "checkpoints_unavailable" || calls != 1 {
		t.Errorf("%d calls, %v", calls, err)
	}
}
