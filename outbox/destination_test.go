package outbox_test

import (
	"net/url"
	"testing"

	"github.com/idemgo/idem/outbox"
)

func TestRedactDestination(t *testing.T) {
	for dest, want := range map[string]string{
		"amqp://relay:s3cret@rabbit:5672/v?exchange=e&routing_key=r": "amqp://relay:xxxxx@rabbit:5672/v?exchange=e&routing_key=r",
		"amqps://relay:p%40ss@rabbit/?routing_key=r":                 "amqps://relay:xxxxx@rabbit/?routing_key=r",
		"nats://tok3n@nats:4222/orders":                              "nats://tok3n@nats:4222/orders", // a user only: no password to hide
		"https://billing.example/invoices?x=1":                       "https://billing.example/invoices?x=1",
		"as2://SUPPLIER":                                             "as2://SUPPLIER",
		"not a url: %zz":                                             "not a url: %zz",
	} {
		if got := outbox.RedactDestination(dest); got != want {
			t.Errorf("RedactDestination(%q) = %q, want %q", dest, got, want)
		}
	}
}

// FuzzRedactDestination: whatever the destination, a password in it is
// what the redacted form hides, and nothing else changes meaning.
func FuzzRedactDestination(f *testing.F) {
	f.Add("amqp://u:secret@h/?routing_key=r")
	f.Add("nats://h/s")
	f.Add("amqp://u:@h/")
	f.Fuzz(func(t *testing.T, dest string) {
		got := outbox.RedactDestination(dest)
		u, err := url.Parse(dest)
		if err != nil || u.User == nil {
			if got != dest {
				t.Fatalf("RedactDestination(%q) = %q, want it unchanged", dest, got)
			}
			return
		}
		if _, has := u.User.Password(); !has {
			if got != dest {
				t.Fatalf("RedactDestination(%q) = %q, want it unchanged (no password)", dest, got)
			}
			return
		}
		r, err := url.Parse(got)
		if err != nil {
			t.Fatalf("RedactDestination(%q) = %q, which does not parse: %v", dest, got, err)
		}
		if p, _ := r.User.Password(); p != "xxxxx" || r.User.Username() != u.User.Username() || r.Host != u.Host || r.Path != u.Path {
			t.Fatalf("RedactDestination(%q) = %q: want the same URL with the password xxxxx", dest, got)
		}
	})
}

func TestRedactHeader(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"Authorization", "Bearer sk_live_123", "Bearer xxxxx"},
		{"authorization", "Basic dXNlcjpwYXNz", "Basic xxxxx"},
		{"Proxy-Authorization", "token", "xxxxx"},
		{"x-api-key", "k3y", "xxxxx"},
		{"Cookie", "session=abc; theme=dark", "xxxxx"},
		{"Content-Type", "application/json", "application/json"},
		{"Idempotency-Key", `"ORD-1"`, `"ORD-1"`},
	} {
		if got := outbox.RedactHeader(c.name, c.value); got != c.want {
			t.Errorf("RedactHeader(%q, %q) = %q, want %q", c.name, c.value, got, c.want)
		}
	}
}
