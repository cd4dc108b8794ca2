// Package otelidem records an idem.Guard's events as OpenTelemetry metrics,
// for any exporter the application configured (OTLP, Prometheus, stdout):
//
//	idem.acquisitions      counter    outcome (acquired, taken-over, in-progress, replayed, mismatch, poisoned), cached
//	idem.settlements       counter    disposition (complete, fail, release, hold)
//	idem.store.duration    histogram  seconds per store operation, by phase (acquire, settle, heartbeat)
//	idem.store.errors      counter    failed store operations, by phase
//
// Use it as idem.Config.Observer.
package otelidem
