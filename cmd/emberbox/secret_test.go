package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// fakeSecret is a secret as the server answers it: never its value.
const fakeSecret = `{"name":"OPENAI_API_KEY","env":"OPENAI_API_KEY","placeholder":"emberbox-secret-3f9a",
	"hosts":["api.openai.com"],"header":null,"format":null,"rules":[{"methods":["GET","POST"],"paths":["/v1/*"]}],
	%s"enforced":true,"createdAt":"2026-01-02T03:04:05.000Z","updatedAt":"2026-01-02T03:04:06.000Z"}`

// TestSecretCommands runs the secret commands against a fake of the
// contract: set reads the value from stdin and sends it, and no output or
// error carries it.
func TestSecretCommands(t *testing.T) {
	const value = "sk-s3cr3t-value"
	api := newFakeAPI(t, map[string]string{
		"PUT /v1/egress-secrets/OPENAI_API_KEY":           fmt.Sprintf(fakeSecret, `"only":{"labels":[{"team":"ml"}],"sandboxes":["sb_1"]},`),
		"PUT /v1/egress-secrets/TOO_MANY":                 `409 {"error":{"code":"too_many_secrets","status":409,"message":"this key has 100 egress secrets"}}`,
		"GET /v1/egress-secrets":                          `{"secrets":[` + fmt.Sprintf(fakeSecret, "") + `],"next":null}`,
		"PUT /v1/egress-secrets/OPENAI_API_KEY/sandboxes": fmt.Sprintf(fakeSecret, ""),
		"PUT /v1/egress-secrets/OPENAI_API_KEY/rules":     fmt.Sprintf(fakeSecret, ""),
		"DELETE /v1/egress-secrets/OPENAI_API_KEY":        `{"name":"OPENAI_API_KEY","deleted":true,"enforced":true}`,
	})
	set := []string{"set", "OPENAI_API_KEY", "--host", "api.openai.com", "--rule", "GET,POST /v1/*",
		"--label", "team=ml", "--sandbox", "sb_1", "--env", "OPENAI_API_KEY"}

	out, errOut, err := api.run(value+"\n", "secret", set...)
	if err != nil {
		t.Fatal(err)
	}
	want := `PUT /v1/egress-secrets/OPENAI_API_KEY {"value":"` + value + `","hosts":["api.openai.com"],` +
		`"rules":[{"methods":["GET","POST"],"paths":["/v1/*"]}],"only":{"labels":[{"team":"ml"}],"sandboxes":["sb_1"]},"env":"OPENAI_API_KEY"}`
	if got := api.last(); got != want {
		t.Errorf("set sent\n%s\nwant\n%s", got, want)
	}
	for _, want := range []string{"OPENAI_API_KEY", "api.openai.com", "GET,POST /v1/*", "label team=ml or sandbox sb_1"} {
		if !strings.Contains(out, want) {
			t.Errorf("set's output lacks %q:\n%s", want, out)
		}
	}
	if out, _, err := api.run(value, "secret", append(set, "--json")...); err != nil || !strings.Contains(out, `"placeholder": "emberbox-secret-3f9a"`) ||
		!strings.Contains(api.last(), `"value":"`+value+`"`) {
		t.Errorf("set --json (no newline to trim): %v, sent %s\n%s", err, api.last(), out)
	}
	_, errOut2, err := api.run(value+"\r\n", "secret", "set", "TOO_MANY", "--host", "h.example.com")
	if err == nil || !strings.Contains(err.Error(), "too_many_secrets") || !strings.Contains(api.last(), `"value":"`+value+`"`) {
		t.Errorf("a refused set: %v, sent %s", err, api.last())
	}
	for _, s := range []string{out, errOut, errOut2, fmt.Sprint(err)} {
		if strings.Contains(s, "s3cr3t") {
			t.Errorf("the value was printed: %q", s)
		}
	}

	n := len(api.calls)
	for name, tc := range map[string]struct {
		stdin string
		args  []string
	}{
		"an empty value":      {"", []string{"OPENAI_API_KEY", "--host", "h"}},
		"a newline alone":     {"\n", []string{"OPENAI_API_KEY", "--host", "h"}},
		"no host":             {value, []string{"OPENAI_API_KEY"}},
		"a rule without path": {value, []string{"OPENAI_API_KEY", "--host", "h", "--rule", "GET"}},
		"a bad label":         {value, []string{"OPENAI_API_KEY", "--host", "h", "--label", "team"}},
		"format alone":        {value, []string{"OPENAI_API_KEY", "--host", "h", "--format", "token {value}"}},
		"a value argument":    {value, []string{"OPENAI_API_KEY", value, "--host", "h"}},
	} {
		if _, _, err := api.run(tc.stdin, "secret", append([]string{"set"}, tc.args...)...); err == nil {
			t.Errorf("set with %s was taken", name)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("set with %s told the value: %v", name, err)
		}
	}
	if len(api.calls) != n {
		t.Errorf("a refused set was sent: %q", api.calls[n:])
	}

	out, _, err = api.run("", "secret", "list")
	if err != nil || !strings.Contains(out, "every sandbox") || !strings.Contains(out, "RULES") || api.last() != "GET /v1/egress-secrets?limit=100" {
		t.Errorf("list: %v, sent %s\n%s", err, api.last(), out)
	}
	if _, _, err := api.run("", "secret", "scope", "OPENAI_API_KEY"); err != nil || api.last() != "PUT /v1/egress-secrets/OPENAI_API_KEY/sandboxes {}" {
		t.Errorf("scope to every sandbox: %v, sent %s", err, api.last())
	}
	if _, _, err := api.run("", "secret", "scope", "OPENAI_API_KEY", "--label", "team=ml,env=prod", "--label", "team=infra"); err != nil ||
		api.last() != `PUT /v1/egress-secrets/OPENAI_API_KEY/sandboxes {"labels":[{"env":"prod","team":"ml"},{"team":"infra"}]}` {
		t.Errorf("scope by labels: %v, sent %s", err, api.last())
	}
	if _, _, err := api.run("", "secret", "narrow", "OPENAI_API_KEY", "--rule", "POST /v1/chat/*"); err != nil ||
		api.last() != `PUT /v1/egress-secrets/OPENAI_API_KEY/rules {"rules":[{"methods":["POST"],"paths":["/v1/chat/*"]}]}` {
		t.Errorf("narrow: %v, sent %s", err, api.last())
	}
	if _, _, err := api.run("", "secret", "narrow", "OPENAI_API_KEY"); err == nil {
		t.Error("narrow with nothing to narrow was taken")
	}
	if out, _, err := api.run("", "secret", "rm", "OPENAI_API_KEY", "--json"); err != nil || !strings.Contains(out, `"deleted": true`) {
		t.Errorf("rm --json: %v\n%s", err, out)
	}
}

// TestParseRule: a --rule is methods, then paths.
func TestParseRule(t *testing.T) {
	for in, want := range map[string]emberbox.EgressRule{
		"GET,POST /v1/*":    {Methods: []string{"GET", "POST"}, Paths: []string{"/v1/*"}},
		"get /a /b/*":       {Methods: []string{"GET"}, Paths: []string{"/a", "/b/*"}},
		"/v1/models":        {Paths: []string{"/v1/models"}},
		"* /v1/*":           {Paths: []string{"/v1/*"}},
		"  DELETE   /x/y  ": {Methods: []string{"DELETE"}, Paths: []string{"/x/y"}},
	} {
		got, err := parseRule(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GET", "GET,,POST /a", "PUT,* /a", "GET v1/*", "GET /a b"} {
		if r, err := parseRule(in); err == nil {
			t.Errorf("parseRule(%q) took it: %+v", in, r)
		}
	}
}
