package main

import "fmt"

// Path is one configuration compared on a fresh cluster. Each ablation
// differs from its base path in exactly one lever.
type Path struct {
	Name        string `json:"name"`
	Replication string `json:"replication"` // paxos | raft
	// Durability is the promise the log makes, stated in every table.
	Durability string `json:"durability"`
	Transport  string `json:"transport"` // tcp (raft) | udp | afxdp
	// Topology is where the nodes run: "loopback" (one namespace) or
	// "netns" (one network namespace per node on a veth bridge).
	Topology string `json:"topology"`
	Accel    bool   `json:"accel"`
	// Base names the path this ablation changes one lever of ("" for the
	// main paths).
	Base  string `json:"base,omitempty"`
	Lever string `json:"lever,omitempty"`

	resp      bool   // the RESP endpoint measured with redis-benchmark (resp.go)
	pmemMode  string // paxos: msync | shm | dax
	walOnShm  bool   // raft: WAL directory on /dev/shm
	transport string // kvnode transport.kind
	main      bool   // main paths run every scenario; ablations run steady
	netns     bool   // nodes in network namespaces (lan.go)
}

// Durability modes as the tables print them.
const (
	durFsyncFile = "fsync-file (fdatasync, disk)"
	durMsync     = "pmem-msync (msync, disk file)"
	durShm       = "pmem-shm (/dev/shm: process crash only, NOT power loss)"
	durFsyncShm  = "fsync-shm (fdatasync on /dev/shm: process crash only)"
)

// Topologies as the tables print them.
const (
	topoLoopback = "loopback"
	topoNetns    = "netns"
)

// allPaths lists the main paths, then the ablations.
func allPaths() []Path {
	ps := []Path{
		{Name: "raft", Replication: "raft", Durability: durFsyncFile, Transport: "tcp", main: true},
		{Name: "paxos", Replication: "paxos", Durability: durMsync, Transport: "udp", pmemMode: "msync", transport: "udp", main: true},
		{Name: "paxos-accel", Replication: "paxos", Durability: durMsync, Transport: "udp", Accel: true, pmemMode: "msync", transport: "udp", main: true},
		// Protocol lever: the paxos path's cluster, driven over RESP by
		// redis-benchmark (closed loop) instead of the binary protocol.
		{Name: "resp", Replication: "paxos", Durability: durMsync, Transport: "udp", pmemMode: "msync", transport: "udp", resp: true, Base: "paxos",
			Lever: fmt.Sprintf("protocol: RESP, redis-benchmark -t set,get -P %d -c %d (closed loop: reads are GET, writes SET)", respBenchPipeline, respBenchClients)},
		// Durability lever.
		{Name: "raft-shm", Replication: "raft", Durability: durFsyncShm, Transport: "tcp", walOnShm: true, Base: "raft", Lever: "durability: WAL on /dev/shm"},
		{Name: "paxos-shm", Replication: "paxos", Durability: durShm, Transport: "udp", pmemMode: "shm", transport: "udp", Base: "paxos", Lever: "durability: pmem-shm"},
		// Topology lever, then the transport lever on that topology:
		// AF_XDP needs each node in a namespace of its own, so
		// paxos-udp-netns (kernel UDP, same namespaces) separates what the
		// namespaces and bridge cost from what AF_XDP changes.
		{Name: "paxos-udp-netns", Replication: "paxos", Durability: durMsync, Transport: "udp", pmemMode: "msync", transport: "udp", netns: true, Base: "paxos", Lever: "topology: one network namespace per node on a veth bridge (kernel udp)"},
		{Name: "paxos-afxdp", Replication: "paxos", Durability: durMsync, Transport: "afxdp", pmemMode: "msync", transport: "afxdp", netns: true, Base: "paxos-udp-netns", Lever: "transport: afxdp (same namespaces and bridge)"},
		// Accel lever on the fastest log.
		{Name: "paxos-shm-accel", Replication: "paxos", Durability: durShm, Transport: "udp", Accel: true, pmemMode: "shm", transport: "udp", Base: "paxos-shm", Lever: "accel on"},
	}
	for i := range ps {
		ps[i].Topology = topoLoopback
		if ps[i].netns {
			ps[i].Topology = topoNetns
		}
	}
	return ps
}
