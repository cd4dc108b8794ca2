package mysqlstore

import "testing"

func TestSupportedServers(t *testing.T) {
	for v, want := range map[string]bool{
		"8.0.36": true, "8.4.3-commercial": true, "9.1.0": true, "5.7.44-log": false,
		"10.11.19-MariaDB-0+deb12u1": true, "10.6.20-MariaDB": true, "10.5.27-MariaDB": false, "11.4.4-MariaDB": true, "nonsense": false,
	} {
		if got := supported(v); got != want {
			t.Errorf("supported(%q) = %v, want %v", v, got, want)
		}
	}
}
