package senders_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/senders"
)

func TestHTTPOutcomes(t *testing.T) {
	var mu sync.Mutex
	var gotKey, gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		gotKey, gotBody = r.Header.Get("Idempotency-Key"), string(b)
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(201)
		case "/replayed":
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(200)
		case "/conflict":
			w.WriteHeader(409)
		case "/bad":
			w.WriteHeader(400)
			io.WriteString(w, "unknown product")
		case "/down":
			w.WriteHeader(503)
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		}
	}))
	defer srv.Close()
	h := senders.NewHTTP(senders.HTTPConfig{Timeout: 100 * time.Millisecond})
	for path, want := range map[string]outbox.Status{
		"/ok": outbox.Acked, "/replayed": outbox.Acked, "/conflict": outbox.Pending, "/bad": outbox.Dead,
		"/down": outbox.Pending, "/slow": outbox.Pending,
	} {
		res := h.Send(context.Background(), &outbox.Message{Key: `ORD-"1"`, Destination: srv.URL + path, Payload: []byte("body")})
		if res.Status != want {
			t.Errorf("%s: %s (%v), want %s", path, res.Status, res.Err, want)
		}
		if path == "/bad" && !strings.Contains(res.Err.Error(), "unknown product") {
			t.Errorf("the 4xx answer is not recorded: %v", res.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if gotKey != `"ORD-\"1\""` || gotBody != "body" {
		t.Fatalf("key header %q, body %q", gotKey, gotBody)
	}
	if res := h.Send(context.Background(), &outbox.Message{Key: "k", Destination: "http://127.0.0.1:1/refused"}); res.Status != outbox.Pending {
		t.Fatalf("connection refused: %s", res.Status)
	}
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
	s := senders.NewNATS()
	defer s.Close()
	m := &outbox.Message{Key: "ORD-20261129-0001", Destination: testenv.NATSURL + "/" + name + ".orders", Payload: []byte("order"), Headers: map[string]string{"X-Type": "order"}}
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
	if err != nil || got.Header.Get(nats.MsgIdHdr) != m.Key || got.Header.Get("X-Type") != "order" {
		t.Fatalf("stored message %+v %v", got, err)
	}
	if res := s.Send(ctx, &outbox.Message{Key: "k", Destination: "nats://127.0.0.1:4222"}); res.Status != outbox.Dead {
		t.Fatalf("no subject: %s", res.Status)
	}
}

func TestAMQPMessageID(t *testing.T) {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	defer conn.Close()
	ch, _ := conn.Channel()
	q := testenv.RandomName("idemout.")
	if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	s := senders.NewAMQP()
	defer s.Close()
	res := s.Send(context.Background(), &outbox.Message{Key: "ORD-7", Destination: testenv.AMQPURL + "?routing_key=" + q, Payload: []byte("order 7")})
	if res.Status != outbox.Sent {
		t.Fatalf("send: %s %v", res.Status, res.Err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok || d.MessageId != "ORD-7" || string(d.Body) != "order 7" || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("delivered %+v %v %v", d.MessageId, ok, err)
	}
	if res := s.Send(context.Background(), &outbox.Message{Key: "k", Destination: testenv.AMQPURL}); res.Status != outbox.Dead {
		t.Fatalf("no exchange or routing key: %s", res.Status)
	}
}
