package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// TestOrderingKeyCheckReadsClaimedRowsOnly: after each claim the relay
// asks whether another relay holds a row of the claimed rows' ordering
// keys. The question must be answered from the rows claimed (a few), not
// from every pending row of those keys — with a backlog of many rows per
// key, that read made a relay of ordered rows a third slower. The outbox
// is created as version 1 left it (the schema of idem 0.1.0) and upgraded
// by Migrate, with its rows in it.
func TestOrderingKeyCheckReadsClaimedRowsOnly(t *testing.T) {
	ctx := context.Background()
	args := []any{"relay-token"} // a claim token, then the 10 keys
	for i := range 10 {
		args = append(args, fmt.Sprintf("ACC-%d", i))
	}
	t.Run("PostgreSQL", func(t *testing.T) {
		pool, schema := pgPool(t)
		driver := pgxv5.New(pool)
		ob := upgradedWithBacklog(t, driver, schema)
		if _, err := pool.Exec(ctx, `ANALYZE `+schema+`.idem_outbox`); err != nil {
			t.Fatal(err)
		}
		plan := explain(t, func() ([]string, error) {
			rows, err := pool.Query(ctx, `EXPLAIN `+outbox.ConflictsQuery(ob.Store, 10), args...)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		})
		if !strings.Contains(plan, "idem_outbox_claimed") {
			t.Errorf("the ordering keys' check does not read the index of claimed rows:\n%s", plan)
		}
	})
	t.Run("MySQL", func(t *testing.T) {
		db := testenv.OpenMySQL(t, testenv.MySQLDatabase(t, ""))
		ob := upgradedWithBacklog(t, databasesql.New(db, sqldriver.MySQL), "")
		if _, err := db.ExecContext(ctx, `ANALYZE TABLE idem_outbox`); err != nil {
			t.Fatal(err)
		}
		q := outbox.ConflictsQuery(ob.Store, 10)
		for i := 11; i >= 1; i-- {
			q = strings.ReplaceAll(q, fmt.Sprintf("$%d", i), "?")
		}
		plan := explain(t, func() ([]string, error) {
			rows, err := db.QueryContext(ctx, `EXPLAIN `+q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			cols, _ := rows.Columns()
			var out []string
			for rows.Next() {
				vals := make([]sql.NullString, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					return nil, err
				}
				var line []string
				for i, v := range vals {
					line = append(line, cols[i]+"="+v.String)
				}
				out = append(out, strings.Join(line, " "))
			}
			return out, rows.Err()
		})
		if !strings.Contains(plan, "key=idem_outbox_claimed") {
			t.Errorf("the ordering keys' check does not read the index of claimed rows:\n%s", plan)
		}
	})
	t.Run("SQLite", func(t *testing.T) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		ob := upgradedWithBacklog(t, databasesql.New(db, sqldriver.SQLite), "")
		if _, err := db.ExecContext(ctx, `ANALYZE`); err != nil {
			t.Fatal(err)
		}
		q := outbox.ConflictsQuery(ob.Store, 10)
		plan := explain(t, func() ([]string, error) {
			rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var id, parent, notused int
				var detail string
				if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
					return nil, err
				}
				out = append(out, detail)
			}
			return out, rows.Err()
		})
		if !strings.Contains(plan, "idem_outbox_claimed") {
			t.Errorf("the ordering keys' check does not read the index of claimed rows:\n%s", plan)
		}
	})
}

func explain(t *testing.T, lines func() ([]string, error)) string {
	t.Helper()
	out, err := lines()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}

// upgradedWithBacklog creates the outbox at migration version 1, enqueues
// 2,000 rows on 10 ordering keys, migrates it to the latest version, and
// checks that every row is still there.
func upgradedWithBacklog[TTx any](t *testing.T, driver sqldriver.Driver[TTx], schema string) *outbox.Outbox[TTx] {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.New(driver, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	if _, err := sqlmigrate.Apply(ctx, driver, schema, "outbox", ob.Migrations()[:1]); err != nil {
		t.Fatal(err)
	}
	const rows = 2000
	for i := range rows {
		m := outbox.Message{Key: fmt.Sprintf("k-%04d", i), Destination: "test://sink", Payload: []byte("p"), OrderingKey: fmt.Sprintf("ACC-%d", i%10)}
		if err := ob.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := ob.List(ctx, "", 0, rows+1)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != rows {
		t.Fatalf("%d rows after the upgrade, want %d", len(list), rows)
	}
	return ob
}
