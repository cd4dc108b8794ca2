package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

// textTable creates in a new schema the records table as releases before
// the packed layout created it (keys and fingerprints as text), without
// idem_migrations, and returns a connection for the test's own statements.
func textTable(t *testing.T, schema string) *pgx.Conn {
	t.Helper()
	testenv.ProbePostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		conn.Close(ctx)
	})
	tbl := pgx.Identifier{schema, "idem_records"}.Sanitize()
	for _, q := range []string{
		`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + tbl + ` (k text PRIMARY KEY, state smallint NOT NULL, fence bigint NOT NULL,
			fp text NOT NULL DEFAULT '', attempts integer NOT NULL, result bytea, lease_until timestamptz NOT NULL,
			expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, outcome smallint NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS idem_records_expires_at ON ` + tbl + ` (expires_at)`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// openText opens a store on a records table of the text layout.
func openText(t *testing.T, cfg pgstore.Config) *pgstore.Store {
	schema := testenv.RandomName("idemtest_")
	textTable(t, schema)
	return testenv.OpenPostgres(t, schema, cfg)
}

// TestConformanceOnATextTable: a table created by a release before the
// packed layout keeps its layout, and the store passes the suite on it,
// coalesced and not.
func TestConformanceOnATextTable(t *testing.T) {
	caps := storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}
	t.Run("Coalesced", func(t *testing.T) {
		storetest.Run(t, caps, func(t testing.TB) idem.Store { return openText(t.(*testing.T), pgstore.Config{}) })
	})
	t.Run("Uncoalesced", func(t *testing.T) {
		storetest.Run(t, caps, func(t testing.TB) idem.Store { return openText(t.(*testing.T), pgstore.Config{NoCoalesce: true}) })
	})
}

// TestANewTableKeepsKeysAndFingerprintsPacked: the table Migrate creates
// keeps a compact key as its 16 bytes and idem.Fingerprint's digest as 17
// (keypack), and any other key, NUL bytes and invalid UTF-8 included, as
// it is — a key the text layout refused.
func TestANewTableKeepsKeysAndFingerprintsPacked(t *testing.T) {
	s := newStore(t).(*pgstore.Store)
	ctx := context.Background()
	compact := idem.CompactKey(idem.Key{Scope: "orders", ID: "4711"})
	fp := idem.Fingerprint([]byte("body"))
	storetest.KeysReadBack(t, s, fp, compact, "raw\x00\xff")
	var keyType, fpType string
	var keyBytes, fpBytes int
	if err := s.Pool().QueryRow(ctx, `SELECT pg_typeof(k)::text, pg_typeof(fp)::text, octet_length(k), octet_length(fp) FROM `+s.Table()+` WHERE k = $1`,
		s.KeyArg(compact)).Scan(&keyType, &fpType, &keyBytes, &fpBytes); err != nil {
		t.Fatal(err)
	}
	if keyType != "bytea" || fpType != "bytea" || keyBytes != 16 || fpBytes != 17 {
		t.Fatalf("the compact key's row: k %s of %d bytes, fp %s of %d bytes; want bytea of 16 and 17", keyType, keyBytes, fpType, fpBytes)
	}
	// A batch holding such keys is decided whole.
	reqs := []idem.AcquireRequest{{Key: "a\x00", Lease: time.Minute, Retention: time.Hour}, {Key: "b", Lease: time.Minute, Retention: time.Hour}}
	out, errs := pgstore.AcquireBatch(ctx, s, reqs)
	for i := range reqs {
		if errs[i] != nil || out[i].Outcome != idem.Acquired || out[i].Record.Key != reqs[i].Key {
			t.Fatalf("%q in a batch: %+v %v", reqs[i].Key, out[i], errs[i])
		}
	}
	if errs := pgstore.CompleteBatch(ctx, s, []string{"a\x00", "b"}, []uint64{out[0].Fence, out[1].Fence}, []byte("done")); errors.Join(errs...) != nil {
		t.Fatalf("settles: %v", errs)
	}
}

// TestPackRecordsConvertsATextTable: PackRecords packs a table of the text
// layout in place, as the store packs what it writes — every record read
// back as it was, a claim still settled by its owner's fence — and a store
// that still runs the text layout's statements fails closed on it, then
// reads the layout again.
func TestPackRecordsConvertsATextTable(t *testing.T) {
	schema := testenv.RandomName("idemtest_")
	textTable(t, schema)
	old := testenv.OpenPostgres(t, schema, pgstore.Config{})
	ctx := context.Background()
	if packed, err := old.PackedLayout(ctx); err != nil || packed {
		t.Fatalf("a table of the text layout read as packed: %v %v", packed, err)
	}
	// Keys of every packing (compact, canonical or not; 15 bytes; any
	// other) and fingerprints of both (a digest; anything else).
	rng := rand.New(rand.NewPCG(1, 2))
	const digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	keys := []string{idem.CompactKey(idem.Key{Scope: "s", ID: "1"}), "fifteen-bytes!!", "orders/4711", "ключ", "1~short"}
	for i := 0; i < 300; i++ {
		b := []byte("1~")
		for range 22 {
			b = append(b, digits[rng.IntN(len(digits))])
		}
		keys = append(keys, string(b), fmt.Sprintf("k-%d-%s", i, strings.Repeat("x", rng.IntN(20))))
	}
	fps := []string{idem.Fingerprint([]byte("body")), "", "custom", strings.ToUpper(idem.Fingerprint([]byte("body")))}
	want := map[string]idem.Record{}
	var claim idem.Acquisition
	for i, k := range keys {
		a, err := old.Acquire(ctx, idem.AcquireRequest{Key: k, Fingerprint: fps[i%len(fps)], Lease: time.Minute, Retention: time.Hour})
		if err != nil || a.Outcome != idem.Acquired {
			t.Fatalf("%q: %+v %v", k, a, err)
		}
		if i == 2 {
			claim = a // left in flight
		} else if err := old.Complete(ctx, k, a.Fence, []byte("done "+k), time.Hour); err != nil {
			t.Fatal(err)
		}
		if want[k], err = old.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}

	// Another process of this release, which read the layout before.
	stale := testenv.OpenPostgres(t, schema, pgstore.Config{})
	if converted, err := old.PackRecords(ctx); err != nil || !converted {
		t.Fatalf("PackRecords: %v %v", converted, err)
	}
	if converted, err := old.PackRecords(ctx); err != nil || converted {
		t.Fatalf("PackRecords again: %v %v, want nothing to do", converted, err)
	}
	s := testenv.OpenPostgres(t, schema, pgstore.Config{})
	if packed, err := s.PackedLayout(ctx); err != nil || !packed {
		t.Fatalf("the converted table: packed %v %v", packed, err)
	}
	for k, w := range want {
		got, err := s.Get(ctx, k)
		if err != nil || got.Key != w.Key || got.State != w.State || got.Fence != w.Fence || got.Fingerprint != w.Fingerprint ||
			got.Attempts != w.Attempts || string(got.Result) != string(w.Result) || !got.ExpiresAt.Equal(w.ExpiresAt) {
			t.Fatalf("%q after the conversion: %+v %v, want %+v", k, got, err, w)
		}
		var n int // packed in SQL as the store packs it in Go
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+s.Table()+` WHERE k = $1`, s.KeyArg(k)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%q: %d rows under the key as packed in Go (%v)", k, n, err)
		}
	}
	listed := 0
	for after := ""; ; {
		page, err := s.List(ctx, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		listed += len(page)
		after = page[len(page)-1].Key
	}
	if listed != len(want) {
		t.Fatalf("List walked %d records, want %d", listed, len(want))
	}
	if err := s.Complete(ctx, keys[2], claim.Fence, []byte("done"), time.Hour); err != nil {
		t.Fatalf("the claim taken before the conversion: %v", err)
	}
	a, err := s.Acquire(ctx, idem.AcquireRequest{Key: keys[0], Fingerprint: fps[0], Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != idem.Replayed {
		t.Fatalf("a duplicate after the conversion: %+v %v", a, err)
	}
	a, err = s.Acquire(ctx, idem.AcquireRequest{Key: keys[1], Fingerprint: "other", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != idem.Mismatch {
		t.Fatalf("another fingerprint after the conversion: %+v %v", a, err)
	}

	// A store still running the text layout's statements is refused, and
	// reads the layout again for its next call.
	if a, err := stale.Acquire(ctx, idem.AcquireRequest{Key: "new", Lease: time.Minute, Retention: time.Hour}); err == nil {
		t.Fatalf("a store running the text layout's statements on the packed table: %+v", a)
	}
	if a, err := stale.Acquire(ctx, idem.AcquireRequest{Key: "new", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != idem.Acquired {
		t.Fatalf("the next call of the store that ran the text layout's statements: %+v %v", a, err)
	}
	if rec, err := stale.Get(ctx, keys[0]); err != nil || rec.Key != keys[0] || rec.State != idem.StateCompleted {
		t.Fatalf("%q read by the store that ran the text layout's statements: %+v %v", keys[0], rec, err)
	}
}

// TestAGuardSettlesAcrossPackRecords: a Guard on a store that read the
// text layout holds a claim while another process packs the table; its
// settle, refused once for the stale layout, is retried (the refusal is
// ErrStoreUnavailable) and lands: the work ran once and its result is
// replayed, where giving up would leave the claim to a takeover that runs
// the work again.
func TestAGuardSettlesAcrossPackRecords(t *testing.T) {
	schema := testenv.RandomName("idemtest_")
	textTable(t, schema)
	owner := testenv.OpenPostgres(t, schema, pgstore.Config{})
	packer := testenv.OpenPostgres(t, schema, pgstore.Config{})
	g, err := idem.NewGuard(idem.Config{Store: owner, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := idem.Key{Scope: "pack", ID: "1"}
	runs := 0
	res, err := g.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) {
		runs++
		if _, err := packer.PackRecords(ctx); err != nil {
			return nil, err
		}
		return []byte("done"), nil
	})
	if err != nil || res.Outcome != idem.Acquired || runs != 1 {
		t.Fatalf("the run across the conversion: %+v %v (work ran %d times)", res, err, runs)
	}
	rec, err := packer.Get(ctx, key.Storage(false))
	if err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "done" {
		t.Fatalf("the record after the conversion: %+v %v", rec, err)
	}
	res, err = g.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) { runs++; return nil, nil })
	if err != nil || res.Outcome != idem.Replayed || runs != 1 {
		t.Fatalf("a duplicate: %+v %v (work ran %d times)", res, err, runs)
	}
}

// TestPackRecordsUnderLoad: two processes' stores that read the text
// layout run Guards on 200 shared keys, 8 goroutines each, while a third
// packs the table: every key's work runs exactly once and every key ends
// completed — the calls refused meanwhile fail closed and go again.
func TestPackRecordsUnderLoad(t *testing.T) {
	schema := testenv.RandomName("idemtest_")
	textTable(t, schema)
	ctx := context.Background()
	packer := testenv.OpenPostgres(t, schema, pgstore.Config{})
	const keys = 200
	var runs [keys]atomic.Int32
	var started atomic.Int32
	half := make(chan struct{})
	var halfOnce sync.Once
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 2 {
		s := testenv.OpenPostgres(t, schema, pgstore.Config{})
		g, err := idem.NewGuard(idem.Config{Store: s, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for w := range 8 {
			wg.Go(func() {
				order := rand.New(rand.NewPCG(uint64(w), 7)).Perm(keys)
				for len(order) > 0 {
					i := order[0]
					order = order[1:]
					res, err := g.Run(ctx, idem.Key{Scope: "load", ID: strconv.Itoa(i)}, nil, func(context.Context, uint64) ([]byte, error) {
						runs[i].Add(1)
						if started.Add(1) == keys/2 {
							halfOnce.Do(func() { close(half) })
						}
						return []byte("done"), nil
					})
					switch {
					case err == nil && (res.Outcome == idem.Acquired || res.Outcome == idem.Replayed):
					case errors.Is(err, idem.ErrStoreUnavailable) || (err == nil && res.Outcome == idem.InProgress):
						order = append(order, i) // again, later
					default:
						errs <- fmt.Errorf("key %d: %+v %v", i, res, err)
						return
					}
				}
			})
		}
	}
	<-half
	if converted, err := packer.PackRecords(ctx); err != nil || !converted {
		t.Fatalf("PackRecords under load: %v %v", converted, err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range keys {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("key %d: work ran %d times", i, n)
		}
		rec, err := packer.Get(ctx, idem.Key{Scope: "load", ID: strconv.Itoa(i)}.Storage(false))
		if err != nil || rec.State != idem.StateCompleted {
			t.Errorf("key %d: %+v %v", i, rec, err)
		}
	}
}
