package e2b

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/egress"
)

// policy maps allow_internet_access and network to an egress policy; nil
// leaves the operator's default.
func (n *newSandbox) policy() (*egress.Policy, error) {
	nc := n.Network
	if nc != nil {
		switch {
		case isSet(nc.EgressProxy):
			return nil, newError(http.StatusBadRequest, "network.egressProxy is not supported by Emberbox")
		case isSet(nc.Rules):
			return nil, newError(http.StatusBadRequest, "network.rules are not supported by Emberbox")
		case nc.MaskRequestHost != nil:
			return nil, newError(http.StatusBadRequest, "network.maskRequestHost is not supported by Emberbox")
		}
	}
	if n.AllowInternetAccess == nil && (nc == nil || len(nc.AllowOut)+len(nc.DenyOut) == 0) {
		return nil, nil
	}
	var allow, deny []string
	if nc != nil {
		allow, deny = nc.AllowOut, nc.DenyOut
	}
	return e2bPolicy(n.AllowInternetAccess, allow, deny)
}

// e2bPolicy translates E2B's egress rules. E2B allows everything by
// default, denies CIDRs in denyOut, and lets allowOut win over denyOut; the
// usual "only these" is denyOut 0.0.0.0/0 plus allowOut. Emberbox's policy
// is the internet switch, allow rules and deny rules (deny wins), so a
// deny of everything (0.0.0.0/0, ::/0) turns the internet off and leaves
// allowOut as the only way out; other denied CIDRs stay denied even where
// an allowed entry falls inside them (docs/e2b.md).
func e2bPolicy(allowInternet *bool, allowOut, denyOut []string) (*egress.Policy, error) {
	p := &egress.Policy{Internet: allowInternet == nil || *allowInternet, Allow: allowOut}
	for _, d := range denyOut {
		switch {
		case d == "0.0.0.0/0" || d == "::/0":
			p.Internet = false
		case net.ParseIP(d) == nil && !isCIDR(d):
			return nil, newError(http.StatusBadRequest, fmt.Sprintf("network.denyOut: %q is not an IP address or CIDR block (E2B denies addresses only)", d))
		default:
			p.Deny = append(p.Deny, d)
		}
	}
	if len(p.Allow)+len(p.Deny) > egress.MaxRules {
		return nil, newError(http.StatusBadRequest, fmt.Sprintf("network may have at most %d rules", egress.MaxRules))
	}
	if _, err := egress.Compile(*p); err != nil {
		return nil, newError(http.StatusBadRequest, "network: "+err.Error())
	}
	return p, nil
}

func isCIDR(s string) bool {
	_, _, err := net.ParseCIDR(s)
	return err == nil
}

// networkUpdate is E2B's SandboxNetworkUpdateConfig: the new rules, whole
// (an omitted field is cleared).
type networkUpdate struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	DNSServers          []string        `json:"dnsServers"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	Rules               json.RawMessage `json:"rules"`
}

// putNetwork replaces a running sandbox's egress rules; connections the
// new rules refuse are cut.
func (h *Handler) putNetwork(w http.ResponseWriter, r *http.Request, owner string) {
	var b networkUpdate
	if err := decode(r, &b); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case isSet(b.EgressProxy):
		writeError(w, newError(http.StatusBadRequest, "egressProxy is not supported by Emberbox"))
		return
	case isSet(b.Rules):
		writeError(w, newError(http.StatusBadRequest, "rules are not supported by Emberbox"))
		return
	case len(b.DNSServers) > 0:
		writeError(w, newError(http.StatusBadRequest, "dnsServers is not supported: Emberbox's guests resolve names through the host, which applies the rules to names"))
		return
	}
	nm := h.cfg.Network
	if nm == nil {
		nm, _ = h.cfg.Manager.(api.NetworkManager)
	}
	if nm == nil {
		writeError(w, newError(http.StatusServiceUnavailable, "this server does not enforce egress policies"))
		return
	}
	p, err := e2bPolicy(b.AllowInternetAccess, b.AllowOut, b.DenyOut)
	if err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if _, _, err := h.lookup(r.Context(), owner, id); err != nil {
		writeError(w, err)
		return
	}
	if _, err := nm.SetNetwork(r.Context(), owner, id, *p); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
