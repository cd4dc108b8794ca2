package mysqlstore_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/mysqlstore"
)

// BenchmarkBare is what the store's lifecycles are measured against: a loop
// of a claim (INSERT … ON DUPLICATE KEY UPDATE) and a settle (an UPDATE on
// the fence), one round trip and one commit each, on a pool of the same
// size at the same concurrency, into the store's own table — the least a
// lifecycle can cost without sharing commits.
func BenchmarkBare(b *testing.B) {
	s := open(b, testenv.MySQLDatabase(b, ""), mysqlstore.Config{})
	db := s.DB()
	for _, par := range []int{1, 16} {
		b.Run("Lifecycle"+map[int]string{1: "", 16: "32"}[par], func(b *testing.B) { bareLifecycles(b, db, par) })
	}
}

func bareLifecycles(b *testing.B, db *sql.DB, parallelism int) {
	var seq atomic.Uint64
	prefix := testenv.RandomName("bare-")
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := []byte(prefix + strconv.FormatUint(seq.Add(1), 10))
			if _, err := db.ExecContext(ctx, `INSERT INTO idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
				VALUES (?, 1, 1796606160088000, 'fp', 1, NULL, 1796606220088, 1796609760088, 1796606160088, 1)
				ON DUPLICATE KEY UPDATE outcome = 3`, key); err != nil {
				b.Fatal(err)
			}
			res, err := db.ExecContext(ctx, `UPDATE idem_records SET state = 2, result = ?, lease_until = 0, expires_at = 1796609760088
				WHERE k = ? AND fence = 1796606160088000 AND state = 1`, []byte(`{"ok":true}`), key)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				b.Fatalf("settled %d rows", n)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
}
