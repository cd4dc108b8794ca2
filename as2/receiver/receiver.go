// Package receiver is an AS2 endpoint that delivers each interchange once:
// it opens what partners post (decrypts, verifies, computes the MIC),
// deduplicates by Message-ID and by the EDI interchange key through an
// idem.Guard, delivers through a Deliver function (a directory, an upstream
// HTTP service) and answers with an MDN — the same MDN again for a
// duplicate.
package receiver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/edi"
)

// Delivery is one interchange to hand on.
type Delivery struct {
	// Key is the interchange key (edi.Interchange.Key), or the scoped
	// Message-ID when the payload is not EDI.
	Key string
	// Message is the AS2 message that carried it.
	Message *as2.Incoming
	// Data is the interchange's bytes.
	Data []byte
}

// Config configures a Receiver.
type Config struct {
	// Profile is who we are and who our partners are. Required.
	Profile *as2.Profile
	// Guard deduplicates; its store keeps the MDNs replayed to duplicates.
	// Required.
	Guard *idem.Guard
	// Deliver hands one interchange on. It runs at most once per
	// interchange key while it succeeds; an error is retried by the
	// partner's retransmission (the message is answered 503, no MDN), an
	// error marked idem.Permanent is answered with an error MDN.
	Deliver func(ctx context.Context, d Delivery) error
	// Reject keeps a message that could not be opened, for an operator.
	// Required: nothing refused is lost.
	Reject func(ctx context.Context, header http.Header, body []byte, why *as2.Failure) error
	// MaxBytes bounds a message; a larger one is answered 413 before it is
	// read. Defaults to 64 MiB.
	MaxBytes int64
	// Now tells the time of MDN Date headers. Defaults to time.Now.
	Now func() time.Time
	// SendMDN, if set, sends the MDN of a message that asked for an
	// asynchronous one (Receipt-Delivery-Option) to that address — through
	// an outbox, so it is retried, the same MDN every time; the message is
	// then answered with a bare 200. mdn is the serialized MDN: header
	// lines, a blank line, the body. An error answers 503 (the partner
	// sends again, and gets the same MDN sent again). Unset, every MDN is
	// answered synchronously.
	SendMDN func(ctx context.Context, to string, in *as2.Incoming, mdn []byte) error
}

// Receiver is the http.Handler of POST /as2.
type Receiver struct{ cfg Config }

// New checks cfg and returns a Receiver.
func New(cfg Config) (*Receiver, error) {
	if cfg.Profile == nil || cfg.Guard == nil || cfg.Deliver == nil || cfg.Reject == nil {
		return nil, errors.New("idem/as2/receiver: Config.Profile, Guard, Deliver and Reject are required")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Receiver{cfg: cfg}, nil
}

// SetSendMDN sets Config.SendMDN after New (for an outbox opened later);
// call it before serving.
func (rv *Receiver) SetSendMDN(send func(ctx context.Context, to string, in *as2.Incoming, mdn []byte) error) {
	rv.cfg.SendMDN = send
}

// ServeHTTP handles one AS2 message.
func (rv *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "AS2 messages are POSTed", http.StatusMethodNotAllowed)
		return
	}
	if r.ContentLength > rv.cfg.MaxBytes {
		http.Error(w, fmt.Sprintf("the message is %d bytes; the limit is %d", r.ContentLength, rv.cfg.MaxBytes), http.StatusRequestEntityTooLarge)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rv.cfg.MaxBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("the message exceeds the limit of %d bytes", rv.cfg.MaxBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the message: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	in, err := rv.cfg.Profile.Unpack(r.Header, body)
	var failure *as2.Failure
	if errors.As(err, &failure) {
		if err := rv.cfg.Reject(context.WithoutCancel(ctx), r.Header.Clone(), body, failure); err != nil {
			// Not kept: let the partner send it again rather than lose it.
			http.Error(w, "could not keep the refused message: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		rv.reply(w, ctx, in, rv.mdn(in, failure), failure)
		return
	}
	res, err := rv.cfg.Guard.Run(ctx, idem.Key{Scope: "as2-message:" + in.From, ID: in.MessageID},
		&idem.RunOptions{Fingerprint: idem.Fingerprint([]byte(in.MIC))},
		func(ctx context.Context, _ uint64) ([]byte, error) { return rv.deliver(ctx, in) })
	switch {
	case err != nil:
		w.Header().Set("Retry-After", "5")
		http.Error(w, "not delivered yet, send it again: "+err.Error(), http.StatusServiceUnavailable)
	case res.Outcome == idem.Replayed || res.Outcome.Owns():
		rv.reply(w, ctx, in, res.Value, nil)
	case res.Outcome == idem.InProgress:
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the same message is being delivered", http.StatusServiceUnavailable)
	default:
		f := &as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("the message is %v", res.Outcome)}
		if res.Outcome == idem.Mismatch {
			f.Err = errors.New("this Message-ID came before with other content")
		}
		rv.reply(w, ctx, in, rv.mdn(in, f), f)
	}
}

// deliver hands on every interchange of the message once (by interchange
// key), and returns the serialized MDN to store and replay: processed, or an
// error MDN when an interchange cannot be delivered at all (a permanent
// failure, or its control reference reused with other content) — settled
// too, so a duplicate gets the same answer. A transient failure is an
// error: nothing is stored, the partner's retransmission tries again.
func (rv *Receiver) deliver(ctx context.Context, in *as2.Incoming) ([]byte, error) {
	for _, d := range split(in) {
		res, err := rv.cfg.Guard.Run(ctx, idem.Key{Scope: "as2-interchange", ID: d.Key},
			&idem.RunOptions{Fingerprint: idem.Fingerprint(d.Data)},
			func(ctx context.Context, _ uint64) ([]byte, error) { return nil, rv.cfg.Deliver(ctx, d) })
		if err != nil && res.Disposition != idem.Fail {
			return nil, err
		}
		switch {
		case err != nil || res.Failed:
			return rv.mdn(in, &as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("interchange %s cannot be delivered: %s", d.Key, res.Value)}), nil
		case res.Outcome == idem.Acquired, res.Outcome == idem.TakenOver, res.Outcome == idem.Replayed:
		case res.Outcome == idem.Mismatch:
			return rv.mdn(in, &as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("interchange %s came before with other content", d.Key)}), nil
		case res.Outcome == idem.InProgress:
			return nil, fmt.Errorf("interchange %s is being delivered from another message", d.Key)
		default:
			return nil, fmt.Errorf("interchange %s is %v", d.Key, res.Outcome)
		}
	}
	return rv.mdn(in, nil), nil
}

