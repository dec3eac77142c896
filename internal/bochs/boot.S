/*
 * The boot image the bochs package runs a program with (GNU as; assembled by
 * gen.sh into boot.bin, which is committed). The BIOS loads sector 0 at
 * 0x7c00; it loads the rest of the disk after it (so disk offset o is at
 * 0x7c00+o), maps the first GiB one to one with 2 MiB pages, enters long
 * mode, enables SSE, AVX, AVX-512 and the AMX tile state (XCR0 = 0x600e7),
 * installs handlers that report any exception, and runs the program whose
 * header is at disk offset 8 KiB (address 0x9c00):
 *
 *   u64 magic "TANDEMBX"; u64 ncalls; u64 calls; u64 ndumps; u64 dumps
 *   call: u64 fn, u64 args, u64 argslen (bytes, a multiple of 8)
 *   dump: u64 addr, u64 len
 *
 * Each call copies its args to the stack and calls fn as Go's ABI0 does
 * (arguments from 8(SP) on entry). Then each dump is written to port 0xe9
 * as "D" and the bytes in hex, one line each, then "E", and Bochs is told to
 * shut down (port 0x8900). An exception writes "X" and the vector, the
 * error code or first frame word and the next (in hex), and shuts down.
 * The sector count to load is the word at offset 508.
 */
	.set PAYLOAD, 0x9c00
	.set STACKTOP, 0x90000

	.code16
	.text
	.globl _start
_start:
	cli
	xor %ax, %ax
	mov %ax, %ds
	mov %ax, %es
	mov %ax, %ss
	mov $0x7c00, %sp
	mov %dl, drive
	/* Load sectors 1..nsect-1 to 0x7e00.., 32 at a time. */
	movw $1, lba
	movw $0x07e0, dap_seg
load:
	mov nsect, %ax
	sub lba, %ax
	jbe loaded
	cmp $32, %ax
	jbe 1f
	mov $32, %ax
1:	mov %ax, dap_count
	mov lba, %bx
	mov %bx, dap_lba
	mov $dap, %si
	mov drive, %dl
	mov $0x42, %ah
	int $0x13
	jc fail16
	mov dap_count, %ax
	add %ax, lba
	shl $5, %ax
	add %ax, dap_seg
	jmp load
loaded:
	/* A20 on (port 0x92). */
	in $0x92, %al
	or $2, %al
	and $0xfe, %al
	out %al, $0x92
	/* Page tables: PML4 at 0x1000, PDPT at 0x2000, PD at 0x3000. */
	mov $0x1000, %di
	xor %eax, %eax
	mov $3072, %cx
	cld
	rep stosl
	movl $0x2003, 0x1000
	movl $0x3003, 0x2000
	mov $0x3000, %di
	mov $0x83, %eax
	mov $512, %cx
2:	mov %eax, (%di)
	movl $0, 4(%di)
	add $0x200000, %eax
	add $8, %di
	loop 2b
	lgdtl gdtr
	mov %cr4, %eax
	or $0x20, %eax /* PAE */
	mov %eax, %cr4
	mov $0x1000, %eax
	mov %eax, %cr3
	mov $0xc0000080, %ecx
	rdmsr
	or $0x100, %eax /* LME */
	wrmsr
	mov %cr0, %eax
	or $0x80000001, %eax /* PG, PE */
	mov %eax, %cr0
	ljmpl $0x08, $long64
fail16:
	mov $'F', %al
	out %al, $0xe9
	hlt
	jmp fail16

	.p2align 3, 0
gdt:
	.quad 0
	.quad 0x00af9a000000ffff /* 0x08: 64-bit code */
	.quad 0x00cf92000000ffff /* 0x10: data */
gdtr:
	.word gdtr - gdt - 1
	.long gdt
dap:
	.byte 16, 0
dap_count:
	.word 0
	.word 0
dap_seg:
	.word 0
dap_lba:
	.quad 0
lba:
	.word 0
drive:
	.byte 0

	.org 508
nsect:
	.word 16
	.byte 0x55, 0xaa

	.code64
long64:
	mov $0x10, %ax
	mov %ax, %ds
	mov %ax, %es
	mov %ax, %ss
	mov %ax, %fs
	mov %ax, %gs
	mov $STACKTOP, %rsp
	/* SSE: CR0.EM off, CR0.MP on; CR4.OSFXSR, OSXMMEXCPT, OSXSAVE. */
	mov %cr0, %rax
	and $~4, %rax
	or $2, %rax
	mov %rax, %cr0
	mov %cr4, %rax
	or $(1 << 9) | (1 << 10) | (1 << 18), %rax
	mov %rax, %cr4
	xor %ecx, %ecx
	xor %edx, %edx
	mov $0x600e7, %eax
	xsetbv
	/* IDT: 32 gates to the stubs at vectors (8 bytes each). */
	lea idt(%rip), %rdi
	lea vectors(%rip), %rsi
	xor %ecx, %ecx
