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
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"golang.org/x/sync/semaphore"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/internal/testsignal"
	"github.com/idemgo/idem/store"
)

// Delivery is one interchange to hand on.
type Delivery struct {
	// Key is the interchange key (edi.Interchange.Key), or the scoped
	// Message-ID when the payload is not EDI. Interchange keys are
	// deduplicated per partner.
	Key string
	// Message is the AS2 message that carried it.
	Message *as2.Incoming
	// Data is the interchange's bytes: the payload itself when it holds
	// one interchange; pieces that join to the payload when it holds
	// several.
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
	// Reject keeps a refused message of an identified partner, for an
	// operator: one whose sender the agreement authenticates (signed,
	// encrypted, as it says) and that was then refused (an interchange
	// sender id the agreement does not list, a reused control reference,
	// a permanent delivery failure), or any refused message of a partner
	// whose agreement asks for neither signature nor encryption. Messages
	// of senders that are not authenticated are never kept: anyone can
	// send them. An error answers 503 (the partner sends again), so
	// nothing refused is lost. Required.
	Reject func(ctx context.Context, header http.Header, body []byte, why *as2.Failure) error
	// MaxBytes bounds a message; a larger one is answered 413 before it is
	// read. Defaults to 64 MiB.
	MaxBytes int64
	// MaxInFlight bounds the messages opened and delivered at once, once
	// read; one more is answered 503 with Retry-After. Defaults to 16.
	MaxInFlight int
	// MaxMemory bounds the memory the messages in flight may take: each
	// takes four times the bytes read of it (the body, its decoded,
	// decrypted and delivered copies) as they arrive, and a message that
	// finds no room is answered 503 with Retry-After. One client address
	// takes at most a quarter of it (or 4 × MaxBytes, if more). Defaults
	// to 256 MiB; raised to 4 × MaxBytes when smaller.
	MaxMemory int64
	// MaxPerPeer bounds the messages one client address sends or has
	// handled at once; one more is answered 503 with Retry-After. An
	// unknown AS2-From or AS2-To is answered 403 before any of it is read.
	// Defaults to 4.
	MaxPerPeer int
	// Now tells the time of MDN Date headers. Defaults to time.Now.
	Now func() time.Time
	// Logger receives what the partner is not told: the detail of every
	// refusal. Defaults to slog.Default().
	Logger *slog.Logger
	// SendMDN, if set, sends the MDN of a message that asked for an
	// asynchronous one (Receipt-Delivery-Option) to that address — through
	// an outbox, so it is retried, the same MDN every time; the message is
	// then answered with a bare 200. It is called only for an
	// authenticated message and only with an address the partner's
	// agreement lists (as2.Partner.AsyncMDNURLs); any other MDN is
	// answered synchronously. mdn is the serialized MDN: header lines, a
	// blank line, the body. An error answers 503 (the partner sends
	// again, and gets the same MDN sent again). Unset, every MDN is
	// answered synchronously.
	SendMDN func(ctx context.Context, to string, in *as2.Incoming, mdn []byte) error
}

// Receiver is the http.Handler of POST /as2.
type Receiver struct {
	cfg      Config
	inFlight chan struct{}
	memory   *semaphore.Weighted
	mu       sync.Mutex
	peers    map[string]*peer
	signals  struct {
		reading testsignal.Signal[struct{}] // a message's body is being read
	}
}

// peer is what one client address holds: the messages it is sending or
// that are being handled, and the memory they took.
type peer struct {
	addr     string
	messages int
	memory   atomic.Int64
}

func (p *peer) release(n int64) { p.memory.Add(-n) }

// peer takes one of the MaxPerPeer places of r's client address, or
// returns nil when it has none left.
func (rv *Receiver) peer(r *http.Request) *peer {
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	rv.mu.Lock()
	defer rv.mu.Unlock()
	p := rv.peers[addr]
	if p == nil {
		p = &peer{addr: addr}
		rv.peers[addr] = p
	}
	if p.messages >= rv.cfg.MaxPerPeer {
		return nil
	}
	p.messages++
	return p
}

func (rv *Receiver) release(p *peer) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if p.messages--; p.messages == 0 {
		delete(rv.peers, p.addr)
	}
}

var errNoMemory = errors.New("no memory for the message")

