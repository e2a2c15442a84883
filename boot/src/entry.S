/* Entry for both boot protocols, in AT&T syntax.
 *
 * PVH (QEMU -kernel): 32-bit protected mode, paging off, %ebx = hvm_start_info.
 * Multiboot2 (GRUB):  32-bit protected mode, paging off, %eax = 0x36d76289,
 *                     %ebx = multiboot information.
 * Both land in common32, which identity-maps the first 4 GiB with 2 MiB pages,
 * enters long mode and calls boot_entry64(protocol, info). */

    .section .multiboot2, "a"
    .balign 8
mb2_header:
    .long 0xe85250d6                    /* magic */
    .long 0                             /* architecture: i386 protected mode */
    .long mb2_header_end - mb2_header
    .long -(0xe85250d6 + (mb2_header_end - mb2_header))
    .balign 8
    .short 0                            /* end tag */
    .short 0
    .long 8
mb2_header_end:

    .section .note.Xen, "a"
    .balign 4
    .long 4                             /* name size */
    .long 4                             /* descriptor size */
    .long 18                            /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long pvh_entry

    .section .text.boot32, "ax"
    .code32
    .global mb2_entry
mb2_entry:
    cli
    cld
    movl $2, %edi                       /* protocol 2: Multiboot2 */
    cmpl $0x36d76289, %eax
    je 1f
    xorl %edi, %edi                     /* protocol 0: unknown loader */
1:  movl %ebx, %esi
    jmp common32

    .global pvh_entry
pvh_entry:
    cli
    cld
    movl $1, %edi                       /* protocol 1: PVH */
    movl %ebx, %esi

common32:
    movl $boot_stack_top, %esp

    /* Zero PML4, PDPT and the four page directories (6 pages). */
    movl $boot_pml4, %ebx
    movl %edi, %ebp
    movl %ebx, %edi
    xorl %eax, %eax
    movl $(6 * 4096 / 4), %ecx
    rep stosl
    movl %ebp, %edi

    /* PML4[0] -> PDPT; PDPT[0..4] -> PD0..PD3. */
    movl $boot_pdpt, %eax
    orl $0x3, %eax
    movl %eax, boot_pml4
    movl $boot_pd, %eax
    orl $0x3, %eax
    movl %eax, boot_pdpt
    addl $4096, %eax
    movl %eax, boot_pdpt + 8
    addl $4096, %eax
    movl %eax, boot_pdpt + 16
    addl $4096, %eax
    movl %eax, boot_pdpt + 24

    /* 2048 PD entries: 2 MiB pages, present | writable | huge. */
    movl $boot_pd, %ebx
    xorl %ecx, %ecx
2:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax
    movl %eax, (%ebx, %ecx, 8)
    movl %ecx, %eax
    shrl $11, %eax                      /* bits 32+ of i * 2 MiB */
    movl %eax, 4(%ebx, %ecx, 8)
    incl %ecx
    cmpl $2048, %ecx
    jne 2b

    movl %cr4, %eax
    orl $(1 << 5), %eax                 /* PAE */
    movl %eax, %cr4
    movl $boot_pml4, %eax
    movl %eax, %cr3
    movl $0xc0000080, %ecx              /* EFER */
    rdmsr
    orl $(1 << 8), %eax                 /* LME */
    wrmsr
    movl %cr0, %eax
    orl $((1 << 31) | (1 << 16) | 1), %eax  /* PG | WP | PE */
    movl %eax, %cr0

    lgdt boot_gdt_ptr
    ljmp $0x08, $long_mode

    .code64
long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movq $boot_stack_top, %rsp
    xorl %ebp, %ebp                     /* ends the frame-pointer chain */
    movl %edi, %edi                     /* zero-extend protocol and info */
    movl %esi, %esi
    call boot_entry64
3:  cli
    hlt
    jmp 3b

    .section .rodata
    .balign 8
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff            /* 0x10: data */
boot_gdt_end:
boot_gdt_ptr:
    .short boot_gdt_end - boot_gdt - 1
    .long boot_gdt

    .section .bss
    .balign 4096
boot_pml4:
    .skip 4096
boot_pdpt:
    .skip 4096
boot_pd:
    .skip 4 * 4096
    .balign 16
    .global boot_stack_bottom
boot_stack_bottom:
    .skip 128 * 1024
    .global boot_stack_top
boot_stack_top:
