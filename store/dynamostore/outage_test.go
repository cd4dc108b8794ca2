package dynamostore_test

import (
	"net/url"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/storetest"
)

// proxied returns the location of a fresh table reached through a proxy in
// front of the tests' DynamoDB, the same table reached directly, and the
// proxy.
func proxied(t *testing.T) (through, direct string, p *testenv.Proxy) {
	endpoint := testenv.DynamoDB(t)
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p = testenv.StartProxy(t, u.Host)
	table := testenv.RandomName("idem_outage_")
	return table + " http://" + p.Addr(), table + " " + endpoint, p
}

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	through, _, p := proxied(t)
	storetest.Outage(t, openAt(t, through), p.Cut, p.Restore)
}

func TestLeaseRunsOutInAnOutage(t *testing.T) {
	through, direct, p := proxied(t)
	storetest.LeaseRunsOutInAnOutage(t, openAt(t, through), openAt(t, direct), p.Cut, p.Restore)
}

func TestSettleAcrossABlip(t *testing.T) {
	through, _, p := proxied(t)
	storetest.SettleAcrossABlip(t, openAt(t, through), p.Cut, p.Restore)
}
