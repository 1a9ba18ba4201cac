package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Offsets into struct xdp_md (the XDP program's context).
const (
	xdpMdData         = 0
	xdpMdDataEnd      = 4
	xdpMdRxQueueIndex = 16
	xdpActionPass     = 2
	// xskMapEntriesMax bounds the XSKMAP (one entry per RX queue).
	xskMapEntriesMax = queueIDMax + 1
)

// be16 returns the value a little- or big-endian 16-bit load of the
// network-order bytes of v yields on this host, so the program compares
// raw packet halfwords without byte swaps.
func be16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

// redirectProgram returns the XDP program: frames that are UDP to port
// (IPv4 without options or fragmentation, or IPv6 with UDP as the first
// next header) go to xskmap[rx_queue_index]; everything else, and those
// when the queue has no socket, passes to the kernel stack (ARP, ICMP,
// other ports keep working).
func redirectProgram(xskmap *ebpf.Map, port uint16) asm.Instructions {
	const (
		ipOff   = ethHeaderBytes
		v4UDP   = ethHeaderBytes + ipv4HeaderBytes
		v6UDP   = ethHeaderBytes + ipv6HeaderBytes
		udpDst  = 2
		ipv4Off = ipOff + 6 // flags + fragment offset
	)
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, xdpMdData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, xdpMdDataEnd, asm.Word),
		// Ethernet header in bounds?
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ethHeaderBytes),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JEq.Imm(asm.R5, be16(etherTypeIPv4), "ipv4"),
		asm.JEq.Imm(asm.R5, be16(etherTypeIPv6), "ipv6"),
		asm.Ja.Label("pass"),

		// IPv4: IHL 5, not a fragment, UDP, our port.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv4"),
		asm.Add.Imm(asm.R4, v4UDP+udpHeaderBytes),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipOff, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipOff+9, asm.Byte),
		asm.JNE.Imm(asm.R5, protoUDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipv4Off, asm.Half),
		asm.And.Imm(asm.R5, be16(0x3fff)),
		asm.JNE.Imm(asm.R5, 0, "pass"),
		asm.LoadMem(asm.R5, asm.R2, v4UDP+udpDst, asm.Half),
		asm.JEq.Imm(asm.R5, be16(port), "redirect"),
		asm.Ja.Label("pass"),

		// IPv6: next header UDP, our port.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv6"),
		asm.Add.Imm(asm.R4, v6UDP+udpHeaderBytes),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipOff+6, asm.Byte),
		asm.JNE.Imm(asm.R5, protoUDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, v6UDP+udpDst, asm.Half),
		asm.JNE.Imm(asm.R5, be16(port), "pass"),

		// bpf_redirect_map(xskmap, rx_queue_index, XDP_PASS)
		asm.LoadMem(asm.R2, asm.R6, xdpMdRxQueueIndex, asm.Word).WithSymbol("redirect"),
		asm.LoadMapPtr(asm.R1, xskmap.FD()),
		asm.Mov.Imm(asm.R3, xdpActionPass),
		asm.FnRedirectMap.Call(),
		asm.Return(),

		asm.Mov.Imm(asm.R0, xdpActionPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// loadRedirect creates the XSKMAP and loads the program.
func loadRedirect(port uint16) (*ebpf.Map, *ebpf.Program, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "synod_xsks",
		Type:       ebpf.XSKMap,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: xskMapEntriesMax,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating xskmap: %w", explainBPF(err))
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "synod_xdp",
		Type:         ebpf.XDP,
		License:      "Dual MIT/GPL",
		Instructions: redirectProgram(m, port),
	})
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("loading xdp program: %w", explainBPF(err))
	}
	return m, prog, nil
}

// explainBPF adds what to change to permission errors from bpf(2).
func explainBPF(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("%w: %w (kernel lacks BPF/XDP support)", ErrNotSupported, err)
	}
	if isPermission(err) {
		return fmt.Errorf("%w (needs CAP_BPF and CAP_NET_ADMIN, or root)", err)
	}
	return err
}
