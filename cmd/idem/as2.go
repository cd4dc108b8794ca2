package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/as2/receiver"
	"github.com/idemgo/idem/internal/keyheader"
	"github.com/idemgo/idem/otelidem"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/senders"
)

func newAS2Cmd() *cobra.Command {
	cmd := &cobra.Command{Use: "as2", Short: "Receive AS2: an endpoint that delivers each interchange once"}
	cmd.AddCommand(newAS2ServeCmd())
	return cmd
}

func newAS2ServeCmd() *cobra.Command {
	var listen, as2File, dir, forward, outboxURL, rejectedDir string
	var maxBytes, maxMemory, rejectedMaxBytes int64
	var maxInFlight, maxPerPeer, rejectedMaxFiles int
	var forwardTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "serve --as2 FILE --store URL (--dir DIR | --forward URL)",
		Short: "Accept AS2 messages on POST /as2 and deliver each interchange once",
		Long: `Accepts AS2 messages (POST /as2) from the partners of the profile: decrypts them,
verifies the partner's signature, computes the MIC, and deduplicates by Message-ID and
by EDI interchange key in the store (a retransmission under a new Message-ID is a
duplicate too; the same control reference with other content gets an error MDN).
Each interchange is delivered once: --dir writes one file per interchange (atomically),
--forward posts it upstream with Idempotency-Key set to the interchange key and the
AS2 headers. The answer is a synchronous MDN, signed when asked, the same again for a
duplicate.

The partner's agreement is enforced: a partner configured with sign: must sign with its
own certificate, one with encrypt: must encrypt, and each interchange's sender id must be
one of the partner's edi_senders. An unknown AS2-From or AS2-To is answered 403. A
refused message of an authenticated partner is kept in --rejected-dir (default: DIR.rejected
beside --dir; required with --forward), bounded by --rejected-max-files and
--rejected-max-bytes (past them the message is answered 503 and the partner sends it
again); a message whose sender is not authenticated is answered and not kept.

With --outbox URL (the outbox idem relay --as2 sends from): POST /as2/mdn takes the
asynchronous MDNs of our own messages (verified, checked, and the row acked or refused),
and the MDNs partners ask to receive asynchronously are sent through that outbox
(retried, the same MDN every time) instead of in the response; the command relays that
outbox (every destination, as2:// under this profile), beside any idem relay.

With OTEL_EXPORTER_OTLP_ENDPOINT set, each request, delivery and MDN send is traced and
exported over OTLP; a forwarded interchange carries its span's traceparent.`,
		Args: cobra.NoArgs,
	}
	store := storeFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:4080", "address to serve on")
	f.StringVar(&as2File, "as2", "", "AS2 profile file (YAML; required)")
	f.StringVar(&dir, "dir", "", "deliver each interchange as a file in this directory")
	f.StringVar(&forward, "forward", "", "deliver each interchange by POST to this URL")
	f.DurationVar(&forwardTimeout, "forward-timeout", 30*time.Second, "timeout of one forward")
	f.Int64Var(&maxBytes, "max-bytes", 64<<20, "largest message accepted (413 above it, before decryption)")
	f.IntVar(&maxInFlight, "max-in-flight", 16, "messages opened and delivered at once, once read (503 with Retry-After beyond)")
	f.Int64Var(&maxMemory, "max-memory", 256<<20, "memory the messages in flight may take, at 4x the bytes read of each, a quarter at most for one client address (503 with Retry-After beyond)")
	f.IntVar(&maxPerPeer, "max-per-peer", 4, "messages one client address sends or has handled at once (503 with Retry-After beyond)")
	f.StringVar(&rejectedDir, "rejected-dir", "", "keep refused messages of authenticated partners here (default: DIR.rejected with --dir; never inside --dir)")
	f.IntVar(&rejectedMaxFiles, "rejected-max-files", 1000, "most refused messages kept in --rejected-dir")
	f.Int64Var(&rejectedMaxBytes, "rejected-max-bytes", 1<<30, "most bytes kept in --rejected-dir")
	timeouts := listenerTimeoutFlags(cmd, 2*time.Minute)
	f.StringVar(&outboxURL, "outbox", "", "outbox store: receive our asynchronous MDNs on /as2/mdn and send partners' through it")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if as2File == "" || (dir == "") == (forward == "") {
			return errors.New("idem as2 serve needs --as2 FILE and one of --dir DIR or --forward URL")
		}
		profile, err := as2.LoadProfile(as2File, time.Now())
		if err != nil {
			return fmt.Errorf("--as2: %w", err)
		}
		ctx := cmd.Context()
		s, err := openStore(ctx, *store)
		if err != nil {
			return err
		}
		defer s.Close()
		tp, flushTraces, err := startTracing(ctx, "idem-as2", cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		defer flushTraces()
		gcfg := idem.Config{Store: s, Retention: 30 * 24 * time.Hour}
		if tp != nil {
			gcfg.Tracer = otelidem.Tracing(tp)
		}
		g, err := idem.NewGuard(gcfg)
		if err != nil {
			return err
		}
		if rejectedDir == "" && dir != "" {
			rejectedDir = filepath.Clean(dir) + ".rejected"
		}
		if rejectedDir == "" {
			return errors.New("idem as2 serve --forward needs --rejected-dir DIR (where refused messages of partners are kept)")
		}
		if dir != "" && within(rejectedDir, dir) {
			return fmt.Errorf("--rejected-dir %s is inside --dir %s, where a pickup of deliveries would see refused messages", rejectedDir, dir)
		}
		for _, d := range []string{dir, rejectedDir} {
			if d != "" {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
		}
		for _, pt := range profile.Partners {
			if len(pt.EDISenders) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "idem as2 serve: partner %s lists no edi_senders: its EDI interchanges will be refused\n", pt.AS2ID)
			}
		}
		rejected := &boundedDir{dir: rejectedDir, maxFiles: rejectedMaxFiles, maxBytes: rejectedMaxBytes}
		cfg := receiver.Config{Profile: profile, Guard: g, MaxBytes: maxBytes, MaxInFlight: maxInFlight, MaxMemory: maxMemory, MaxPerPeer: maxPerPeer,
			Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)),
			Reject: func(_ context.Context, h http.Header, body []byte, why *as2.Failure) error {
				return rejected.write(h.Get("AS2-From")+"\x00"+h.Get("Message-ID")+"\x00"+fmt.Sprint(time.Now().UnixNano()), ".as2", rawMessage(h, body, why))
			}}
		if dir != "" {
			cfg.Deliver = func(_ context.Context, d receiver.Delivery) error {
				return writeFileOnce(dir, d.Message.From+"\x00"+d.Key, ".edi", d.Data)
			}
		} else {
			client := &http.Client{Timeout: forwardTimeout}
			cfg.Deliver = func(ctx context.Context, d receiver.Delivery) error {
				return forwardInterchange(ctx, client, forward, d)
			}
		}
		rv, err := receiver.New(cfg)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		if outboxURL != "" {
			ob, closeOutbox, err := openOutbox(ctx, outboxURL)
			if err != nil {
				return fmt.Errorf("--outbox: %w", err)
			}
			defer closeOutbox()
			if err := ob.Migrate(ctx); err != nil {
				return err
			}
			mux.Handle("POST /as2/mdn", as2sender.AsyncMDNHandler(profile, ob))
			rv.SetSendMDN(func(ctx context.Context, to string, in *as2.Incoming, mdn []byte) error {
				return enqueueMDN(ctx, ob, to, in, mdn)
			})
			// A relay of that outbox, with every sender (AS2 under this
			// profile included): another relay may share the outbox.
			router, closeSenders := senders.New(senders.Config{HTTP: httpsender.Config{Timeout: forwardTimeout}})
			defer closeSenders()
			router["as2"] = as2sender.NewProfile(profile, &http.Client{Timeout: forwardTimeout})
			relay, err := outbox.NewRelay(outbox.RelayConfig{Store: ob, Sender: router, SendTimeout: forwardTimeout, Lease: 2 * forwardTimeout,
				BackoffMin: 100 * time.Millisecond, BackoffMax: time.Minute, PollInterval: 200 * time.Millisecond, TracerProvider: tp})
			if err != nil {
				return err
			}
			if err := relay.Start(ctx, func(err error) { fmt.Fprintf(cmd.ErrOrStderr(), "idem as2 serve: outbox: %v\n", err) }); err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), forwardTimeout+5*time.Second)
				defer cancel()
				_ = relay.Stop(sctx)
			}()
		}
		mux.Handle("POST /as2", rv)
		return serveUntilDone(ctx, listen, serverSpans(tp, mux), 30*time.Second, *timeouts, nil, func(addr net.Addr) {
			fmt.Fprintf(cmd.ErrOrStderr(), "idem as2 serve: %s on http://%s/as2\n", profile.AS2ID, addr)
		})
	}
	return cmd
}

