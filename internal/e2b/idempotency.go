package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"regexp"
	"time"
)

// E2B's SDKs send an Idempotency-Key with a create when the caller gives
// one. A create is then made once: the key is reserved in the server's
// idempotency store under the caller's key (prefixed, so it never meets a
// Runtime API request's key), the sandbox is linked to it as it is
// recorded (so even a crash between the two leaves the retry its
// sandbox), and a retry is answered with that sandbox as it now is. Only
// the sandbox's id is stored: its tokens are derived again.

// idemPrefix keeps E2B's keys apart from the Runtime API's.
const idemPrefix = "e2b:"

var e2bKeyRE = regexp.MustCompile(`^[a-z0-9-]{1,120}$`)

// idemAnswer is what is stored for a create.
type idemAnswer struct {
	SandboxID string `json:"sandboxID"`
}

// createOnce runs create at most once per Idempotency-Key; create returns
// the new sandbox's id or an error already in E2B's shape.
func (h *Handler) createOnce(w http.ResponseWriter, r *http.Request, owner string, body []byte,
	create func(key string) (string, error)) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || h.cfg.Idempotency == nil {
		id, err := create("")
		h.answerCreate(w, r, owner, id, err)
		return
	}
	if !e2bKeyRE.MatchString(key) {
		writeError(w, newError(http.StatusBadRequest, "Idempotency-Key must be 1 to 120 characters of a-z, 0-9 and -"))
		return
	}
	key = idemPrefix + key
	sum := sha256.Sum256(body)
	fp := "e2b-create:" + hex.EncodeToString(sum[:])
	ctx := r.Context()
	deadline := time.Now().Add(h.cfg.CreateWait)
	for {
		rec, reserved, err := h.cfg.Idempotency.Reserve(ctx, owner, key, fp)
		if err != nil {
			writeError(w, err)
			return
		}
		if reserved {
			id, err := create(key)
			// Recorded even if the client has gone: its retry gets the sandbox.
			bg := context.WithoutCancel(ctx)
			if err != nil {
				if rerr := h.cfg.Idempotency.Release(bg, owner, key); rerr != nil {
					h.log.Error("releasing an E2B idempotency key", "err", rerr)
				}
				writeError(w, err)
				return
			}
			b, _ := json.Marshal(idemAnswer{SandboxID: id})
			if cerr := h.cfg.Idempotency.Complete(bg, owner, key, http.StatusCreated, "application/json", b); cerr != nil {
				h.log.Error("storing an E2B create's answer", "err", cerr)
			}
			h.answerCreate(w, r, owner, id, nil)
			return
		}
		if rec.Fingerprint != fp {
			writeError(w, newError(http.StatusUnprocessableEntity, "this Idempotency-Key was used with a different request"))
			return
		}
		if rec.Status != 0 {
			id := rec.SandboxID
			var a idemAnswer
			if id == "" && json.Unmarshal(rec.Body, &a) == nil {
				id = a.SandboxID
			}
			if id == "" {
				writeError(w, newError(http.StatusConflict, "the request with this Idempotency-Key ran but its answer is lost; use a new key"))
				return
			}
			h.answerCreate(w, r, owner, id, nil)
			return
		}
		if time.Now().After(deadline) {
			writeError(w, newError(http.StatusConflict, "a create with this Idempotency-Key is still running; retry later with the same key"))
			return
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// answerCreate waits for the sandbox to run and answers it (201).
func (h *Handler) answerCreate(w http.ResponseWriter, r *http.Request, owner, id string, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	sb, err := h.waitRunning(r.Context(), owner, id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(r.Context(), sb))
}
