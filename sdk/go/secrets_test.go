package emberbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// secretJSON is a secret as the server answers it; never with its value.
const secretJSON = `{"name":"OPENAI_API_KEY","env":"OPENAI_API_KEY","placeholder":"emberbox-secret-3f9a",
	"hosts":%s,"header":null,"format":null,"rules":%s,%s"enforced":true,
	"createdAt":"2026-01-02T03:04:05.000Z","updatedAt":"2026-01-02T03:04:06.000Z"}`

// secretFake answers the egress secrets contract for TestEgressSecrets,
// comparing each call's body with the one the client should send.
func secretFake(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPut && r.Header.Get("Content-Type") != "application/json" {
			answerError(w, 415, "unsupported_media_type", "")
			return
		}
		call := r.Method + " " + r.URL.EscapedPath() + " " + string(b)
		switch call {
		case `PUT /v1/egress-secrets/OPENAI_API_KEY {"value":"sk-1","hosts":["api.openai.com"],"rules":[{"methods":["POST"],"paths":["/v1/*"]}],"only":{"labels":[{"team":"ml"}]},"env":"OPENAI"}`:
			fmt.Fprintf(w, secretJSON, `["api.openai.com"]`, `[{"methods":["POST"],"paths":["/v1/*"]}]`, `"only":{"labels":[{"team":"ml"}]},`)
		case `PUT /v1/egress-secrets/GH {"value":"ghp","hosts":["api.github.com"],"header":"Authorization","format":"token {value}"}`:
			answerError(w, 409, "too_many_secrets", "")
		case `PUT /v1/egress-secrets/OPENAI_API_KEY/sandboxes {}`,
			`PUT /v1/egress-secrets/OPENAI_API_KEY/sandboxes {"sandboxes":["sb_1"]}`:
			fmt.Fprintf(w, secretJSON, `["api.openai.com"]`, `[]`, "")
		case `PUT /v1/egress-secrets/OPENAI_API_KEY/rules {"rules":[{"paths":["/v1/chat/*"]}]}`:
			fmt.Fprintf(w, secretJSON, `["api.openai.com"]`, `[{"paths":["/v1/chat/*"]}]`, "")
		case `PUT /v1/egress-secrets/OPENAI_API_KEY/rules {"hosts":["*.openai.com"]}`:
			answerError(w, 400, "not_narrower", "")
		case `DELETE /v1/egress-secrets/OPENAI_API_KEY `:
			fmt.Fprint(w, `{"name":"OPENAI_API_KEY","deleted":true,"enforced":true}`)
		case `DELETE /v1/egress-secrets/NONE `:
			answerError(w, 404, "secret_not_found", "")
		default:
			t.Errorf("unexpected %s", call)
			answerError(w, 404, "not_found", "")
		}
	})
}

