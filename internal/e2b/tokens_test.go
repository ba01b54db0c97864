package e2b

import (
	"bytes"
	"testing"
)

// FuzzTokenOpen: no string but a token this server made opens, and a made
// token opens only for its own purpose and sandbox and is current only
// under its own generation.
func FuzzTokenOpen(f *testing.F) {
	tk, err := NewTokens(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		f.Fatal(err)
	}
	made := tk.Make(purposeEnvd, "sbx_1", "key_a", "gen-1")
	f.Add(made, "sbx_1")
	f.Add("e2b1.a2V5X2E.AAAA", "sbx_1")
	f.Add("e2b2.a2V5X2E.AAAAAAAAAAAAAAAAAAAAAA.AAAA", "sbx_1")
	f.Add(made+"x", "sbx_1")
	f.Fuzz(func(t *testing.T, tok, sandboxID string) {
		got, ok := tk.Open(purposeEnvd, sandboxID, tok)
		if tok != made || sandboxID != "sbx_1" {
			if ok {
				t.Fatalf("Open(%q, %q) opened a token this server did not make for it", tok, sandboxID)
			}
			return
		}
		if !ok || got.owner != "key_a" || !tk.Current(got, []string{"gen-0", "gen-1"}) || tk.Current(got, []string{"gen-2"}) || tk.Current(got, nil) {
			t.Fatalf("the made token: %+v %v", got, ok)
		}
		if _, ok := tk.Open(purposeTraffic, sandboxID, tok); ok {
			t.Fatal("an envd token opened as a traffic token")
		}
	})
}
