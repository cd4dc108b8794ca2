// Command idem is the idem toolkit's command line: demo, keys, migrate and
// bench, on any store URL (embedded SQLite by default).
package main