// TestEgressSecrets sets, scopes, narrows and deletes secrets against a
// fake of the contract, checking each call's method, path and body.
func TestEgressSecrets(t *testing.T) {
	c := newTestClient(t, secretFake(t))
	ctx := context.Background()
	var ae *APIError

	sc, err := c.SetEgressSecret(ctx, "OPENAI_API_KEY", EgressSecretSpec{Value: "sk-1", Hosts: []string{"api.openai.com"},
		Rules: []EgressRule{{Methods: []string{"POST"}, Paths: []string{"/v1/*"}}},
		Only:  &EgressScope{Labels: []map[string]string{{"team": "ml"}}}, Env: "OPENAI"})
	if err != nil || sc.Placeholder != "emberbox-secret-3f9a" || sc.Header != nil || !sc.Enforced || sc.Only == nil ||
		sc.Only.Labels[0]["team"] != "ml" || sc.Rules[0].Paths[0] != "/v1/*" || sc.UpdatedAt.Second() != 6 {
		t.Fatalf("SetEgressSecret: %+v %v", sc, err)
	}
	_, err = c.SetEgressSecret(ctx, "GH", EgressSecretSpec{Value: "ghp", Hosts: []string{"api.github.com"},
		Header: "Authorization", Format: "token {value}"})
	if !errors.As(err, &ae) || ae.Code != "too_many_secrets" || ae.Status != 409 || strings.Contains(err.Error(), "ghp") {
		t.Errorf("a refused set: %v", err)
	}

	if sc, err := c.ScopeEgressSecret(ctx, "OPENAI_API_KEY", EgressScope{}); err != nil || sc.Only != nil || len(sc.Rules) != 0 {
		t.Errorf("ScopeEgressSecret to every sandbox: %+v %v", sc, err)
	}
	if _, err := c.ScopeEgressSecret(ctx, "OPENAI_API_KEY", EgressScope{Sandboxes: []string{"sb_1"}}); err != nil {
		t.Errorf("ScopeEgressSecret to a sandbox: %v", err)
	}

	sc, err = c.NarrowEgressSecret(ctx, "OPENAI_API_KEY", nil, []EgressRule{{Paths: []string{"/v1/chat/*"}}})
	if err != nil || len(sc.Rules) != 1 || sc.Rules[0].Methods != nil {
		t.Errorf("NarrowEgressSecret: %+v %v", sc, err)
	}
	if _, err := c.NarrowEgressSecret(ctx, "OPENAI_API_KEY", []string{"*.openai.com"}, nil); !errors.As(err, &ae) || ae.Code != "not_narrower" {
		t.Errorf("a wider narrowing: %v", err)
	}

	if err := c.DeleteEgressSecret(ctx, "OPENAI_API_KEY"); err != nil {
		t.Errorf("DeleteEgressSecret: %v", err)
	}
	if err := c.DeleteEgressSecret(ctx, "NONE"); !IsNotFound(err) {
		t.Errorf("deleting a missing secret: %v", err)
	}
}

// TestListEgressSecrets reads pages by name with limit and after.
func TestListEgressSecrets(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/egress-secrets" {
			answerError(w, 404, "not_found", "")
			return
		}
		switch r.URL.RawQuery {
		case "limit=1":
			fmt.Fprintf(w, `{"secrets":[`+secretJSON+`],"next":"OPENAI_API_KEY"}`, `["api.openai.com"]`, `[]`, "")
		case "after=OPENAI_API_KEY&limit=1":
			fmt.Fprint(w, `{"secrets":[],"next":null}`)
		default:
			answerError(w, 400, "invalid", "")
		}
	}))
	ctx := context.Background()
	page, err := c.ListEgressSecrets(ctx, 1, "")
	if err != nil || len(page.Secrets) != 1 || page.Secrets[0].Name != "OPENAI_API_KEY" || page.Next != "OPENAI_API_KEY" {
		t.Fatalf("first page: %+v %v", page, err)
	}
	page, err = c.ListEgressSecrets(ctx, 1, page.Next)
	if err != nil || len(page.Secrets) != 0 || page.Next != "" {
		t.Errorf("last page: %+v %v", page, err)
	}
	if b, _ := json.Marshal(page.Secrets); string(b) != "[]" {
		t.Errorf("an empty page is %s", b)
	}
}

// TestEgressSecretsRefuseBeforeSending: no name, no value, or nothing to
// narrow is refused before a call is made.
func TestEgressSecretsRefuseBeforeSending(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s %s was sent", r.Method, r.URL.Path)
	}))
	ctx := context.Background()
	var ae *APIError
	for name, err := range map[string]error{
		"Set":      func() error { _, err := c.SetEgressSecret(ctx, "", EgressSecretSpec{Value: "v"}); return err }(),
		"SetEmpty": func() error { _, err := c.SetEgressSecret(ctx, "N", EgressSecretSpec{}); return err }(),
		"Scope":    func() error { _, err := c.ScopeEgressSecret(ctx, "", EgressScope{}); return err }(),
		"Narrow":   func() error { _, err := c.NarrowEgressSecret(ctx, "N", nil, nil); return err }(),
		"Delete":   c.DeleteEgressSecret(ctx, ""),
	} {
		if err == nil || errors.As(err, &ae) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
