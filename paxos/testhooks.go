package paxos

// TestingQuorumOffByOne is test only: when true the leader uses n/2 instead
// of n/2+1 as quorum. The simulator sets it to show that its checkers catch
// a planted safety bug. Production code never sets it.
var TestingQuorumOffByOne bool

// quorum returns the number of acceptors out of n that form a majority.
func quorum(n int) int {
	if TestingQuorumOffByOne {
		return n / 2
	}
	return n/2 + 1
}
