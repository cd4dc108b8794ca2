package httpidem

import (
	"context"
	"time"
)

// SetTransportWait makes t call wait instead of sleeping between attempts.
func SetTransportWait(t *Transport, wait func(ctx context.Context, d time.Duration) error) {
	t.wait = wait
}
