package httpidem

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
)

// DefaultPrincipal is the default Config.Principal: a hash of the
// Authorization header; without one, a hash of the request's cookies (all of
// its Cookie fields); without either, "" (no principal: the request is
// neither stored nor replayed). Credentials are never stored, only their
// hashes. A service that authenticates callers by another header (an API
// key in X-Api-Key) names it with HeaderPrincipal.
//
// A refreshed bearer token or a changed cookie is a new principal: a retry
// sent with it is executed as a new request. Where credentials rotate
// between retries, name the stable identity instead: HeaderPrincipal of a
// user id set by an auth proxy, or CookiePrincipal of the session cookie
// alone (tracking cookies that change on every request are then ignored).
func DefaultPrincipal(r *http.Request) string {
	if a := r.Header.Get("Authorization"); a != "" {
		return digest("auth:", a)
	}
	if c := r.Header.Values("Cookie"); len(c) > 0 {
		return digest("cookies:", strings.Join(c, "; "))
	}
	return ""
}

// HeaderPrincipal names the caller by one request header (for example
// X-User-Id set by an authenticating proxy in front of the service, or the
// API key header the service itself checks); "" (no principal) when the
// header is absent.
func HeaderPrincipal(name string) func(*http.Request) string {
	name = textproto.CanonicalMIMEHeaderKey(name)
	return func(r *http.Request) string {
		v := r.Header.Get(name)
		if v == "" {
			return ""
		}
		return digest("header:", v)
	}
}

// CookiePrincipal names the caller by one cookie (the session cookie); ""
// (no principal) when the request has none.
func CookiePrincipal(name string) func(*http.Request) string {
	return func(r *http.Request) string {
		c, err := r.Cookie(name)
		if err != nil || c.Value == "" {
			return ""
		}
		return digest("cookie:", c.Value)
	}
}

// NoPrincipal puts every caller in one scope: for services where the key
// alone identifies the intent (machine-to-machine, one client). Whoever
// sends a key is replayed its stored response, and one who sends it with
// another request learns that it exists (422): choose it only where every
// caller may see every other's responses.
func NoPrincipal(*http.Request) string { return "anyone" }

// ParsePrincipal reads a principal choice, as idem serve --principal takes
// it: "default" (DefaultPrincipal), "header:NAME", "cookie:NAME" or "none".
func ParsePrincipal(spec string) (func(*http.Request) string, error) {
	kind, name, hasName := strings.Cut(spec, ":")
	switch {
	case spec == "default":
		return DefaultPrincipal, nil
	case spec == "none":
		return NoPrincipal, nil
	case hasName && kind == "header" && validToken(name):
		return HeaderPrincipal(name), nil
	case hasName && kind == "cookie" && validToken(name):
		return CookiePrincipal(name), nil
	}
	return nil, fmt.Errorf("principal %q: want default, header:NAME, cookie:NAME or none", spec)
}

// validToken reports whether s is a non-empty RFC 9110 token (a header or
// cookie name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
