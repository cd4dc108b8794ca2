package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

// TestANewTableKeepsKeysAndFingerprintsPacked: the table Migrate creates
// keeps a compact key as its 16 bytes and idem.Fingerprint's digest as 17
// (keypack), and any other key, NUL bytes and invalid UTF-8 included, as
// it is.
func TestANewTableKeepsKeysAndFingerprintsPacked(t *testing.T) {
	s := newStore(t).(*pgstore.Store)
	ctx := context.Background()
	compact := store.CompactKey("orders", "4711")
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
	reqs := []store.AcquireRequest{{Key: "a\x00", Lease: time.Minute, Retention: time.Hour}, {Key: "b", Lease: time.Minute, Retention: time.Hour}}
	out, errs := pgstore.AcquireBatch(ctx, s, reqs)
	for i := range reqs {
		if errs[i] != nil || out[i].Outcome != store.Acquired || out[i].Record.Key != reqs[i].Key {
			t.Fatalf("%q in a batch: %+v %v", reqs[i].Key, out[i], errs[i])
		}
	}
	if errs := pgstore.CompleteBatch(ctx, s, []string{"a\x00", "b"}, []uint64{out[0].Fence, out[1].Fence}, []byte("done")); errors.Join(errs...) != nil {
		t.Fatalf("settles: %v", errs)
	}
}
