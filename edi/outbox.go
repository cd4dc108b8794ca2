package edi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/idemgo/idem/outbox"
)

// Outbox headers recording how an interchange was rendered.
const (
	ControlsHeader = "X-Edi-Controls" // the Controls, as JSON
)

// ContentType is the MIME type of a standard's interchanges (RFC 1767).
func ContentType(s Standard) string {
	if s == X12 {
		return "application/EDI-X12"
	}
	return "application/EDIFACT"
}

// EnqueueTx records the interchange of one business intent in the outbox,
// in the caller's transaction: the control numbers are allocated from
// persisted per-partner counters in tx, and the rendered bytes are stored on
// the outbox row under key, so every retry resends the identical bytes. For a
// key already in the outbox it allocates nothing and returns the stored
// controls: an intent is rendered once.
func EnqueueTx(ctx context.Context, tx outbox.Tx, ob *outbox.Store, p Profile, key, destination string, now time.Time, docs ...Document) (Controls, error) {
	row, err := ob.GetTx(ctx, tx, key)
	if err == nil {
		var c Controls
		if jerr := json.Unmarshal([]byte(row.Headers[ControlsHeader]), &c); jerr != nil {
			return Controls{}, errors.New("edi: the outbox row of this key holds no EDI controls: " + key)
		}
		return c, nil
	}
	if !errors.Is(err, outbox.ErrNotFound) {
		return Controls{}, err
	}
	next := func(ctx context.Context, name string) (int64, error) { return ob.NextCounterTx(ctx, tx, name) }
	payload, ctl, err := Render(ctx, next, p, now, docs...)
	if err != nil {
		return Controls{}, err
	}
	cj, _ := json.Marshal(ctl)
	err = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: destination, Payload: payload,
		Headers: map[string]string{"Content-Type": ContentType(p.Standard), ControlsHeader: string(cj),
			// Stored so that every attempt carries the same Date (AS2 requires it
			// for a reused Message-ID).
			"Date": now.UTC().Format(http.TimeFormat)}})
	return ctl, err
}
