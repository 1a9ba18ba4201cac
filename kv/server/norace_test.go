//go:build !race

package server

// raceSlowdown stretches the tests' waits under the race detector.
const raceSlowdown = 1
