package pgstore_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

// layouts opens a store on a table of each layout: the packed one this
// release creates, and the text one of earlier releases' tables.
var layouts = []struct {
	name string
	open func(t *testing.T) *pgstore.Store
}{
	{"packed", func(t *testing.T) *pgstore.Store {
		return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	}},
	{"text", func(t *testing.T) *pgstore.Store { return openText(t, pgstore.Config{}) }},
}

// TestRecordBytes reports what one completed record costs in PostgreSQL: the
// row (pg_column_size) plus its primary-key index entry (8-byte header and
// the key, 8-aligned), in a table of each layout.
func TestRecordBytes(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := l.open(t)
			storetest.RecordBytes(t, s, "PostgreSQL row + index entry, "+l.name+" layout", func(key string) (n int64, err error) {
				err = s.Pool().QueryRow(context.Background(),
					`SELECT pg_column_size(r.*) + 8 + ((pg_column_size(r.k) + 7) / 8) * 8 FROM `+s.Table()+` r WHERE k = $1`, s.KeyArg(key)).Scan(&n)
				return n, err
			})
		})
	}
}

// TestMemoryPerRecord reports the table's growth (heap, TOAST and indexes,
// after VACUUM) per completed record (storetest.MemoryPerRecord;
// -recordbytes.n sets how many), in a table of each layout.
func TestMemoryPerRecord(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			s := l.open(t)
			storetest.MemoryPerRecord(t, s, "PostgreSQL pg_total_relation_size, "+l.name+" layout", func() (n int64, err error) {
				ctx := context.Background()
				if _, err := s.Pool().Exec(ctx, `VACUUM `+s.Table()); err != nil {
					return 0, err
				}
				err = s.Pool().QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, s.Table()).Scan(&n)
				return n, err
			})
		})
	}
}
