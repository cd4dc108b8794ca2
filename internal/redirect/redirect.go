// Package redirect sets how idem's HTTP clients treat redirects: the
// addresses a sender posts to are agreed (a partner's AS2 URL, an outbox
// row's destination), and a 3xx from one must not carry the message, its
// receipt or the host's credentials anywhere else.
package redirect

import (
	"errors"
	"net/http"
)

// Never returns a copy of c (nil: a new client) that follows no redirect:
// the 3xx is the answer.
func Never(c *http.Client) *http.Client {
	cp := clone(c)
	cp.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return cp
}

// SameHost returns a copy of c (nil: a new client) that follows a
// redirect only to the first request's scheme, host and port — at most
// ten — and answers any other 3xx as it is.
func SameHost(c *http.Client) *http.Client {
	cp := clone(c)
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		if req.URL.Scheme != via[0].URL.Scheme || req.URL.Host != via[0].URL.Host {
			return http.ErrUseLastResponse
		}
		return nil
	}
	return cp
}

func clone(c *http.Client) *http.Client {
	if c == nil {
		return &http.Client{}
	}
	cp := *c
	return &cp
}
