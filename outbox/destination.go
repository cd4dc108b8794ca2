package outbox

import "net/url"

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
