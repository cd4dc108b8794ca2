package natssender_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/natssender"
	"github.com/idemgo/idem/outbox/sendertest"
)

// TestConformance: the receiver is a JetStream stream, whose duplicate
// window keeps one copy of a retried message and says so in the PubAck.
func TestConformance(t *testing.T) {
	nc, err := nats.Connect(testenv.NATSURL, nats.Timeout(3*time.Second))
	testenv.Need(t, "NATS", testenv.NATSURL, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s := natssender.New()
	defer s.Close()
	sendertest.Run(t, sendertest.Target{
		Sender:   s,
		Features: sendertest.Features{DuplicateAnswer: true, ReceiverDedups: true},
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			ctx := context.Background()
			name := testenv.RandomName("IDEMSEND_")
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
			return testenv.NATSURL + "/" + name + ".orders", func() []sendertest.Delivery {
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var out []sendertest.Delivery
				for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, sendertest.Delivery{KeyField: m.Header.Get(nats.MsgIdHdr), Payload: m.Data})
				}
				return out
			}
		},
		KeyField:    func(key string) string { return key },
		Unreachable: func(*testing.T) string { return "nats://127.0.0.1:1/orders" },
		Refused: func(*testing.T) []string {
			return []string{testenv.NATSURL, "nats:///orders", testenv.NATSURL + "/with space"}
		},
	})
}

func TestNATSMsgIDAndDuplicate(t *testing.T) {
	nc, err := nats.Connect(testenv.NATSURL, nats.Timeout(3*time.Second))
	testenv.Need(t, "NATS", testenv.NATSURL, err)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	name := testenv.RandomName("IDEMOUT_")
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	s := natssender.New()
	defer s.Close()
	m := &outbox.Message{Key: "ORD-20261129-0001", Destination: testenv.NATSURL + "/" + name + ".orders", Payload: []byte("order"),
		Headers: map[string]string{"X-Type": "order"}, OrderingKey: "acct-7"}
	for i := range 3 { // a retry after a lost PubAck, twice
		res := s.Send(ctx, m)
		if res.Status != outbox.Sent {
			t.Fatalf("send %d: %s %v", i, res.Status, res.Err)
		}
		if i > 0 && (res.Err == nil || !strings.Contains(res.Err.Error(), "duplicate")) {
			t.Fatalf("send %d was not reported as a duplicate", i)
		}
	}
	info, _ := st.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("the stream holds %d messages, want 1", info.State.Msgs)
	}
	got, err := st.GetLastMsgForSubject(ctx, name+".orders")
	if err != nil || got.Header.Get(nats.MsgIdHdr) != m.Key || got.Header.Get("X-Type") != "order" || got.Header.Get(outbox.OrderingKeyHeader) != "acct-7" {
		t.Fatalf("stored message %+v %v", got, err)
	}
	if res := s.Send(ctx, &outbox.Message{Key: "k", Destination: "nats://127.0.0.1:4222"}); res.Status != outbox.Dead {
		t.Fatalf("no subject: %s", res.Status)
	}
}

// TestCredentialsAreTheSenders: against a server that wants a token, a
// destination without one is retried (pending, the server's reason), and a
// sender given the token (natssender.New(nats.Token(…))) delivers to the
// same destination — no secret in the outbox row.
func TestCredentialsAreTheSenders(t *testing.T) {
	srv := testenv.StartNATSServer(t, "--auth", "relay-s3cret")
	st := srv.Stream(t, "ORDERS", "orders", nats.Token("relay-s3cret"))
	ctx := context.Background()
	m := &outbox.Message{Key: "ORD-1", Destination: srv.URL + "/orders", Payload: []byte("order")}
	anonymous := natssender.New()
	defer anonymous.Close()
	if res := anonymous.Send(ctx, m); res.Status != outbox.Pending || res.Err == nil || !strings.Contains(strings.ToLower(res.Err.Error()), "authorization") {
		t.Fatalf("without the token: %s %v; want pending, authorization", res.Status, res.Err)
	}
	s := natssender.New(nats.Token("relay-s3cret"))
	defer s.Close()
	if res := s.Send(ctx, m); res.Status != outbox.Sent {
		t.Fatalf("with the token: %s %v", res.Status, res.Err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the stream holds %+v (%v), want the message", info, err)
	}
}
