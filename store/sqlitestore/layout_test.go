package sqlitestore_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
)

// TestANewTableKeepsKeysAndFingerprintsPacked: the table Migrate creates
// keeps a compact key as its 16 bytes and idem.Fingerprint's digest as 17
// (keypack), and refuses a TEXT key (STRICT).
func TestANewTableKeepsKeysAndFingerprintsPacked(t *testing.T) {
	s := newStore(t).(*sqlitestore.Store)
	compact := store.CompactKey("orders", "4711")
	fp := idem.Fingerprint([]byte("body"))
	storetest.KeysReadBack(t, s, fp, compact, "raw\x00\xff", "fifteen-bytes!!")
	var keyType, fpType string
	var keyBytes, fpBytes int
	if err := s.DB().QueryRow(`SELECT typeof(k), typeof(fp), length(k), length(fp) FROM idem_records WHERE length(k) = 16`).Scan(&keyType, &fpType, &keyBytes, &fpBytes); err != nil {
		t.Fatal(err)
	}
	if keyType != "blob" || fpType != "blob" || keyBytes != 16 || fpBytes != 17 {
		t.Fatalf("the compact key's row: k %s of %d bytes, fp %s of %d bytes; want blobs of 16 and 17", keyType, keyBytes, fpType, fpBytes)
	}
	_, err := s.DB().Exec(`INSERT INTO idem_records (k, state, fence, fp, attempts, lease_until, expires_at, updated_at, outcome)
		VALUES ('k', 1, 1, 'fp', 1, 0, 0, 0, 1)`)
	if err == nil || !strings.Contains(err.Error(), "cannot store TEXT value in BLOB column") {
		t.Fatalf("a TEXT key written into the packed table: %v", err)
	}
}

// TestMemoryPerRecord reports the database's growth per completed record
// (pages in use after VACUUM; storetest.MemoryPerRecord, -recordbytes.n
// sets how many).
func TestMemoryPerRecord(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "size.db")).(*sqlitestore.Store)
	storetest.MemoryPerRecord(t, s, "SQLite pages in use", func() (n int64, err error) {
		if _, err := s.DB().Exec(`VACUUM`); err != nil {
			return 0, err
		}
		err = s.DB().QueryRow(`SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&n)
		return n, err
	})
}
