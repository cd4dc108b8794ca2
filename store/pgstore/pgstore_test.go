package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

var pgURL = testenv.URL("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")

func probe(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err == nil {
		err = conn.Ping(ctx)
		conn.Close(ctx)
	}
	testenv.Need(t, "PostgreSQL", pgURL, err)
}

func randomSchema() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest_" + hex.EncodeToString(b[:])
}

// openAt opens the store in schema; the first test to open a schema drops it
// at cleanup.
func openAt(t testing.TB, schema string) idem.Store {
	t.Helper()
	probe(t)
	s, err := pgstore.Open(context.Background(), pgstore.Config{ConnString: pgURL, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !storetest.IsChild() {
			_, _ = s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}
		s.Close()
	})
	return s
}

func newStore(t testing.TB) idem.Store { return openAt(t, randomSchema()) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true}, newStore)
}

func TestConformancePgBouncerMode(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true}, func(t testing.TB) idem.Store {
		probe(t)
		schema := randomSchema()
		s, err := pgstore.Open(context.Background(), pgstore.Config{ConnString: pgURL, Schema: schema, PgBouncer: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			s.Close()
		})
		return s
	})
}

func TestExistingPool(t *testing.T) {
	probe(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := randomSchema()
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	s := pgstore.New(pool, schema, idem.Limits{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if _, err := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("Close closed a pool it does not own: %v", err)
	}
}

func TestMultiProcess(t *testing.T) {
	probe(t)
	storetest.MultiProcess(t, "TestMultiProcess", randomSchema(), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	probe(t)
	storetest.CrashTakeover(t, "TestCrashTakeover", randomSchema(), openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}
