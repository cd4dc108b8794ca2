package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestServesKafka: the command serves a cluster on the address given, and
// a client produces to a topic that did not exist and reads it back.
func TestServesKafka(t *testing.T) {
	if addr := os.Getenv("LOCAL_KAFKA_TEST_LISTEN"); addr != "" {
		os.Args = []string{"local-kafka", "--listen", addr}
		main()
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServesKafka$")
	cmd.Env = append(os.Environ(), "LOCAL_KAFKA_TEST_LISTEN="+addr)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "Ctrl-C stops it") {
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("orders"),
		kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("order 1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil || len(fs.Records()) != 1 || string(fs.Records()[0].Value) != "order 1" {
		t.Fatalf("read back: %v %v", fs.Records(), err)
	}
}