// writeFileOnce writes data as DIR/NAME+ext, the name derived from key
// (readable characters kept, a digest for uniqueness), atomically: a
// temporary file, synced, renamed. Writing the same key again replaces the
// file with the same bytes.
func writeFileOnce(dir, key, ext string, data []byte) error {
	sum := sha256.Sum256([]byte(key))
	readable := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '_'
	}, key)
	if len(readable) > 80 {
		readable = readable[:80]
	}
	final := filepath.Join(dir, readable+"-"+hex.EncodeToString(sum[:6])+ext)
	tmp, err := os.CreateTemp(dir, ".incoming-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), final)
}

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && (rel == "." || !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && rel != "..")
}

// boundedDir is a directory of refused messages that holds at most
// maxFiles files and maxBytes bytes: a write past either bound is an
// error (the message is answered 503 and the partner sends it again).
type boundedDir struct {
	dir      string
	maxFiles int
	maxBytes int64
	mu       sync.Mutex
}

func (b *boundedDir) write(key, ext string, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return err
	}
	files, size := 0, int64(len(data))
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			files++
			size += info.Size()
		}
	}
	if files+1 > b.maxFiles || size > b.maxBytes {
		return fmt.Errorf("%s is full (%d files, %d bytes with this one; the bounds are %d files and %d bytes)", b.dir, files, size, b.maxFiles, b.maxBytes)
	}
	return writeFileOnce(b.dir, key, ext, data)
}

