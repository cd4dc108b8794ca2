// Package redact keeps passwords of URLs out of messages and logs.
package redact

import (
	"errors"
	"net/url"
	"strings"
)

// URL is raw with the password of its user replaced by xxxxx; a URL that
// does not parse is named only by its scheme.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		scheme, _, _ := strings.Cut(raw, ":")
		if strings.ContainsAny(scheme, "/@") {
			scheme = "?"
		}
		return scheme + ":(a URL that does not parse)"
	}
	return u.Redacted()
}

// ParseError is a url.Parse error without the URL it quotes (which holds
// the password).
func ParseError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
