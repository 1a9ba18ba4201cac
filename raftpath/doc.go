// Package raftpath is synod's Raft comparison path: the same kv state
// machine (kv/sm), client protocol (kv/server) and tenant handling as the
// Paxos path, replicated by go.etcd.io/raft/v3 the way etcd runs it.
//
//   - One Ready loop per node (node.go): save HardState and entries to the
//     WAL with fdatasync, then send messages, then apply committed entries,
//     then Advance. This is raft's contract: entries are durable BEFORE the
//     messages of the same Ready leave the node.
//   - Its own segmented WAL (wal.go) of CRC-checked records; a torn tail is
//     cut on recovery.
//   - TCP streams between peers (transport.go), one outbound stream per
//     peer with a bounded queue; a full queue drops messages, which raft
//     tolerates (it retransmits).
//   - Snapshots of the state machine (kv/sm) every SnapshotEntries applied
//     entries; the WAL then drops covered segments. A follower too far
//     behind gets the state machine stream in MsgSnap (storage.go).
//   - PreVote and CheckQuorum on; linearizable reads with ReadIndex
//     (ReadOnlySafe: one heartbeat round per batch of reads); writes are
//     answered once applied on the leader.
//
// What it does NOT share with the Paxos path, on purpose: no accel plane,
// no persistent-memory log, no tenant shaping inside consensus. The
// benchmark (cmd/kvbench) compares the two; DESIGN.md says why.
//
// Membership is static: the peers of the config are the voters, bootstrapped
// as a snapshot at index 1 on every node.
package raftpath
