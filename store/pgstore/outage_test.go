package pgstore_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	testenv.ProbePostgres(t)
	u, err := url.Parse(testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, u.Host)
	u.Host = p.Addr()
	schema := testenv.RandomName("idemtest_")
	s, err := pgstore.Open(context.Background(), pgstore.Config{ConnString: u.String(), Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		s.Close()
	}()
	storetest.Outage(t, s, p.Cut, p.Restore)
}
