package afxdp

import "sync/atomic"

// Counters is a snapshot of a Conn's packet counters. Every datagram that
// reaches the socket is either delivered (RxPackets) or counted in exactly
// one of the Rx drop counters; none of them panics the reader.
type Counters struct {
	RxPackets uint64 // delivered to ReadBatch
	RxKernel  uint64 // of RxPackets, those an XDPConn got through its kernel socket (passed by XDP: other queues, IP options, fragments)
	RxBytes   uint64 // payload bytes delivered
	TxPackets uint64 // handed to the network
	TxKernel  uint64 // of TxPackets, those an XDPConn sent through its kernel socket (next hop's MAC not known yet)
	TxBytes   uint64 // payload bytes handed to the network

	RxRunt        uint64 // shorter than the headers they claim (Ethernet, IP, UDP)
	RxTruncated   uint64 // IP/UDP length beyond the frame, or payload beyond the caller's buffer
	RxBadChecksum uint64 // IPv4 header or UDP checksum wrong
	RxForeign     uint64 // not UDP to our address and port (wrong EtherType, protocol, address, port, fragments, IP options)

	TxRingFull uint64 // a TX attempt found no free frame or ring slot (retried, not lost)
	// Kernel-side drops (RX ring full, fill ring empty) are in
	// XDPConn.KernelStats.
}

// counters is the live, atomically updated form of Counters.
type counters struct {
	rxPackets, rxKernel, rxBytes, txPackets, txKernel, txBytes atomic.Uint64
	rxRunt, rxTruncated, rxBadCsum, rxForeign                  atomic.Uint64
	txRingFull                                                 atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		RxPackets:     c.rxPackets.Load(),
		RxKernel:      c.rxKernel.Load(),
		RxBytes:       c.rxBytes.Load(),
		TxPackets:     c.txPackets.Load(),
		TxKernel:      c.txKernel.Load(),
		TxBytes:       c.txBytes.Load(),
		RxRunt:        c.rxRunt.Load(),
		RxTruncated:   c.rxTruncated.Load(),
		RxBadChecksum: c.rxBadCsum.Load(),
		RxForeign:     c.rxForeign.Load(),
		TxRingFull:    c.txRingFull.Load(),
	}
}
