package main

import (
	"strings"
	"testing"
)

// TestSecretCACommands: listing the egress CAs and rotating them, against
// a fake of the contract.
func TestSecretCACommands(t *testing.T) {
	older := `{"id":"aaaaaaaaaaaaaaaaaaaaaaaa","certificate":"x","notAfter":"2036-01-02T03:04:05.000Z","addedAt":"2026-01-02T03:04:05.000Z",` +
		`"retireAt":"2026-01-03T03:04:05.000Z","newest":false,"guests":{"trusting":3,"notKnown":1}}`
	newer := `{"id":"bbbbbbbbbbbbbbbbbbbbbbbb","certificate":"y","notAfter":"2036-01-02T03:04:05.000Z","addedAt":"2026-01-02T03:04:06.000Z",` +
		`"retireAt":null,"newest":true,"guests":{"trusting":3,"notKnown":1}}`
	api := newFakeAPI(t, map[string]string{
		"GET /v1/egress-ca":         `{"cas":[` + older + `,` + newer + `]}`,
		"POST /v1/egress-ca:rotate": `{"new":` + newer + `,"previous":[` + older + `]}`,
	})
	out, _, err := api.run("", "secret", "ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "true", "GUESTS TRUSTING"} {
		if !strings.Contains(out, want) {
			t.Errorf("secret ca's output lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := api.run("", "secret", "ca", "rotate", "--keep", "2h"); err != nil {
		t.Fatal(err)
	}
	if got, want := api.last(), `POST /v1/egress-ca:rotate {"keepPreviousSeconds":7200}`; got != want {
		t.Errorf("rotate sent %s, want %s", got, want)
	}
	if _, _, err := api.run("", "secret", "ca", "rotate", "--keep", "0s"); err != nil || !strings.Contains(api.last(), `{"keepPreviousSeconds":0}`) {
		t.Errorf("rotate --keep 0s: %v, sent %s", err, api.last())
	}
}
