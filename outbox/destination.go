package outbox

import (
	"net/textproto"
	"net/url"
	"strings"
)

// RedactDestination returns dest as it may be shown — in a listing, on the
// console, in a log line: a password in its URL (amqp://USER:PASS@…)
// replaced by "xxxxx". Any other destination is returned unchanged. A
// sender's credentials belong to the sender (amqpsender.New,
// natssender.New, idem relay's flags), not to every row; this is for rows
// that carry them anyway.
func RedactDestination(dest string) string {
	u, err := url.Parse(dest)
	if err != nil || u.User == nil {
		return dest
	}
	if _, has := u.User.Password(); !has {
		return dest
	}
	return u.Redacted()
}

// credentialHeaders are the headers whose values are secrets (the names in
// canonical form).
var credentialHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true,
	"X-Api-Key": true, "Api-Key": true, "X-Auth-Token": true,
}

// RedactHeader returns a message header's value as it may be shown: the
// value of a credentials header (Authorization, Proxy-Authorization,
// Cookie, X-Api-Key, Api-Key, X-Auth-Token) replaced by "xxxxx" — after its
// scheme for Authorization ("Bearer xxxxx") — any other value unchanged.
func RedactHeader(name, value string) string {
	name = textproto.CanonicalMIMEHeaderKey(name)
	if !credentialHeaders[name] {
		return value
	}
	if scheme, _, ok := strings.Cut(value, " "); ok && strings.HasSuffix(name, "Authorization") {
		return scheme + " xxxxx"
	}
	return "xxxxx"
}
