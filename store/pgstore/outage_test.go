package pgstore_test

import (
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	conn, p := testenv.PostgresProxy(t)
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: conn})
	storetest.Outage(t, s, p.Cut, p.Restore)
}

func TestLeaseRunsOutInAnOutage(t *testing.T) {
	conn, p := testenv.PostgresProxy(t)
	schema := testenv.RandomName("idemtest_")
	s := testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn})
	storetest.LeaseRunsOutInAnOutage(t, s, testenv.OpenPostgres(t, schema, pgstore.Config{}), p.Cut, p.Restore)
}

func TestSettleAcrossABlip(t *testing.T) {
	conn, p := testenv.PostgresProxy(t)
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: conn})
	storetest.SettleAcrossABlip(t, s, p.Cut, p.Restore)
}
