// Package drivertest is the conformance suite of sqldriver drivers: every
// driver runs it against a real database (river's riverdrivertest is the
// model). The inbox, the outbox and the migrations rely on exactly what it
// checks.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/sqldriver"
)

// Open returns a driver on a fresh database, and the schema ("" for none)
// in which the suite may create tables.
type Open[TTx any] func(t *testing.T) (driver sqldriver.Driver[TTx], schema string)

// Run runs every case, each on a fresh database from open.
func Run[TTx any](t *testing.T, open Open[TTx]) {
	cases := []struct {
		name string
		fn   func(t *testing.T, d sqldriver.Driver[TTx], schema string)
	}{
		{"ExecQueryAndRows", testExecQuery[TTx]},
		{"TransactionsCommitAndRollBack", testTransactions[TTx]},
		{"LockedExcludesAndRollsBack", testLocked[TTx]},
		{"TimeFragments", testTime[TTx]},
		{"InInt64s", testInInt64s[TTx]},
		{"RowIDDeletesALimitedSet", testRowID[TTx]},
		{"SkipLockedClaimsDisjointRows", testSkipLocked[TTx]},
		{"SchemaAndIndex", testSchemaAndIndex[TTx]},
		{"ErrorsKeepTheirCause", testErrors[TTx]},
		{"ListenerWakesOnTrigger", testListener[TTx]},
		{"BeginClaimInsertsOnce", testBeginClaim[TTx]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, schema := open(t)
			c.fn(t, d, schema)
		})
	}
}

func table(schema, name string) string {
	if schema == "" {
		return name
	}
	return schema + "." + name
}

