package sqlitestore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/idemgo/idem/store/sqlitestore"
)

// TestConcurrentOpensOfAFreshDatabase opens one database that does not exist
// yet from eight connections at once, a hundred times: every open succeeds
// (SQLite refuses the switch to WAL of all but one at once, without its busy
// handler; about one round in twenty failed before OpenDB retried it).
func TestConcurrentOpensOfAFreshDatabase(t *testing.T) {
	for round := 0; round < 100; round++ {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("f%d.db", round))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: path})
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				s.Close()
			}()
		}
		close(start)
		wg.Wait()
	}
}
