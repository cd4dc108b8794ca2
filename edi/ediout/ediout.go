// Package ediout records EDI interchanges in the outbox: the bridge
// between package edi (which knows no outbox, no database) and package
// outbox (which knows no EDI).
package ediout

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/outbox"
)

// ControlsHeader is the outbox header recording the control numbers an
// interchange was rendered with (edi.Controls, as JSON).
const ControlsHeader = "X-Edi-Controls"

// EnqueueTx records the interchange of one business intent in the outbox,
// in the caller's transaction: the control numbers are allocated from
// persisted per-partner counters in tx, and the rendered bytes are stored on
// the outbox row under key, so every retry resends the identical bytes. For a
// key already in the outbox it allocates nothing and returns the stored
// controls: an intent is rendered once.
func EnqueueTx[TTx any](ctx context.Context, ob *outbox.Outbox[TTx], tx TTx, p edi.Profile, key, destination string, now time.Time, docs ...edi.Document) (edi.Controls, error) {
	row, err := ob.GetTx(ctx, tx, key)
	if err == nil {
		var c edi.Controls
		if jerr := json.Unmarshal([]byte(row.Headers[ControlsHeader]), &c); jerr != nil {
			return edi.Controls{}, errors.New("idem/ediout: the outbox row of this key holds no EDI controls: " + key)
		}
		return c, nil
	}
	if !errors.Is(err, outbox.ErrNotFound) {
		return edi.Controls{}, err
	}
	next := func(ctx context.Context, name string) (int64, error) { return ob.NextCounterTx(ctx, tx, name) }
	payload, ctl, err := edi.Render(ctx, next, p, now, docs...)
	if err != nil {
		return edi.Controls{}, err
	}
	cj, _ := json.Marshal(ctl)
	err = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: destination, Payload: payload,
		Headers: map[string]string{"Content-Type": edi.ContentType(p.Standard), ControlsHeader: string(cj),
			// Stored so that every attempt carries the same Date (AS2 requires it
			// for a reused Message-ID).
			"Date": now.UTC().Format(http.TimeFormat)}})
	return ctl, err
}
