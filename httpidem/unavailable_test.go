package httpidem_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
)

// unavailable answers every Acquire as an unreachable server does.
type unavailable struct{ idem.Store }

func (unavailable) Acquire(context.Context, idem.AcquireRequest) (idem.Acquisition, error) {
	return idem.Acquisition{}, fmt.Errorf("%w: connection refused", idem.ErrStoreUnavailable)
}