func mustExec(t *testing.T, ex sqldriver.Executor, q string, args ...any) int64 {
	t.Helper()
	n, err := ex.Exec(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func count(t *testing.T, ex sqldriver.Executor, tbl string) int {
	t.Helper()
	var n int
	if err := ex.QueryRow(context.Background(), `SELECT count(*) FROM `+tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func create(t *testing.T, d sqldriver.Dialect, ex sqldriver.Executor, tbl string) {
	t.Helper()
	mustExec(t, ex, `CREATE TABLE `+tbl+` (id `+d.SerialKey()+`, name text NOT NULL, data `+d.BinaryType()+`, status `+d.KeyText()+` NOT NULL DEFAULT 'pending', at `+d.TimeType()+`)`)
}

func testExecQuery[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	ctx := context.Background()
	ex, tbl := d.Executor(), table(schema, "things")
	create(t, d.Dialect(), ex, tbl)
	for i := range 3 {
		if n := mustExec(t, ex, `INSERT INTO `+tbl+` (name, data) VALUES ($1, $2)`, fmt.Sprint("n", i), []byte{byte(i), 0, 0xff}); n != 1 {
			t.Fatalf("rows affected %d, want 1", n)
		}
	}
	if n := mustExec(t, ex, `UPDATE `+tbl+` SET status = 'done' WHERE name <> $1`, "n0"); n != 2 {
		t.Fatalf("rows affected %d, want 2", n)
	}
	var data []byte
	if err := ex.QueryRow(ctx, `SELECT data FROM `+tbl+` WHERE name = $1`, "n2").Scan(&data); err != nil || string(data) != "\x02\x00\xff" {
		t.Fatalf("bytes %q %v", data, err)
	}
	if err := ex.QueryRow(ctx, `SELECT data FROM `+tbl+` WHERE name = $1`, "absent").Scan(&data); err == nil {
		t.Fatal("a row was scanned from an empty result")
	}
	rows, err := ex.Query(ctx, `SELECT id, name FROM `+tbl+` WHERE status = $1 ORDER BY id`, "done")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var id int64
		var name string
		if err := rows.Scan(&id, &name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil || fmt.Sprint(names) != "[n1 n2]" {
		t.Fatalf("rows %v %v", names, err)
	}
}

func testTransactions[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	ctx := context.Background()
	tbl := table(schema, "things")
	create(t, d.Dialect(), d.Executor(), tbl)
	for _, commit := range []bool{false, true} {
		tx, err := d.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, d.UnwrapExecutor(tx), `INSERT INTO `+tbl+` (name) VALUES ($1)`, fmt.Sprint(commit))
		if got := count(t, d.UnwrapExecutor(tx), tbl); got != 1 {
			t.Fatalf("the transaction does not see its own row (%d)", got)
		}
		if commit {
			if err := d.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Rollback(ctx, tx); err != nil {
			t.Fatalf("rollback (after commit: %v): %v", commit, err)
		}
	}
	var name string
	if err := d.Executor().QueryRow(ctx, `SELECT name FROM `+tbl).Scan(&name); err != nil || name != "true" {
		t.Fatalf("after a rollback and a commit the table holds %q (%v), want only the committed row", name, err)
	}
}

// testLocked: Locked sections never overlap, across goroutines each with
// its own connection, and an error rolls the section back.
func testLocked[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	ctx := context.Background()
	tbl := table(schema, "things")
	create(t, d.Dialect(), d.Executor(), tbl)
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.Locked(ctx, func(ex sqldriver.Executor) error {
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer inside.Add(-1)
				_, err := ex.Exec(ctx, `INSERT INTO `+tbl+` (name) VALUES ($1)`, fmt.Sprint("locked-", i))
				time.Sleep(5 * time.Millisecond) // widen the window a second holder would share
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d Locked sections overlapped", overlaps.Load())
	}
	boom := errors.New("boom")
	err := d.Locked(ctx, func(ex sqldriver.Executor) error {
		if _, err := ex.Exec(ctx, `INSERT INTO `+tbl+` (name) VALUES ('rolled back')`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Locked returned %v, want fn's error", err)
	}
	if got := count(t, d.Executor(), tbl); got != 8 {
		t.Fatalf("%d rows, want the 8 committed sections only", got)
	}
}

// testTime: Now and NowPlusMillis are comparable points in time that scan
// into a time.Time close to the clock's.
func testTime[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	ctx := context.Background()
	dl, ex, tbl := d.Dialect(), d.Executor(), table(schema, "things")
	create(t, dl, ex, tbl)
	mustExec(t, ex, `INSERT INTO `+tbl+` (name, at) VALUES ('now', `+dl.Now()+`), ('later', `+dl.NowPlusMillis("$1")+`), ('earlier', `+dl.NowPlusMillis("-$1")+`)`, 60_000)
	rows, err := ex.Query(ctx, `SELECT name, at FROM `+tbl+` ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	var ats []time.Time
	for rows.Next() {
		var name string
		var at time.Time
		if err := rows.Scan(&name, sqldriver.Time(&at)); err != nil {
			t.Fatal(err)
		}
		got, ats = append(got, name), append(ats, at)
	}
	if fmt.Sprint(got) != "[earlier now later]" {
		t.Fatalf("order %v", got)
	}
	if skew := time.Since(ats[1]); skew < -5*time.Second || skew > 5*time.Second {
		t.Fatalf("Now scanned as %v, %v from the clock", ats[1], skew)
	}
	if gap := ats[2].Sub(ats[1]); gap < 59*time.Second || gap > 61*time.Second {
		t.Fatalf("NowPlusMillis(60000) is %v after Now", gap)
	}
	var null time.Time
	if err := ex.QueryRow(ctx, `SELECT at FROM `+tbl+` WHERE name = 'now' AND at IS NULL UNION ALL SELECT NULL`).Scan(sqldriver.Time(&null)); err != nil || !null.IsZero() {
		t.Fatalf("NULL scanned as %v (%v)", null, err)
	}
}

func testInInt64s[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	dl, ex, tbl := d.Dialect(), d.Executor(), table(schema, "things")
	create(t, dl, ex, tbl)
	for i := range 5 {
		mustExec(t, ex, `INSERT INTO `+tbl+` (name) VALUES ($1)`, fmt.Sprint(i))
	}
	cond, args := dl.InInt64s("id", 2, []int64{2, 4, 99})
	if n := mustExec(t, ex, `UPDATE `+tbl+` SET status = $1 WHERE `+cond, append([]any{"picked"}, args...)...); n != 2 {
		t.Fatalf("%s picked %d rows, want 2", cond, n)
	}
}

func testRowID[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	dl, ex, tbl := d.Dialect(), d.Executor(), table(schema, "things")
	create(t, dl, ex, tbl)
	for i := range 7 {
		mustExec(t, ex, `INSERT INTO `+tbl+` (name) VALUES ($1)`, fmt.Sprint(i))
	}
	del := `DELETE FROM ` + tbl + ` WHERE ` + dl.InSubquery(dl.RowID(), `SELECT `+dl.RowID()+` FROM `+tbl+` LIMIT $1`)
	if n := mustExec(t, ex, del, 3); n != 3 {
		t.Fatalf("deleted %d, want 3", n)
	}
	if got := count(t, ex, tbl); got != 4 {
		t.Fatalf("%d rows left, want 4", got)
	}
}

// testSkipLocked: two transactions claiming "the first n pending rows" at
// once get disjoint rows — by skipping each other's locks where the
// database locks rows, by waiting for the other's commit where it locks
// the whole database. Claimed in one UPDATE over a subquery (PostgreSQL,
// SQLite), and as a SELECT of the rows followed by an UPDATE of them in one
// transaction (every dialect; MySQL's only way: its UPDATE locks every row
// it reads, skipped or not).
func testSkipLocked[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	dl := d.Dialect()
	oneStatement := func(ctx context.Context, ex sqldriver.Executor, tbl, status string) (int64, error) {
		return ex.Exec(ctx, `UPDATE `+tbl+` SET status = $1 WHERE `+dl.InSubquery("id", `SELECT id FROM `+tbl+` WHERE status = 'pending' ORDER BY id LIMIT 4`+dl.SkipLocked()), status)
	}
	selectThenUpdate := func(ctx context.Context, ex sqldriver.Executor, tbl, status string) (int64, error) {
		rows, err := ex.Query(ctx, `SELECT id FROM `+tbl+` WHERE status = 'pending' ORDER BY id LIMIT 4`+dl.SkipLocked())
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return 0, err
		}
		cond, args := dl.InInt64s("id", 2, ids)
		return ex.Exec(ctx, `UPDATE `+tbl+` SET status = $1 WHERE `+cond, append([]any{status}, args...)...)
	}
	if dl != sqldriver.MySQL {
		t.Run("OneStatement", func(t *testing.T) { skipLocked(t, d, table(schema, "things"), oneStatement) })
	}
	t.Run("SelectThenUpdate", func(t *testing.T) { skipLocked(t, d, table(schema, "things2"), selectThenUpdate) })
}

func skipLocked[TTx any](t *testing.T, d sqldriver.Driver[TTx], tbl string, claim func(context.Context, sqldriver.Executor, string, string) (int64, error)) {
	ctx := context.Background()
	dl := d.Dialect()
	create(t, dl, d.Executor(), tbl)
	// Enough rows that an UPDATE of four ids reads those four by the key
	// (MariaDB reads a 10-row table whole, locking every row).
	for i := range 200 {
		mustExec(t, d.Executor(), `INSERT INTO `+tbl+` (name) VALUES ($1)`, fmt.Sprint(i))
	}
	first, err := d.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Rollback(ctx, first)
	if n, err := claim(ctx, d.UnwrapExecutor(first), tbl, "first"); err != nil || n != 4 {
		t.Fatalf("first claim took %d rows (%v)", n, err)
	}
	second := make(chan int64, 1)
	go func() {
		n, err := func() (int64, error) {
			tx, err := d.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer d.Rollback(ctx, tx)
			n, err := claim(ctx, d.UnwrapExecutor(tx), tbl, "second")
			if err != nil {
				return n, err
			}
			return n, d.Commit(ctx, tx)
		}()
		if err != nil {
			t.Error(err)
		}
		second <- n
	}()
	if dl.SkipLocked() != "" {
		// Row locks: the second claim does not wait for the first.
		if n := <-second; n != 4 {
			t.Fatalf("second claim took %d rows while the first held 4, want 4 others", n)
		}
		if err := d.Commit(ctx, first); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := d.Commit(ctx, first); err != nil {
			t.Fatal(err)
		}
		if n := <-second; n != 4 {
			t.Fatalf("second claim took %d rows after the first committed 4, want 4 others", n)
		}
	}
	var firsts, seconds int
	if err := d.Executor().QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+tbl+` WHERE status = 'first'),
		(SELECT count(*) FROM `+tbl+` WHERE status = 'second')`).Scan(&firsts, &seconds); err != nil || firsts != 4 || seconds != 4 {
		t.Fatalf("first %d, second %d (%v); want 4 and 4", firsts, seconds, err)
	}
}

func testSchemaAndIndex[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	dl, ex := d.Dialect(), d.Executor()
	if schema != "" {
		if ddl := dl.CreateSchema(schema + "_extra"); ddl != "" {
			mustExec(t, ex, ddl)
			mustExec(t, ex, ddl) // idempotent
			drop := `DROP SCHEMA ` + schema + `_extra CASCADE`
			if dl == sqldriver.MySQL { // a schema is a database: no CASCADE
				drop = `DROP SCHEMA ` + schema + `_extra`
			}
			t.Cleanup(func() { d.Executor().Exec(context.Background(), drop) })
			create(t, dl, ex, table(schema+"_extra", "things"))
		}
	}
	create(t, dl, ex, table(schema, "things"))
	idx := dl.CreateIndex(schema, "things_status", "things", "(status) WHERE status = 'pending'")
	mustExec(t, ex, idx)
	mustExec(t, ex, idx) // idempotent
	if q := sqldriver.QualifyIn(dl, schema, "things"); count(t, ex, q) != 0 {
		t.Fatalf("%s is not the table", q)
	}
}

func testErrors[TTx any](t *testing.T, d sqldriver.Driver[TTx], _ string) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Executor().Exec(ctx, `SELECT 1`); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled statement: %v, want context.Canceled in the chain", err)
	}
	if _, err := d.Executor().Exec(context.Background(), `SELECT * FROM no_such_table`); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("a missing table: %v", err)
	}
}

func testListener[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	l, ok := any(d).(sqldriver.Listener)
	trigger := d.Dialect().NotifyTrigger(schema, "things", "drivertest")
	if !ok || trigger == "" {
		t.Skipf("%T does not listen (readers poll)", d)
	}
	defer l.Close()
	ctx := context.Background()
	create(t, d.Dialect(), d.Executor(), table(schema, "things"))
	mustExec(t, d.Executor(), trigger)
	if err := l.Listen(ctx, "drivertest"); err != nil {
		t.Fatal(err)
	}
	if l.Wait(ctx, "drivertest", 50*time.Millisecond) {
		t.Fatal("woke without a notification")
	}
	// Subscribed: a row committed before the next Wait still wakes it.
	mustExec(t, d.Executor(), `INSERT INTO `+table(schema, "things")+` (name) VALUES ('wake')`)
	if !l.Wait(ctx, "drivertest", 10*time.Second) {
		t.Fatal("the insert's notification did not wake the listener")
	}
}

// testBeginClaim: a ClaimBeginner's transaction holds its inserted row, a
// second claim of the row is ErrRowExists (also one that waited for the
// first to commit) and leaves the pool working, a rolled-back claim leaves
// nothing, and values arrive verbatim whatever they contain.
func testBeginClaim[TTx any](t *testing.T, d sqldriver.Driver[TTx], schema string) {
	cb, ok := d.(sqldriver.ClaimBeginner[TTx])
	if !ok {
		t.Skipf("%T does not implement sqldriver.ClaimBeginner (a capability, not a missing service)", d)
	}
	ctx := context.Background()
	tbl := table(schema, "claims")
	mustExec(t, d.Executor(), `CREATE TABLE `+tbl+` (name text PRIMARY KEY, note text NOT NULL)`)
	insert := `INSERT INTO ` + tbl + ` (name, note) VALUES ($1, $2)`
	hostile := "it's $1 \\ \"q\" $$ -- ;\n\u00fcn\u00ef"
	tx, err := cb.BeginClaim(ctx, insert, hostile, "$2")
	if err != nil {
		t.Fatal(err)
	}
	if got := count(t, d.UnwrapExecutor(tx), tbl); got != 1 {
		t.Fatalf("the claiming transaction sees %d rows, want its own", got)
	}
	if err := d.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	_ = d.Rollback(ctx, tx)
	var name, note string
	if err := d.Executor().QueryRow(ctx, `SELECT name, note FROM `+tbl).Scan(&name, &note); err != nil || name != hostile || note != "$2" {
		t.Fatalf("stored %q, %q (%v), want %q, %q", name, note, err, hostile, "$2")
	}
	for range 3 { // each duplicate gives its connection back in a usable state
		if _, err := cb.BeginClaim(ctx, insert, hostile, "again"); !errors.Is(err, sqldriver.ErrRowExists) {
			t.Fatalf("a second claim: %v, want ErrRowExists", err)
		}
	}
	// A NUL byte is refused by name, before anything is sent (in a simple
	// query it would end the statement's text early).
	if _, err := cb.BeginClaim(ctx, insert, "nul\x00byte", ""); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Fatalf("a value with a NUL byte: %v, want an error naming the NUL byte", err)
	}
	tx, err = cb.BeginClaim(ctx, insert, "rolled back", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, d.Executor(), tbl); got != 1 {
		t.Fatalf("after a rolled-back claim the table has %d rows, want 1", got)
	}
	// A claim that meets another transaction's uncommitted claim waits for
	// it: ErrRowExists once that commits.
	first, err := cb.BeginClaim(ctx, insert, "contended", "first")
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		tx, err := cb.BeginClaim(ctx, insert, "contended", "second")
		if err == nil {
			_ = d.Rollback(ctx, tx)
		}
		second <- err
	}()
	if err := d.Commit(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := <-second; !errors.Is(err, sqldriver.ErrRowExists) {
		t.Fatalf("the contending claim: %v, want ErrRowExists", err)
	}
	if got := count(t, d.Executor(), tbl); got != 2 {
		t.Fatalf("the table has %d rows, want 2", got)
	}
}
