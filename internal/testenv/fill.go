package testenv

import (
	"testing"

	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storetest"
)

// CompleteMany acquires and completes n records in s, 16 at once; key(i)
// is the storage key of record i.
func CompleteMany(t testing.TB, s store.Store, n int, key func(i int) string) {
	t.Helper()
	storetest.CompleteMany(t, s, n, key)
}
