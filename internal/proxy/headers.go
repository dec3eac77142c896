package proxy

import (
	"net/http"
	"slices"
	"strings"
)

// hopHeader reports whether k (canonical) is a connection-level header a
// proxy must not forward (RFC 9110 §7.6.1), or one the proxy sets itself.
func hopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
		return true
	}
	return false
}

// copyHeaders copies src into dst except hop-by-hop headers, headers named
// in src's Connection header, and skip (canonical names).
func copyHeaders(dst, src http.Header, skip ...string) {
	conn := src["Connection"]
	n := 0
	for _, vs := range src {
		n += len(vs)
	}
	all := make([]string, 0, n) // one allocation for every copied value
	for k, vs := range src {
		if hopHeader(k) || slices.Contains(skip, k) || namedIn(conn, k) {
			continue
		}
		i := len(all)
		all = append(all, vs...)
		dst[k] = all[i:len(all):len(all)] // capped: an append to one copies
	}
}

// namedIn reports whether the Connection header values conn name k.
func namedIn(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), k) {
				return true
			}
		}
	}
	return false
}

// copyRequestHeaders forwards the client's end-to-end headers (tracing, ...)
// to a backend. Accept-Encoding is dropped because the proxy parses the
// prefill's answer and relays the decode's unencoded.
func copyRequestHeaders(dst, src http.Header) {
	copyHeaders(dst, src, "Accept-Encoding", "X-Request-Id")
}

// setBackendHeaders forwards the client's headers to a backend and sets
// Authorization to the backend key. The client's Authorization header holds
// the proxy's own key when it has one; it reaches the engines only when
// neither key is configured (the proxy is then transparent and the engines
// check whatever key the client sent).
func (p *Proxy) setBackendHeaders(dst, client http.Header) {
	copyRequestHeaders(dst, client)
	setAuth(dst, p.cfg.BackendAPIKey)
}

// setAuth sets "Authorization: Bearer key" on a backend call; an empty key
// leaves h alone.
func setAuth(h http.Header, key string) {
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

// copyResponseHeaders relays a backend's end-to-end headers to the client.
func copyResponseHeaders(dst, src http.Header) {
	copyHeaders(dst, src, "X-Request-Id", HeaderPD)
}

// setLegHeaders sets the headers of a prefill or decode leg.
func (p *Proxy) setLegHeaders(dst, client http.Header, id string) {
	p.setBackendHeaders(dst, client)
	dst.Set("Content-Type", "application/json")
	dst.Set("X-Request-Id", id)
}
