package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
)

// textTable is the records table as releases before the packed layout
// created it: keys and fingerprints as TEXT, not STRICT.
const textTable = `CREATE TABLE idem_records (
	k TEXT PRIMARY KEY, state INTEGER NOT NULL, fence INTEGER NOT NULL, fp TEXT NOT NULL DEFAULT '',
	attempts INTEGER NOT NULL, result BLOB, lease_until INTEGER NOT NULL, expires_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL, outcome INTEGER NOT NULL);
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);`

// textFile creates a database file holding the records table of the text
// layout (empty) and returns its path.
func textFile(t testing.TB) string {
	path := filepath.Join(t.TempDir(), "text.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(textTable); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConformanceOnATextTable: a table created before the packed layout
// keeps its layout, and the store passes the suite on it, coalesced and
// not.
func TestConformanceOnATextTable(t *testing.T) {
	for name, noCoalesce := range map[string]bool{"Coalesced": false, "Uncoalesced": true} {
		t.Run(name, func(t *testing.T) { runOnATextTable(t, noCoalesce) })
	}
}

func runOnATextTable(t *testing.T, noCoalesce bool) {
	storetest.RunClocked(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB, clock idem.Clock) idem.Store {
		s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: textFile(t), Clock: clock, NoCoalesce: noCoalesce})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		var keyType string
		if err := s.DB().QueryRow(`SELECT type FROM pragma_table_info('idem_records') WHERE name = 'k'`).Scan(&keyType); err != nil || keyType != "TEXT" {
			t.Fatalf("the table of the text layout: k %q %v", keyType, err)
		}
		return s
	})
}

// TestANewTableKeepsKeysAndFingerprintsPacked: the table Migrate creates
// keeps a compact key as its 16 bytes and idem.Fingerprint's digest as 17
// (keypack), and refuses what a process of an earlier release writes (a
// TEXT key) instead of storing a row this release would not find.
func TestANewTableKeepsKeysAndFingerprintsPacked(t *testing.T) {
	s := newStore(t).(*sqlitestore.Store)
	compact := idem.CompactKey(idem.Key{Scope: "orders", ID: "4711"})
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
// sets how many), in a table of each layout.
func TestMemoryPerRecord(t *testing.T) {
	for _, layout := range []string{"packed", "text"} {
		t.Run(layout, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "size.db")
			if layout == "text" {
				path = textFile(t)
			}
			s := openAt(t, path).(*sqlitestore.Store)
			storetest.MemoryPerRecord(t, s, "SQLite pages in use, "+layout+" layout", func() (n int64, err error) {
				if _, err := s.DB().Exec(`VACUUM`); err != nil {
					return 0, err
				}
				err = s.DB().QueryRow(`SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&n)
				return n, err
			})
		})
	}
}
