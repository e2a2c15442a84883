//! The GDT, with a TSS that gives double faults their own stack.
//!
//! GDT with kernel code/data segments and a TSS whose IST slot 0 is the
//! double-fault stack, so a kernel stack overflow is reported, not a reset.

use x86_64::VirtAddr;
use x86_64::instructions::segmentation::{CS, DS, ES, SS, Segment};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;

/// IST index of the double-fault stack.
pub const DOUBLE_FAULT_IST: u16 = 0;

const IST_STACK_SIZE: usize = 32 * 1024;

#[repr(align(16))]
struct Stack(
    #[expect(dead_code, reason = "only the stack's address is used")] [u8; IST_STACK_SIZE],
);

static mut DOUBLE_FAULT_STACK: Stack = Stack([0; IST_STACK_SIZE]);

static TSS: spin::Once<TaskStateSegment> = spin::Once::new();
static GDT: spin::Once<(GlobalDescriptorTable, [SegmentSelector; 3])> = spin::Once::new();

/// Loads the GDT, reloads the segment registers and the task register.
pub fn init() {
    let tss = TSS.call_once(|| {
        let mut tss = TaskStateSegment::new();
        let top =
            VirtAddr::from_ptr(core::ptr::addr_of!(DOUBLE_FAULT_STACK)) + IST_STACK_SIZE as u64;
        tss.interrupt_stack_table[usize::from(DOUBLE_FAULT_IST)] = top;
        tss
    });
    let (gdt, sel) = GDT.call_once(|| {
        let mut gdt = GlobalDescriptorTable::new();
        let code = gdt.append(Descriptor::kernel_code_segment());
        let data = gdt.append(Descriptor::kernel_data_segment());
        let tss = gdt.append(Descriptor::tss_segment(tss));
        (gdt, [code, data, tss])
    });
    gdt.load();
    // SAFETY: the selectors index the GDT just loaded, which lives in a static
    // for the rest of the program; the TSS descriptor is not yet busy.
    unsafe {
        CS::set_reg(sel[0]);
        SS::set_reg(sel[1]);
        DS::set_reg(sel[1]);
        ES::set_reg(sel[1]);
        load_tss(sel[2]);
    }
}
