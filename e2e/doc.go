// Package e2e holds synod's end-to-end tests: real kvnode processes on
// loopback, driven by the Go client, killed and partitioned under load,
// with whole client histories checked for linearizability by porcupine.
//
//	go test ./e2e/                          # the whole suite
//	E2E_KILLS=20 go test -run Kill ./e2e/   # more leader kills
//	E2E_RACE=1 go test ./e2e/               # kvnode built with -race
//	E2E_KVNODE=/path/to/kvnode ./e2e.test   # use a prebuilt kvnode
//	E2E_PMEM_MODE=msync go test ./e2e/      # acceptor logs msync'ed files, not /dev/shm
//	E2E_ACCEL=off|soft go test ./e2e/       # accel on no node / every node (default: nodes 1, 2)
//
// TestMain builds kvnode once into a temporary directory. Every kvnode
// the suite starts dies with the test binary, even when a timeout or a
// kill ends it without cleanup (internal/childproc).
package e2e
