#include "textflag.h"

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func flushCLWB(addr, end uintptr)
// addr is 64-byte aligned and addr < end.
TEXT ·flushCLWB(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ end+8(FP), CX
clwbloop:
	CLWB (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   clwbloop
	RET

// func flushCLFLUSHOPT(addr, end uintptr)
TEXT ·flushCLFLUSHOPT(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ end+8(FP), CX
optloop:
	CLFLUSHOPT (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   optloop
	RET

// func flushCLFLUSH(addr, end uintptr)
TEXT ·flushCLFLUSH(SB), NOSPLIT, $0-16
	MOVQ addr+0(FP), AX
	MOVQ end+8(FP), CX
flushloop:
	CLFLUSH (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   flushloop
	RET

// func sfence()
TEXT ·sfence(SB), NOSPLIT, $0-0
	SFENCE
	RET