// read reads r's body, taking memoryFactor times each chunk's length from
// the shared memory, and at most a quarter of it for one peer, as the
// bytes arrive; it returns the body and the memory it holds (to release),
// errNoMemory when the memory ran out.
func (rv *Receiver) read(w http.ResponseWriter, r *http.Request, p *peer) ([]byte, int64, error) {
	body := http.MaxBytesReader(w, r.Body, rv.cfg.MaxBytes)
	var buf bytes.Buffer
	var held int64
	perPeer := rv.cfg.MaxMemory / 4
	chunk := make([]byte, 32<<10)
	for {
		n, err := body.Read(chunk)
		if n > 0 {
			need := int64(memoryFactor * n)
			if p.memory.Add(need) > max(perPeer, memoryFactor*rv.cfg.MaxBytes) || !rv.memory.TryAcquire(need) {
				p.memory.Add(-need)
				return nil, held, errNoMemory
			}
			held += need
			buf.Write(chunk[:n])
		}
		if err == io.EOF {
			return buf.Bytes(), held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}

// New checks cfg and returns a Receiver.
func New(cfg Config) (*Receiver, error) {
	if cfg.Profile == nil || cfg.Guard == nil || cfg.Deliver == nil || cfg.Reject == nil {
		return nil, errors.New("idem/as2/receiver: Config.Profile, Guard, Deliver and Reject are required")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 16
	}
	if cfg.MaxMemory <= 0 {
		cfg.MaxMemory = 256 << 20
	}
	cfg.MaxMemory = max(cfg.MaxMemory, memoryFactor*cfg.MaxBytes)
	if cfg.MaxPerPeer <= 0 {
		cfg.MaxPerPeer = 4
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Receiver{cfg: cfg, inFlight: make(chan struct{}, cfg.MaxInFlight), memory: semaphore.NewWeighted(cfg.MaxMemory), peers: map[string]*peer{}}, nil
}

// memoryFactor is how many times its length a message may take in memory
// while it is opened and delivered.
const memoryFactor = 4

// SetSendMDN sets Config.SendMDN after New (for an outbox opened later);
// call it before serving.
func (rv *Receiver) SetSendMDN(send func(ctx context.Context, to string, in *as2.Incoming, mdn []byte) error) {
	rv.cfg.SendMDN = send
}

// busy answers 503 with Retry-After.
func busy(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "5")
	http.Error(w, msg, http.StatusServiceUnavailable)
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
	// Nothing is read or reserved for a stranger: the headers name a
	// partner and us, or the answer is 403 (Unpack checks them again).
	if rv.cfg.Profile.Addressed(r.Header) == nil {
		rv.cfg.Logger.Warn("idem as2: refused a message from no partner", "as2_from", r.Header.Get("AS2-From"), "as2_to", r.Header.Get("AS2-To"), "remote", r.RemoteAddr)
		http.Error(w, "not a partner of this endpoint", http.StatusForbidden)
		return
	}
	// A peer (a client address) reads MaxPerPeer messages at once at most,
	// and takes memory for the bytes it has sent, not for what it
	// declared: one still sending holds nothing a partner's message needs.
	peer := rv.peer(r)
	if peer == nil {
		busy(w, "too many messages from this address in flight")
		return
	}
	defer rv.release(peer)
	rv.signals.reading.Signal(struct{}{})
	body, held, err := rv.read(w, r, peer)
	defer rv.memory.Release(held)
	defer peer.release(held)
	switch {
	case errors.Is(err, errNoMemory):
		busy(w, "no memory for the message now")
		return
	case err != nil:
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("the message exceeds the limit of %d bytes", rv.cfg.MaxBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "the message could not be read", http.StatusBadRequest)
		return
	}
	// The message is read: it takes one of the MaxInFlight places while
	// it is opened and delivered.
	select {
	case rv.inFlight <- struct{}{}:
		defer func() { <-rv.inFlight }()
	default:
		busy(w, "too many messages in flight")
		return
	}
	ctx := r.Context()
	in, err := rv.cfg.Profile.Unpack(r.Header, body)
	var failure *as2.Failure
	if errors.As(err, &failure) {
		log := rv.cfg.Logger.With("message_id", in.MessageID, "as2_from", in.From, "as2_to", in.To, "remote", r.RemoteAddr)
		if in.Partner == nil {
			log.Warn("idem as2: refused a message from no partner", "error", failure)
			http.Error(w, "not a partner of this endpoint", http.StatusForbidden)
			return
		}
		if !identified(in) {
			log.Warn("idem as2: refused an unauthenticated message (not kept)", "error", failure)
			rv.reply(w, ctx, in, rv.mdn(in, failure), failure)
			return
		}
		log.Warn("idem as2: refused a message", "error", failure)
		if err := rv.cfg.Reject(context.WithoutCancel(ctx), r.Header.Clone(), body, failure); err != nil {
			log.Error("idem as2: the refused message could not be kept", "error", err)
			busy(w, "the refused message could not be kept; send it again later")
			return
		}
		rv.reply(w, ctx, in, rv.mdn(in, failure), failure)
		return
	}
	res, err := rv.cfg.Guard.Run(ctx, idem.Key{Scope: "as2-message:" + in.From, ID: in.MessageID},
		&idem.RunOptions{Fingerprint: idem.Fingerprint([]byte(in.MIC))},
		func(ctx context.Context, _ uint64) ([]byte, error) { return rv.deliver(ctx, in, r.Header, body) })
	switch {
	case err != nil:
		rv.cfg.Logger.Error("idem as2: not delivered yet", "message_id", in.MessageID, "as2_from", in.From, "error", err)
		busy(w, "not delivered yet, send it again")
	case res.Outcome == store.Replayed || res.Outcome.Owns():
		rv.reply(w, ctx, in, res.Value, nil)
	case res.Outcome == store.InProgress:
		busy(w, "the same message is being delivered")
	default:
		f := &as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("the message is %v", res.Outcome)}
		if res.Outcome == store.Mismatch {
			f.Err = errors.New("this Message-ID came before with other content")
		}
		rv.cfg.Logger.Warn("idem as2: refused a message", "message_id", in.MessageID, "as2_from", in.From, "error", f)
		rv.reply(w, ctx, in, rv.mdn(in, f), f)
	}
}

// identified reports whether a refused message can be held to be its
// partner's: authenticated as the agreement asks, or from a partner whose
// agreement asks for neither signature nor encryption (known by name only).
func identified(in *as2.Incoming) bool {
	if in.Partner == nil {
		return false
	}
	return in.Authenticated || in.Partner.Sign == 0 && in.Partner.Encrypt == as2.EncryptNone
}

// deliver hands on every interchange of the message once (by partner and
// interchange key), and returns the serialized MDN to store and replay:
// processed, or an error MDN when an interchange cannot be delivered at all
// (its sender id is not the partner's, a permanent failure, or its control
// reference reused with other content) — settled too, so a duplicate gets
// the same answer, and the message kept through Reject. A transient
// failure is an error: nothing is stored, the partner's retransmission
// tries again.
func (rv *Receiver) deliver(ctx context.Context, in *as2.Incoming, h http.Header, body []byte) ([]byte, error) {
	refuse := func(f *as2.Failure) ([]byte, error) {
		rv.cfg.Logger.Warn("idem as2: refused a message", "message_id", in.MessageID, "as2_from", in.From, "error", f)
		if err := rv.cfg.Reject(context.WithoutCancel(ctx), h.Clone(), body, f); err != nil {
			return nil, fmt.Errorf("keeping the refused message: %w", err)
		}
		return rv.mdn(in, f), nil
	}
	deliveries, err := split(in)
	if err != nil {
		return refuse(&as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: err})
	}
	for _, d := range deliveries {
		res, err := rv.cfg.Guard.Run(ctx, idem.Key{Scope: "as2-interchange:" + in.From, ID: d.Key},
			&idem.RunOptions{Fingerprint: idem.Fingerprint(d.Data)},
			func(ctx context.Context, _ uint64) ([]byte, error) { return nil, rv.cfg.Deliver(ctx, d) })
		if err != nil && res.Disposition != idem.Fail {
			return nil, err
		}
		switch {
		case err != nil || res.Failed:
			return refuse(&as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("interchange %s cannot be delivered: %s", d.Key, res.Value)})
		case res.Outcome == store.Acquired, res.Outcome == store.TakenOver, res.Outcome == store.Replayed:
		case res.Outcome == store.Mismatch:
			return refuse(&as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("interchange %s came before with other content", d.Key)})
		case res.Outcome == store.InProgress:
			return nil, fmt.Errorf("interchange %s is being delivered from another message", d.Key)
		default:
			return nil, fmt.Errorf("interchange %s is %v", d.Key, res.Outcome)
		}
	}
	return rv.mdn(in, nil), nil
}

