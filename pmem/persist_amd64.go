package pmem

// Implemented in persist_amd64.s.

func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
func flushCLWB(addr, end uintptr)
func flushCLFLUSHOPT(addr, end uintptr)
func flushCLFLUSH(addr, end uintptr)
func sfence()

// Flush instructions, chosen once by CPUID. CLWB writes a line back and
// keeps it cached; CLFLUSHOPT evicts it but, like CLWB, is weakly ordered
// (one SFENCE after the batch orders them all); CLFLUSH is the fallback
// every x86-64 has, serialized and slowest.
const (
	flushNone = iota
	flushCLFLUSHKind
	flushCLFLUSHOPTKind
	flushCLWBKind
)

var flushKind = detectFlush()

func detectFlush() int {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf >= 7 {
		_, ebx, _, _ := cpuid(7, 0)
		if ebx&(1<<24) != 0 {
			return flushCLWBKind
		}
		if ebx&(1<<23) != 0 {
			return flushCLFLUSHOPTKind
		}
	}
	_, _, _, edx := cpuid(1, 0)
	if edx&(1<<19) != 0 {
		return flushCLFLUSHKind
	}
	return flushNone
}

// FlushInstruction names the cache-line flush dax mode uses on this CPU.
func FlushInstruction() string {
	switch flushKind {
	case flushCLWBKind:
		return "clwb"
	case flushCLFLUSHOPTKind:
		return "clflushopt"
	case flushCLFLUSHKind:
		return "clflush"
	}
	return "none"
}

// flushLines writes back every cache line overlapping [addr, addr+n) and
// fences. It returns false if the CPU has no flush instruction.
func flushLines(addr, n uintptr) bool {
	if n == 0 {
		sfence()
		return true
	}
	start := addr &^ (lineBytes - 1)
	end := (addr + n + lineBytes - 1) &^ (lineBytes - 1)
	switch flushKind {
	case flushCLWBKind:
		flushCLWB(start, end)
	case flushCLFLUSHOPTKind:
		flushCLFLUSHOPT(start, end)
	case flushCLFLUSHKind:
		flushCLFLUSH(start, end)
	default:
		return false
	}
	sfence()
	return true
}

// storeFence orders earlier stores before later ones (SFENCE).
func storeFence() { sfence() }
