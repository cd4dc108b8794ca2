package broker

import "sync"

// Batcher groups the messages handed to Add into batches for a fixed set of
// workers, group-commit style: a free worker takes every message waiting,
// up to the batch size, without waiting for more — a message that arrives
// alone is not delayed, and batches grow only while the workers are busy.
type Batcher[M any] struct {
	queue chan M
	size  int
	run   func([]M)
	wg    sync.WaitGroup
	once  sync.Once
}

// NewBatcher starts workers goroutines that call run with batches of 1 to
// size messages, in arrival order within a batch.
func NewBatcher[M any](size, workers int, run func([]M)) *Batcher[M] {
	size, workers = max(size, 1), max(workers, 1)
	b := &Batcher[M]{queue: make(chan M, size*workers), size: size, run: run}
	for range workers {
		b.wg.Add(1)
		go b.work()
	}
	return b
}

// Add queues m; it blocks while the queue is full (back pressure on the
// subscription). Add after Close panics.
func (b *Batcher[M]) Add(m M) { b.queue <- m }

// Close runs the messages already added and waits for the workers.
func (b *Batcher[M]) Close() {
	b.once.Do(func() { close(b.queue) })
	b.wg.Wait()
}

func (b *Batcher[M]) work() {
	defer b.wg.Done()
	batch := make([]M, 0, b.size)
	for m := range b.queue {
		batch = append(batch[:0], m)
	fill:
		for len(batch) < b.size {
			select {
			case m, ok := <-b.queue:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			default:
				break fill
			}
		}
		b.run(batch)
	}
}
