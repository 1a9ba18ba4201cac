package raftpath

import (
	"io"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"synod/kv/sm"
)

// storage is raft's log storage: a MemoryStorage (entries since the last
// snapshot, rebuilt from the WAL at start) whose snapshots carry no data
// until raft asks for one to send. Snapshot then streams the state machine
// as it is now: its applied slot is at or above the stored snapshot's
// index and at or below the commit index, so the snapshot is a valid
// prefix of the log. Producing it on demand keeps no copy of the state in
// memory between sends.
type storage struct {
	*raft.MemoryStorage
	sm *sm.SM
}

// Snapshot implements raft.Storage.
func (s *storage) Snapshot() (*pb.Snapshot, error) {
	base, err := s.MemoryStorage.Snapshot()
	if err != nil {
		return nil, err
	}
	rc, slot, err := s.sm.Snapshot()
	if err != nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	defer rc.Close()
	if slot < base.GetMetadata().GetIndex() {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	term, err := s.MemoryStorage.Term(slot)
	if err != nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	data, err := io.ReadAll(io.LimitReader(rc, snapshotBytesMax+1))
	if err != nil || len(data) > snapshotBytesMax {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	cs := proto.Clone(base.GetMetadata().GetConfState()).(*pb.ConfState)
	return &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{
		Index: proto.Uint64(slot), Term: proto.Uint64(term), ConfState: cs}}, nil
}
