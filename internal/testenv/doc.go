// Package testenv decides what a test does when the service it needs is not
// answering: skip with a message naming the service, or — when
// IDEM_TEST_REQUIRE=1, as CI sets it — fail. Green-but-nothing-ran is a
// defect.
package testenv
