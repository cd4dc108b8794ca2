package sqldriver_test

import (
	"strings"
	"testing"

	"github.com/idemgo/idem/sqldriver"
)

// TestCheckMySQLServer: MySQL 8.0 and MariaDB 10.6 on (the first with SKIP
// LOCKED) pass; an older server, or an answer that is no version, is
// refused, naming the server.
func TestCheckMySQLServer(t *testing.T) {
	for v, want := range map[string]bool{
		"8.0.36": true, "8.4.3-commercial": true, "9.1.0": true, "5.7.44-log": false,
		"10.11.19-MariaDB-0+deb12u1": true, "10.6.20-MariaDB": true, "10.5.27-MariaDB": false, "11.4.4-MariaDB": true, "nonsense": false,
	} {
		err := sqldriver.CheckMySQLServer(v)
		if (err == nil) != want || (err != nil && !strings.Contains(err.Error(), v)) {
			t.Errorf("CheckMySQLServer(%q) = %v, want passing %v", v, err, want)
		}
	}
}
