// Package storetest is the conformance suite of store.Store. Every backend's
// tests call Run with a constructor; a change of semantics lands here first.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Capabilities{Persistent: true}, func(t testing.TB) store.Store {
//			return openIsolatedStore(t) // cleaned up with t.Cleanup
//		})
//	}
//
// Bench runs the shared benchmarks; MultiProcess and CrashTakeover re-execute
// the test binary to prove the contract across real processes. Campaign runs a
// randomized fault campaign (worker processes killed with SIGKILL, outages,
// Delete and Sweep of live keys, stalled owners, expiry) and checks the
// history for linearizability against a model of the record (porcupine); it
// prints its seed, and -campaign.seed, -campaign.duration and -campaign.check
// replay or lengthen it.
package storetest
