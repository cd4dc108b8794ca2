package httpidem_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// unavailable answers every Acquire as an unreachable server does.
type unavailable struct{ store.Store }

func (unavailable) Acquire(context.Context, store.AcquireRequest) (store.Acquisition, error) {
	return store.Acquisition{}, fmt.Errorf("%w: connection refused", idem.ErrStoreUnavailable)
}