// rawMessage is a refused message as kept for an operator: why, the HTTP
// headers, a blank line, the body as received.
func rawMessage(h http.Header, body []byte, why *as2.Failure) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "X-Idem-Refused: %s\r\n", strings.ReplaceAll(why.Error(), "\n", " "))
	_ = h.Write(&b)
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// forwardInterchange posts one interchange upstream with Idempotency-Key
// set to its key and the AS2 headers; 5xx and network errors are retried
// (the partner's retransmission), other refusals are permanent.
func forwardInterchange(ctx context.Context, client *http.Client, url string, d receiver.Delivery) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.Data))
	if err != nil {
		return idem.Permanent(err)
	}
	ct := d.Message.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Idempotency-Key", keyheader.Format(d.Key))
	req.Header.Set("AS2-From", d.Message.From)
	req.Header.Set("AS2-To", d.Message.To)
	req.Header.Set("Message-ID", "<"+d.Message.MessageID+">")
	w3c.Inject(ctx, propagation.HeaderCarrier(req.Header)) // the delivery's span, when traced
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 500 || resp.StatusCode == 408 || resp.StatusCode == 409 || resp.StatusCode == 429:
		return fmt.Errorf("upstream %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return idem.Permanent(fmt.Errorf("upstream %s: %s", resp.Status, bytes.TrimSpace(msg)))
}

// enqueueMDN puts an asynchronous MDN in the outbox, keyed by the message it
// answers: a duplicate's MDN (the same bytes) enqueues nothing new.
func enqueueMDN(ctx context.Context, ob *outbox.Store, to string, in *as2.Incoming, mdn []byte) error {
	h, body, err := receiver.SplitMDN(mdn)
	if err != nil {
		return err
	}
	headers := map[string]string{}
	for k := range h {
		headers[k] = h.Get(k)
	}
	sum := sha256.Sum256([]byte(in.From + "\x00" + in.MessageID))
	return ob.Enqueue(ctx, outbox.Message{Key: "as2-mdn-" + hex.EncodeToString(sum[:16]), Destination: to, Payload: body, Headers: headers})
}
