package redact

import (
	"net/url"
	"strings"
	"testing"
)

func TestNoPasswordShown(t *testing.T) {
	for _, raw := range []string{"mysql://app:hunter2@db/x", "postgres://u:hunter2@h:5432/db?sslmode=disable", "mysql://app:hunter2@db:bad port/x", "sqlite:idem.db"} {
		if got := URL(raw); strings.Contains(got, "hunter2") {
			t.Errorf("URL(%q) = %q", raw, got)
		}
		if _, err := url.Parse(raw); err != nil && strings.Contains(ParseError(err).Error(), "hunter2") {
			t.Errorf("ParseError of %q: %v", raw, ParseError(err))
		}
	}
	if got := URL("sqlite:idem.db"); got != "sqlite:idem.db" {
		t.Errorf("a URL without a password changed: %q", got)
	}
}
