package api

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestStreamOverRealConnection checks that lines are flushed through every
// wrapper of the ResponseWriter as they happen, and that the headers go out
// while the command is still silent.
func TestStreamOverRealConnection(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	gate := make(chan struct{})
	e.m.execEvents = nil
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	// The command is silent until gate closes, then prints and exits.
	e.m.execHook = func(onEvent func(guest.Event) error) error {
		<-gate
		if err := onEvent(guest.Event{Type: "start", ProcessID: "p1"}); err != nil {
			return err
		}
		return onEvent(guest.Event{Type: "exit", Exit: &guest.ExecResult{ExitCode: intPtr(0), State: "exited"}})
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes/sbx_r:exec", strings.NewReader(`{"command":"x","stream":true}`))
	req.Header.Set("Authorization", "Bearer secret-a")
	req.Header.Set("Idempotency-Key", "stream-1")
	start := time.Now()
	resp, err := srv.Client().Do(req) // returns once the headers arrive
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("headers took %v", waited)
	}
	if resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
	}
	close(gate)
	sc := bufio.NewScanner(resp.Body)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if len(got) != 2 || !strings.Contains(got[0], `"start"`) || !strings.Contains(got[1], `"exit"`) {
		t.Errorf("lines %q", got)
	}
}
