package sqldriver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/sqldriver"
)

// TestTimeSaysHowToOpenMySQL: a point in time that comes as text (MySQL
// opened without parseTime) is refused with what to set; the kinds the
// drivers give are read.
func TestTimeSaysHowToOpenMySQL(t *testing.T) {
	var got time.Time
	if err := sqldriver.Time(&got).Scan([]byte("2026-12-07 14:00:00.000000")); err == nil || !strings.Contains(err.Error(), "parseTime=true") {
		t.Fatalf("a datetime as text: %v; want an error naming parseTime", err)
	}
	at := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	for _, src := range []any{at, at.UnixMilli(), float64(at.UnixMilli())} {
		if err := sqldriver.Time(&got).Scan(src); err != nil || !got.Equal(at) {
			t.Fatalf("%T: %v, %v", src, got, err)
		}
	}
}
