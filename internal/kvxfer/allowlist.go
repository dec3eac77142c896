package kvxfer

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPeers is the allowlist used when --kv-peers is not given: this
// machine only.
const DefaultPeers = "loopback"

// PeerPolicy is an address allowlist for the side channel: which producers
// a decode may dial and which consumers a producer accepts. Without a
// cluster secret it is the only thing that keeps a client-written
// kv_transfer_params from making a decode dial an arbitrary address; with
// one, an explicit --kv-peers narrows what signed params may name.
//
// Entries, comma-separated:
//   - a CIDR prefix (10.0.0.0/8) or an IP (10.1.2.3): matches IP literals
//     in it, any port;
//   - host:port (prefill-0.prefill:5600, 10.1.2.3:5600): that host name or
//     IP on that port exactly;
//   - "loopback": 127.0.0.0/8, ::1 and the name localhost;
//   - "any": everything (only for networks where every host is trusted).
//
// Host names are matched as written and never resolved: resolving a name a
// client chose would itself be a network operation it could trigger. A
// producer checks a consumer's source IP against the IP entries.
type PeerPolicy struct {
	spec     string
	any      bool
	prefixes []netip.Prefix
	hostPort map[string]bool // "host:port", host lower-cased
	names    map[string]bool // host names allowed on any port
}

// ParsePeers parses a --kv-peers value; empty means DefaultPeers.
func ParsePeers(spec string) (*PeerPolicy, error) {
	if strings.TrimSpace(spec) == "" {
		spec = DefaultPeers
	}
	p := &PeerPolicy{spec: spec, hostPort: map[string]bool{}, names: map[string]bool{}}
	for e := range strings.SplitSeq(spec, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case e == "any":
			p.any = true
		case e == "loopback":
			p.prefixes = append(p.prefixes, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"))
			p.names["localhost"] = true
		case strings.Contains(e, "/"):
			pf, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("--kv-peers entry %q is not a CIDR prefix: %w", e, err)
			}
			p.prefixes = append(p.prefixes, pf.Masked())
		default:
			if ip, err := netip.ParseAddr(e); err == nil {
				p.prefixes = append(p.prefixes, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			h, port, err := net.SplitHostPort(e)
			if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 || h == "" {
				return nil, fmt.Errorf("--kv-peers entry %q is not a CIDR prefix, an IP, host:port, loopback or any", e)
			}
			p.hostPort[strings.ToLower(h)+":"+port] = true
		}
	}
	return p, nil
}

// String returns the policy as given.
func (p *PeerPolicy) String() string { return p.spec }

// AllowsDial reports whether a decode may dial host:port.
func (p *PeerPolicy) AllowsDial(host string, port int) bool {
	if p.any {
		return true
	}
	h := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if p.hostPort[h+":"+strconv.Itoa(port)] || p.names[h] {
		return true
	}
	if ip, err := netip.ParseAddr(h); err == nil && ip.Zone() == "" {
		return p.allowsIP(ip)
	}
	return false
}

// AllowsConn reports whether a producer accepts a connection from addr.
func (p *PeerPolicy) AllowsConn(addr net.Addr) bool {
	if p.any {
		return true
	}
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().WithZone("")
	if p.hostPort[ap.String()] {
		return true
	}
	return p.allowsIP(ip)
}

func (p *PeerPolicy) allowsIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, pf := range p.prefixes {
		if pf.Contains(ip) {
			return true
		}
	}
	return false
}
