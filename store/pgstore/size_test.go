package pgstore_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

// TestRecordBytes reports what one completed record costs in PostgreSQL: the
// row (pg_column_size) plus its primary-key index entry (8-byte header and
// the key, 8-aligned).
func TestRecordBytes(t *testing.T) {
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	storetest.RecordBytes(t, s, "PostgreSQL row + index entry", func(key string) (n int64, err error) {
		err = s.Pool().QueryRow(context.Background(),
			`SELECT pg_column_size(r.*) + 8 + ((pg_column_size(r.k) + 7) / 8) * 8 FROM `+s.Table()+` r WHERE k = $1`, s.KeyArg(key)).Scan(&n)
		return n, err
	})
}

// TestMemoryPerRecord reports the table's growth (heap, TOAST and indexes,
// after VACUUM) per completed record (storetest.MemoryPerRecord;
// -recordbytes.n sets how many).
func TestMemoryPerRecord(t *testing.T) {
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	storetest.MemoryPerRecord(t, s, "PostgreSQL pg_total_relation_size", func() (n int64, err error) {
		ctx := context.Background()
		if _, err := s.Pool().Exec(ctx, `VACUUM `+s.Table()); err != nil {
			return 0, err
		}
		err = s.Pool().QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, s.Table()).Scan(&n)
		return n, err
	})
}