// split cuts the payload into its interchanges, each from its start to the
// next one's (the first from the payload's start, the last to its end), so
// the pieces join to the payload byte for byte; a payload in which nothing
// reads as EDI is one delivery keyed by its Message-ID. EDI that does not
// read cleanly — bytes the reader stops at, an envelope error such as a
// second UNB or ISA, a count or reference that does not match — is an
// error, as is an interchange whose sender id the partner's agreement does
// not list: nothing of the message is delivered.
func split(in *as2.Incoming) ([]Delivery, error) {
	ics, err := edi.ReadAll(in.Payload)
	if len(ics) == 0 && !looksLikeEDI(in.Payload) {
		return []Delivery{{Key: "as2:" + in.From + "/" + in.MessageID, Message: in, Data: in.Payload}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the payload holds EDI that does not read cleanly: %w", err)
	}
	out := make([]Delivery, len(ics))
	for i, ic := range ics {
		if !ic.Valid() {
			return nil, fmt.Errorf("interchange %s: %w", ic.Key(), errors.Join(ic.Errors...))
		}
		if !in.Partner.AllowsEDISender(ic.SenderQualifier, ic.Sender) {
			return nil, fmt.Errorf("interchange %s: sender id %q (qualifier %q) is not among partner %s's edi_senders %q", ic.Key(), ic.Sender, ic.SenderQualifier, in.From, in.Partner.EDISenders)
		}
		start, end := ic.Offset, int64(len(in.Payload))
		if i == 0 {
			start = 0
		}
		if i+1 < len(ics) {
			end = ics[i+1].Offset
		}
		out[i] = Delivery{Key: ic.Key(), Message: in, Data: in.Payload[start:end]}
	}
	return out, nil
}

// looksLikeEDI reports whether an envelope header starts anywhere in
// payload: ISA, UNA or UNB followed by a punctuation character (the
// element separator, or UNA's service characters).
func looksLikeEDI(payload []byte) bool {
	for _, tag := range []string{"ISA", "UNA", "UNB"} {
		for rest := payload; ; {
			i := bytes.Index(rest, []byte(tag))
			if i < 0 || i+3 >= len(rest) {
				break
			}
			if c := rest[i+3]; c > ' ' && c < 0x7f && !unicode.IsLetter(rune(c)) && !unicode.IsDigit(rune(c)) {
				return true
			}
			rest = rest[i+3:]
		}
	}
	return false
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

// reply answers with the serialized MDN: in the response, or — for an
// authenticated message whose partner's agreement lists the address it
// asked for — sent there, with a bare 200 here. With no MDN (none was
// asked for), a failure is a plain 400 with the failure's fixed text and a
// success a bare 200.
func (rv *Receiver) reply(w http.ResponseWriter, ctx context.Context, in *as2.Incoming, mdn []byte, failure *as2.Failure) {
	async := len(mdn) > 0 && rv.cfg.SendMDN != nil && in.ReceiptTo != ""
	if async && !(in.Authenticated && in.Partner.AllowsAsyncMDNURL(in.ReceiptTo)) {
		rv.cfg.Logger.Warn("idem as2: an asynchronous MDN not sent: answered synchronously", "message_id", in.MessageID,
			"as2_from", in.From, "receipt_delivery_option", in.ReceiptTo, "authenticated", in.Authenticated)
		async = false
	}
	switch {
	case async:
		if err := rv.cfg.SendMDN(context.WithoutCancel(ctx), in.ReceiptTo, in, mdn); err != nil {
			rv.cfg.Logger.Error("idem as2: the asynchronous MDN could not be queued", "message_id", in.MessageID, "error", err)
			busy(w, "the asynchronous MDN could not be queued")
			return
		}
		w.WriteHeader(http.StatusOK)
	case len(mdn) > 0:
		writeStored(w, mdn)
	case failure != nil:
		http.Error(w, failure.Text(), http.StatusBadRequest)
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
