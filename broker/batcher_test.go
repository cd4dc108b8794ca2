package broker

import (
	"sync"
	"testing"
)

func TestBatcherRunsEveryMessageOnceInBatches(t *testing.T) {
	const n, size = 10000, 16
	var mu sync.Mutex
	seen := make(map[int]int, n)
	largest := 0
	release := make(chan struct{})
	first := true
	b := NewBatcher(size, 4, func(batch []int) {
		mu.Lock()
		wasFirst := first
		first = false
		for _, m := range batch {
			seen[m]++
		}
		largest = max(largest, len(batch))
		mu.Unlock()
		if len(batch) > size {
			t.Errorf("a batch of %d, above the size %d", len(batch), size)
		}
		if wasFirst {
			<-release // hold one worker so that messages queue up
		}
	})
	for i := range n {
		if i == 100 {
			close(release)
		}
		b.Add(i)
	}
	b.Close()
	for i := range n {
		if seen[i] != 1 {
			t.Fatalf("message %d ran %d times", i, seen[i])
		}
	}
	if largest < 2 {
		t.Fatalf("the largest batch had %d messages: nothing was grouped while workers were busy", largest)
	}
}

func TestBatcherDoesNotWaitToFill(t *testing.T) {
	got := make(chan []int, 1)
	b := NewBatcher(64, 1, func(batch []int) { got <- append([]int(nil), batch...) })
	defer b.Close()
	b.Add(7)
	if batch := <-got; len(batch) != 1 || batch[0] != 7 {
		t.Fatalf("a lone message came as %v", batch)
	}
}