// split cuts the payload into its interchanges; a payload that is not EDI
// is one delivery keyed by its Message-ID.
func split(in *as2.Incoming) []Delivery {
	ics, err := edi.ReadAll(in.Payload)
	if err != nil || len(ics) == 0 {
		return []Delivery{{Key: "as2:" + in.From + "/" + in.MessageID, Message: in, Data: in.Payload}}
	}
	out := make([]Delivery, len(ics))
	for i, ic := range ics {
		end := int64(len(in.Payload))
		if i+1 < len(ics) {
			end = ics[i+1].Offset
		}
		out[i] = Delivery{Key: ic.Key(), Message: in, Data: bytes.TrimRight(in.Payload[ic.Offset:end], "\r\n \t")}
	}
	return out
}

// mdn serializes the MDN for in (header lines, blank line, body), or nil
// when no MDN was asked for.
func (rv *Receiver) mdn(in *as2.Incoming, failure *as2.Failure) []byte {
	if in.MDNTo == "" {
		return nil
	}
	h, body, err := rv.cfg.Profile.BuildMDN(in, failure, rv.cfg.Now())
	if err != nil {
		return nil
	}
	var b bytes.Buffer
	_ = h.Write(&b)
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// reply answers with the serialized MDN: in the response, or sent to the
// address of an asynchronous one with a bare 200 here. With no MDN (none
// was asked for), a failure is a plain 400 and a success a bare 200.
func (rv *Receiver) reply(w http.ResponseWriter, ctx context.Context, in *as2.Incoming, mdn []byte, failure *as2.Failure) {
	switch {
	case len(mdn) > 0 && rv.cfg.SendMDN != nil && (strings.HasPrefix(in.ReceiptTo, "http://") || strings.HasPrefix(in.ReceiptTo, "https://")):
		if err := rv.cfg.SendMDN(context.WithoutCancel(ctx), in.ReceiptTo, in, mdn); err != nil {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "the asynchronous MDN could not be queued: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case len(mdn) > 0:
		writeStored(w, mdn)
	case failure != nil:
		http.Error(w, failure.Error(), http.StatusBadRequest)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// SplitMDN separates a serialized MDN (as SendMDN gets it) into its header
// fields and body.
func SplitMDN(stored []byte) (http.Header, []byte, error) {
	h, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(stored))).ReadMIMEHeader()
	if err != nil {
		return nil, nil, fmt.Errorf("idem/as2/receiver: a stored MDN is unreadable: %w", err)
	}
	i := bytes.Index(stored, []byte("\r\n\r\n"))
	if i < 0 {
		return nil, nil, errors.New("idem/as2/receiver: a stored MDN has no body")
	}
	return http.Header(h), stored[i+4:], nil
}

// writeStored writes a serialized MDN as the response.
func writeStored(w http.ResponseWriter, stored []byte) {
	h, body, err := SplitMDN(stored)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
