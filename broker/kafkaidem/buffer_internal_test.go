package kafkaidem

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBufferBoundedInBytes: a partition's fetching pauses once its queued
// records reach MaxBufferedBytes, however few they are, and resumes once
// the worker took them down to half.
func TestBufferBoundedInBytes(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := Config{Scope: "s", MaxBufferedBytes: 1 << 20}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	c := &Consumer{cfg: cfg, cl: cl}
	p := &partition{c: c, tp: topicPartition{"t", 0}, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	rec := func() *kgo.Record { return &kgo.Record{Topic: "t", Value: bytes.Repeat([]byte("x"), 300<<10)} }
	paused := func() bool { return len(cl.PauseFetchPartitions(nil)["t"]) == 1 }
	p.add([]*kgo.Record{rec(), rec(), rec()}) // 900 KiB
	if paused() {
		t.Fatal("paused at 900 KiB of 1 MiB")
	}
	p.add([]*kgo.Record{rec()}) // 1.2 MiB
	if !paused() {
		t.Fatal("four records of 300 KiB (1.2 MiB) queued and the fetching not paused")
	}
	p.next()
	p.next() // 600 KiB left: above half
	if !paused() {
		t.Fatal("resumed above half")
	}
	p.next() // 300 KiB
	if paused() {
		t.Fatal("not resumed at a quarter")
	}
}
