package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// With Config.WaitReplicas, a Cluster's calls go to their master's own
// client, so that WAIT follows the scripts on their connection; that
// client does not follow the cluster's redirections as the cluster client
// does. followRedirects does, for the calls at idx that node answered
// with one — each of them means that the script did not run:
//
//   - MOVED: the slot has moved (resharded). The client's map of the
//     cluster is reloaded, and the call sent to the master named.
//   - ASK: the slot is moving and the call's keys are on the target
//     already: sent there after ASKING, which lets the target serve it
//     once.
//   - TRYAGAIN: the call's keys are split between the two for a moment:
//     sent again to the same master after a pause (8 ms, doubling).
//
// At most the cluster client's MaxRedirects times for a call (3 by
// default); past that, or where the master named is not known, the call
// keeps its answer and fails closed.
func (s *Store) followRedirects(ctx context.Context, node redis.Cmdable, send pipelined, idx []int, out []*redis.Cmd, asking bool, redirects int) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || node == redis.Cmdable(cc) || redirects >= cc.Options().MaxRedirects {
		return
	}
	type target struct {
		addr string // "" for the same node (TRYAGAIN)
		ask  bool
	}
	var by map[target][]int
	for _, i := range idx {
		addr, ask, ok := redirection(out[i].Err())
		if !ok {
			continue
		}
		if by == nil {
			by = map[target][]int{}
		}
		if addr == "" {
			ask = asking
		}
		by[target{addr, ask}] = append(by[target{addr, ask}], i)
	}
	for t, ids := range by {
		next := node
		if t.addr == "" {
			select {
			case <-ctx.Done():
				return
			case <-time.After(8 * time.Millisecond << redirects):
			}
		} else {
			m, err := nodeAt(ctx, cc, t.addr)
			if err != nil {
				for _, i := range ids {
					out[i].SetErr(fmt.Errorf("%w (following %v)", err, out[i].Err()))
				}
				continue
			}
			next = m
		}
		s.sendPipeline(ctx, next, send, ids, out, t.ask, redirects+1)
	}
}

// redirection reads a redirecting answer: the address it names (none for
// TRYAGAIN) and whether it is ASK.
func redirection(err error) (addr string, ask, ok bool) {
	if err == nil || !isReply(err) {
		return "", false, false
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "TRYAGAIN") {
		return "", false, true
	}
	kind, rest, _ := strings.Cut(msg, " ")
	if kind != "MOVED" && kind != "ASK" {
		return "", false, false
	}
	_, addr, _ = strings.Cut(rest, " ") // "MOVED 3999 127.0.0.1:6381"
	return addr, kind == "ASK", addr != ""
}

// nodeAt returns the cluster client's own client of the node at addr,
// reloading the client's map of the cluster first (so that the calls
// after this one go to the slot's new master at once). Among every node,
// not the masters only: the node the map was read from may not know yet
// that a replica took its master's place (a failover).
func nodeAt(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := cc.ForEachShard(ctx, func(_ context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			mu.Lock()
			found = m
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("idem: the cluster redirected a call to %s, which is not among its nodes", addr)
	}
	return found, nil
}