3:	mov %rsi, %rax
	mov %ax, (%rdi)         /* offset 15:0 */
	movw $0x08, 2(%rdi)     /* selector */
	movw $0x8e00, 4(%rdi)   /* present, interrupt gate */
	shr $16, %rax
	mov %ax, 6(%rdi)        /* offset 31:16 */
	shr $16, %rax
	mov %eax, 8(%rdi)       /* offset 63:32 */
	movl $0, 12(%rdi)
	add $16, %rdi
	add $8, %rsi
	inc %ecx
	cmp $32, %ecx
	jne 3b
	lidt idtr(%rip)
	cld
	/* The program. */
	mov $PAYLOAD, %rbx
	movabs $0x58424d45444e4154, %rax /* "TANDEMBX" */
	cmp %rax, (%rbx)
	jne badmagic
	mov 8(%rbx), %rax
	mov %rax, ncalls(%rip)
	mov 16(%rbx), %rax
	mov %rax, nextcall(%rip)
	/* A called function may change every register but the stack
	 * pointer (ABI0): the loop's state lives in memory. */
calls:
	cmpq $0, ncalls(%rip)
	je dumps
	mov nextcall(%rip), %r13
	mov 16(%r13), %rcx  /* argslen */
	mov $STACKTOP, %rsp
	sub %rcx, %rsp
	and $~15, %rsp
	mov %rsp, %rdi
	mov 8(%r13), %rsi
	shr $3, %rcx
	cld
	rep movsq
	call *(%r13)
	addq $24, nextcall(%rip)
	decq ncalls(%rip)
	jmp calls
dumps:
	mov $STACKTOP, %rsp
	mov $PAYLOAD, %rbx
	mov 24(%rbx), %r12  /* ndumps */
	mov 32(%rbx), %r13  /* dumps */
4:	test %r12, %r12
	jz done
	mov $'D', %al
	out %al, $0xe9
	mov (%r13), %rsi
	mov 8(%r13), %rcx
5:	test %rcx, %rcx
	jz 6f
	mov (%rsi), %al
	call hexbyte
	inc %rsi
	dec %rcx
	jmp 5b
6:	mov $'\n', %al
	out %al, $0xe9
	add $16, %r13
	dec %r12
	jmp 4b
done:
	mov $'E', %al
	out %al, $0xe9
	mov $'\n', %al
	out %al, $0xe9
shutdown:
	mov $0x8900, %dx
	lea shutdownstr(%rip), %rsi
7:	mov (%rsi), %al
	test %al, %al
	jz 8f
	out %al, %dx
	inc %rsi
	jmp 7b
8:	hlt
	jmp 8b
badmagic:
	mov $'M', %al
	out %al, $0xe9
	mov $'\n', %al
	out %al, $0xe9
	jmp shutdown

/* hexbyte writes %al as two hex digits to port 0xe9 (clobbers %rax, %rdx). */
hexbyte:
	mov %eax, %edx
	shr $4, %al
	and $15, %eax
	mov hexdigits(%rax), %al
	out %al, $0xe9
	mov %edx, %eax
	and $15, %eax
	mov hexdigits(%rax), %al
	out %al, $0xe9
	ret

/* hexquad writes %r8 as 16 hex digits, most significant first. */
hexquad:
	mov $8, %r9d
9:	rol $8, %r8
	mov %r8d, %eax
	call hexbyte
	dec %r9d
	jnz 9b
	ret

exception:
	/* The stub pushed the vector; above it the CPU's frame. */
	mov $'X', %al
	out %al, $0xe9
	pop %r8
	call hexquad
	mov $' ', %al
	out %al, $0xe9
	pop %r8
	call hexquad
	mov $' ', %al
	out %al, $0xe9
	pop %r8
	call hexquad
	mov $'\n', %al
	out %al, $0xe9
	jmp shutdown

	.p2align 3, 0x90
vectors:
	.irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	.p2align 3, 0x90
	push $\v
	jmp exception
	.endr

hexdigits:
	.ascii "0123456789abcdef"
shutdownstr:
	.asciz "Shutdown"
	.p2align 3, 0
ncalls:
	.quad 0
nextcall:
	.quad 0
idtr:
	.word 32 * 16 - 1
	.quad idt
	.p2align 4, 0
idt:
	.fill 32 * 16, 1, 0
	.org 8192
