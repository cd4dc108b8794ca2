// Command peerbench measures idem side by side with
// github.com/faustbrian/go-idempotency (the peer), in alternating rounds in
// one process, and prints each side's median rate and the ratios:
//
//   - memory: a first run on fresh keys and a replay of one key through
//     each library's run wrapper (idem's Guard.Run, the peer's
//     idempotencycommand.Runner), 8 goroutines;
//   - do: a typed replay cycling through 4,096 keys (idem.Do against the
//     peer's Runner followed by json.Unmarshal into the same type), 1 and 8
//     goroutines;
//   - redis: the same first run and replay over Redis (go-redis against
//     valkey-go, each library's own client);
//   - http: each library's net/http middleware on the memory store over a
//     real loopback server, 8 keep-alive clients, fresh keys and replays,
//     beside the same handler without middleware.
//
// The peer is not served by the module proxy here, so it is not in this
// module's go.sum: scripts/bench-peer.sh builds this command in a workspace
// that points the peer's module path at a checkout of it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	sections := flag.String("sections", "memory,do,redis,http,handler", "comma-separated sections to run")
	rounds := flag.Int("rounds", 5, "rounds per side (the sides alternate)")
	scale := flag.Float64("scale", 1, "multiplies the operations per round")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address for the redis section")
	match := flag.String("match", "", "run only the comparisons whose name contains this")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	blockProfile := flag.String("blockprofile", "", "write a blocking profile (every blocking event) of the whole run to this file")
	mutexProfile := flag.String("mutexprofile", "", "write a mutex contention profile (every event) of the whole run to this file")
	flag.Parse()
	if *blockProfile != "" {
		runtime.SetBlockProfileRate(1)
		defer writeProfile("block", *blockProfile)
	}
	if *mutexProfile != "" {
		runtime.SetMutexProfileFraction(1)
		defer writeProfile("mutex", *mutexProfile)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "peerbench: %v\n", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}

	cfg := config{rounds: *rounds, scale: *scale, redisAddr: *redisAddr}
	run := map[string]func(context.Context, config) ([]comparison, error){
		"memory":  memoryComparisons,
		"do":      doComparisons,
		"redis":   redisComparisons,
		"http":    httpComparisons,
		"handler": handlerComparisons,
	}
	ctx := context.Background()
	fmt.Printf("peerbench: %d rounds per side, alternating; rate = operations per second, median of the rounds\n", cfg.rounds)
	for name := range strings.SplitSeq(*sections, ",") {
		f, ok := run[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "peerbench: unknown section %q\n", name)
			os.Exit(2)
		}
		comps, err := f(ctx, cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peerbench: %s: %v\n", name, err)
			os.Exit(1)
		}
		for _, c := range comps {
			if !strings.Contains(c.name, *match) {
				if c.close != nil {
					c.close()
				}
				continue
			}
			if err := c.run(cfg.rounds); err != nil {
				fmt.Fprintf(os.Stderr, "peerbench: %s: %v\n", c.name, err)
				os.Exit(1)
			}
		}
	}
}

type config struct {
	rounds    int
	scale     float64
	redisAddr string
}

func (c config) ops(n int) int { return max(1, int(float64(n)*c.scale)) }

// A comparison runs its sides in turn, rounds times, and prints the median
// rate of each and the ratios of idem's to the others'.
type comparison struct {
	name  string
	sides []side // the first is idem's
	close func()
}

// A side runs one round and returns what it measured.
type side struct {
	name  string
	round func() (measured, error)
}

// measured is a round: its operations, how long they took, and the CPU
// time the process spent meanwhile (every goroutine's: the servers' and
// the clients' of a loopback round, the garbage collector's).
type measured struct {
	ops     int
	elapsed time.Duration
	cpu     time.Duration
	allocs  uint64 // heap allocations (every goroutine's)
}

func (m measured) rate() float64 { return float64(m.ops) / m.elapsed.Seconds() }

// cpuPerOp is the CPU time per operation, in µs.
func (m measured) cpuPerOp() float64 { return float64(m.cpu.Microseconds()) / float64(m.ops) }

func (m measured) allocsPerOp() float64 { return float64(m.allocs) / float64(m.ops) }

// mallocs is how many heap allocations the process has made.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// processCPU is the CPU time the process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c comparison) run(rounds int) error {
	if c.close != nil {
		defer c.close()
	}
	rates := make([][]float64, len(c.sides))
	cpus := make([][]float64, len(c.sides))
	allocs := make([][]float64, len(c.sides))
	for range rounds {
		for i, s := range c.sides {
			runtime.GC() // no side pays for the garbage of the one before
			m, err := s.round()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			rates[i] = append(rates[i], m.rate())
			cpus[i] = append(cpus[i], m.cpuPerOp())
			allocs[i] = append(allocs[i], m.allocsPerOp())
		}
	}
	fmt.Printf("\n== %s\n", c.name)
	medians := make([]float64, len(c.sides))
	for i, s := range c.sides {
		medians[i] = median(rates[i])
		fmt.Printf("  %-28s %10.0f /s   (rounds %s)   CPU %6.2f µs/op (rounds %.2f–%.2f)   %.1f allocs/op\n", s.name, medians[i], span(rates[i]),
			median(cpus[i]), slices.Min(cpus[i]), slices.Max(cpus[i]), median(allocs[i]))
	}
	if last := len(c.sides) - 1; last >= 2 && c.sides[last].name == noMiddleware {
		// The CPU each middleware adds to a request: its side's less the
		// bare side's of the same round.
		added := make([][]float64, last)
		for i := range last {
			for r := range rounds {
				added[i] = append(added[i], cpus[i][r]-cpus[last][r])
			}
			fmt.Printf("  CPU %s adds per request: %.2f µs (rounds %.2f–%.2f)\n", c.sides[i].name, median(added[i]), slices.Min(added[i]), slices.Max(added[i]))
		}
		fmt.Printf("  CPU added, %s / %s = %.2f\n", c.sides[0].name, c.sides[1].name, median(added[0])/median(added[1]))
		if last >= 3 && c.sides[2].name == floorName {
			fmt.Printf("  CPU added, %s / %s = %.2f (no middleware replays for less)\n", c.sides[2].name, c.sides[1].name, median(added[2])/median(added[1]))
		}
	}
	for i := 1; i < len(c.sides); i++ {
		ratios := make([]float64, rounds)
		for r := range rounds {
			ratios[r] = rates[0][r] / rates[i][r]
		}
		fmt.Printf("  %s / %s = %.2f   (rounds %.2f–%.2f)\n", c.sides[0].name, c.sides[i].name,
			medians[0]/medians[i], slices.Min(ratios), slices.Max(ratios))
	}
	if len(c.sides) == 3 {
		fmt.Printf("  %s / %s = %.2f\n", c.sides[1].name, c.sides[2].name, medians[1]/medians[2])
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func span(xs []float64) string {
	return fmt.Sprintf("%.0f–%.0f", slices.Min(xs), slices.Max(xs))
}

// drive runs op n times over workers goroutines (op gets the operation's
// index, 0 to n-1) and returns what it measured. The first error stops the
// round.
func drive(workers, n int, op func(i int) error) (measured, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	start, cpu, allocs := time.Now(), processCPU(), mallocs()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := op(i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	m := measured{ops: n, elapsed: time.Since(start), cpu: processCPU() - cpu, allocs: mallocs() - allocs}
	if p := firstErr.Load(); p != nil {
		return measured{}, *p
	}
	return m, nil
}

func writeProfile(name, path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup(name).WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "peerbench: %s profile: %v\n", name, err)
	}
}
